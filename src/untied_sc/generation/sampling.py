"""Sampling for evaluation: seeding, schedulers by sampler spec, and the resampling unit of the samples.

Shared by `untied-sc benchmark` and `untied-sc tune`: batch b of seed s is drawn from
`torch.Generator().manual_seed(batch_seed(s, b))` for every sampler and NFE, so sample i of two samplers shares its
initial latent and random stream (a matched pair). The benchmark draws in the benchmark seed space and the tuning
bank in the tuning space (`untied_sc.seeds`): no tuning seed can draw a benchmark batch.

The resampling unit ([`resampling_unit`]) is the unit of randomness that samples share, which the bootstrap must
resample whole: ELF draws one random time grid per pipeline call, so the samples of one batch are correlated through
their grid and the unit is the batch; LangFlow's grid is fixed, so its unit is the sample.
"""

import inspect
import time
import warnings
from collections.abc import Mapping

import torch

from ..distributed import (
    gather_in_order,
    main_process_progress,
    process_rank,
    shard_batches,
    slowest_process_seconds,
)
from ..families import family_names, get_family, untied_families
from ..schedulers import UntiedSelfConditioningScheduler, stored_tuning
from ..schedulers.comparison_names import COMPARISON_METHODS, comparison_scheduler_class
from ..seeds import generator_seed
from ..untied_variants import untied_variant_class
from .sampler_spec import SamplerSpec
from .samples import Sample


def resampling_unit(family: str) -> str:
    """`"batch"` (ELF) or `"sample"` (LangFlow): the unit the bootstrap resamples (see the module docstring)."""
    return get_family(family).require("resampling_unit", "Resampling samples for a bootstrap interval")


def resampling_clusters(family: str, num_samples: int, batch_size: int) -> list[int]:
    """The cluster label of samples 0..num_samples-1 of one seed: the batch index (ELF) or the sample index."""
    if resampling_unit(family) == "batch":
        return [i // batch_size for i in range(num_samples)]
    return list(range(num_samples))


# The fewest independent clusters (ELF time grids) a cell of the benchmark should pool: with fewer, intervals rest on
# a handful of grids ([`warn_few_clusters`]; the report's headline then uses the t-interval, `statistics.py`).
MIN_INDEPENDENT_CLUSTERS = 48


def independent_clusters(family: str, num_seeds: int, num_samples: int, batch_size: int) -> int:
    """The independent clusters a (sampler, NFE) cell pools: every seed's batches (ELF: one time grid each) or its
    samples (LangFlow)."""
    return num_seeds * len(set(resampling_clusters(family, num_samples, batch_size)))


def warn_few_clusters(family: str, num_seeds: int, num_samples: int, batch_size: int) -> None:
    """Warns when a cell pools fewer than [`MIN_INDEPENDENT_CLUSTERS`] independent clusters, naming the batch size
    (part of the seeding: an explicit choice) or the sample count that reaches it."""
    count = independent_clusters(family, num_seeds, num_samples, batch_size)
    if count >= MIN_INDEPENDENT_CLUSTERS:
        return
    per_seed = -(-MIN_INDEPENDENT_CLUSTERS // num_seeds)  # grids each seed needs
    smaller = num_samples // per_seed
    remedy = (
        f"pass --batch-size {smaller} ({num_seeds} seeds × {-(-num_samples // smaller)} grids; the batch size is part "
        "of the seeding, so the samples change)"
        if smaller >= 1
        else f"use more seeds or at least {per_seed} samples per seed"
    )
    what = "independent time grids" if resampling_unit(family) == "batch" else "independent samples"
    warnings.warn(
        f"Each (sampler, NFE) cell pools {count} {what} ({num_seeds} seed{'s' * (num_seeds != 1)} × {num_samples} "
        f"samples, batch size {batch_size}), fewer than {MIN_INDEPENDENT_CLUSTERS}: its intervals rest on few "
        f"clusters (the report's headline uses the t-interval). For {MIN_INDEPENDENT_CLUSTERS}, {remedy}.",
        stacklevel=2,
    )


def tokenizer_description(tokenizer) -> str:
    """A tokenizer named for reports: its kind and vocabulary size, e.g. "BPE, 8,192 ids"."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    kind = type(backend.model).__name__ if backend is not None else type(tokenizer).__name__
    return f"{kind}, {len(tokenizer):,} ids"


def batch_seed(seed: int, batch_index: int, space: str = "benchmark") -> int:
    """Generator seed of batch `batch_index` of seed `seed` in a seed space (`untied_sc.seeds`; the benchmark's by
    default: `1_000_003·seed + batch_index`, the same for every sampler and NFE, so pairs match)."""
    return generator_seed(space, seed, batch_index)


def tuning_seeds(pipe) -> set[int]:
    """
    The benchmark seeds whose batches tuned `pipe`'s coefficients (evaluating on them would leak): records of the
    scheduler config's `tuning_by_steps` whose banks lie in the benchmark space (a record without `seed_space`, as
    the bundled folders' 32- and 64-NFE ones). Banks in the `tuning` space are reached by no benchmark seed.
    """
    records = stored_tuning(pipe.scheduler.config).values()
    return {record.seed for record in records if record.seed_space == "benchmark"}


def family_of(pipe) -> str:
    """`"elf"` or `"langflow"`: which solver family a pipeline samples with (its `family`); a family that Algorithm 1
    does not serve (the flow maps) is refused."""
    family = getattr(pipe, "family", None)
    if family not in untied_families():
        pipelines = " or ".join(get_family(name).pipeline.name for name in untied_families())
        other = f"; {type(pipe).__name__} is sampled by its own call, `pipe(...)`" if family in family_names() else ""
        raise ValueError(
            f"Expected an {pipelines} (the untied sampler of Algorithm 1), got {type(pipe).__name__}{other}."
        )
    return family


def diversity_knob(family: str) -> str:
    """
    The pipeline-call argument that moves a family's entropy: `"temperature"` (LangFlow: of x̂'s softmax),
    `"decode_temperature"` (ELF: of the final decode's softmax; the SC-CFG scale w, tried first, barely moved the
    bundled ELF, which hardly uses self-conditioning).
    """
    return get_family(family).require("diversity_knob", "Sweeping a diversity knob")


def build_scheduler(
    pipe, spec: SamplerSpec | Mapping, config: Mapping | None = None, num_inference_steps: int | None = None
):
    """The scheduler of one sampler spec, built from `config` (default: the pipeline's scheduler config).

    `spec` is a [`SamplerSpec`] or its JSON object (read with [`SamplerSpec.from_json`]). Its `scheduler` is
    `"official"` (the family's official scheduler), `"untied"` ([`UntiedSelfConditioningScheduler`] with the spec's
    config overrides, e.g. `eta_r`; the registered variant's scheduler when they name its switch,
    [`untied_variant_class`]: the lab's `AblationUntiedELFScheduler` / `AblationUntiedLangFlowScheduler` for an
    ablation switch) or a comparison method (`"momentum"`, `"higs"`, `"ace"`, `"higs_ace"`, `"multistep"`: the
    family's class from [`comparison_scheduler_class`], built with `from_config` from the official keys of `config`,
    with the spec's overrides, e.g. `momentum_beta`).
    A scale (the key `<coefficient>_scale`, e.g. `eta_t_scale: 0.5`) multiplies the coefficient that would otherwise
    be used at `num_inference_steps` (the sensitivity sweep); α is clipped to (0, 1]. A `knobs_by_steps` table
    (`{"8": {"momentum_beta": 0.8}, ...}`, the benchmark's tuned knobs) adds the overrides of `num_inference_steps`.

    Examples:

    ```py
    >>> build_scheduler(pipe, {"scheduler": "untied", "eta_r": 0.5}, num_inference_steps=8)
    >>> build_scheduler(pipe, SamplerSpec(scheduler="untied", overrides={"eta_r": 0.5}), num_inference_steps=8)
    ```
    """
    spec = SamplerSpec.of(spec)
    overrides, scales = spec.settings_at(num_inference_steps)
    config = dict(pipe.scheduler.config if config is None else config)
    method = spec.scheduler
    if method is None:
        raise ValueError(
            f"The sampler spec {spec.to_json()} names no 'scheduler': give one of 'official', 'untied' or "
            f"{COMPARISON_METHODS}."
        )
    if method == "official" or method in COMPARISON_METHODS:
        if scales:
            raise ValueError(f"Coefficient scales {sorted(scales)} only apply to the untied sampler.")
        if method == "official":
            cls = get_family(family_of(pipe)).official_scheduler.load()
        else:
            cls = comparison_scheduler_class(method, family_of(pipe))
        accepted = inspect.signature(cls.__init__).parameters  # an untied config carries keys the official lacks
        unknown = sorted(set(overrides) - set(accepted))
        if unknown:
            raise ValueError(f"{cls.__name__} has no config keys {unknown} (sampler spec {spec.to_json()}).")
        return cls.from_config({k: v for k, v in config.items() if k in accepted or k.startswith("_")}, **overrides)
    if method != "untied":
        raise ValueError(
            f"A sampler's 'scheduler' must be 'official', 'untied' or one of {COMPARISON_METHODS}, got {method!r}."
        )
    # An ablation switch (`correction_routing`, …) needs the lab's scheduler; it samples the same otherwise.
    untied = untied_variant_class(family_of(pipe), overrides) or UntiedSelfConditioningScheduler
    scheduler = untied.from_config(config, **overrides)
    if not scales:
        return scheduler
    if num_inference_steps is None:
        raise ValueError("Coefficient scales need the number of inference steps to resolve the base coefficients.")
    base = scheduler.resolve_coefficients(num_inference_steps)
    scaled = {name: base[name] * factor for name, factor in scales.items()}
    if "alpha" in scaled:
        scaled["alpha"] = min(scaled["alpha"], 1.0)
    return untied.from_config(config, **{**overrides, **scaled})


def generator_ids(sequences: torch.LongTensor, family: str, pad_token_id: int | None) -> list[list[int]]:
    """The generator's ids of each sample: LangFlow every position; ELF up to the EOS cut (trailing pads removed)."""
    rows = sequences.cpu().tolist()
    if family != "elf" or pad_token_id is None:
        return rows
    trimmed = []
    for row in rows:
        end = len(row)
        while end > 0 and row[end - 1] == pad_token_id:
            end -= 1
        trimmed.append(row[:end])
    return trimmed


def run_samples(
    texts: list[str],
    ids: list[list[int]],
    seed: int,
    batch_size: int,
    sampler: str,
    nfe: int,
    record_batch_seed: bool = False,
    **extra,
) -> list:
    """The [`Sample`]s of one [`generate`] run: sample i lies in batch i // batch_size; `extra` holds its `index`,
    with `record_batch_seed` its batch's [`batch_seed`], then the given `extra` keys (e.g. a diversity knob's value)."""
    return [
        Sample(
            text=text,
            ids=row,
            seed=seed,
            batch=i // batch_size,
            sampler=sampler,
            nfe=nfe,
            extra={
                "index": i,
                **({"batch_seed": batch_seed(seed, i // batch_size)} if record_batch_seed else {}),
                **extra,
            },
        )
        for i, (text, row) in enumerate(zip(texts, ids, strict=True))
    ]


def generate(
    pipe,
    num_inference_steps: int,
    seed: int,
    num_samples: int,
    batch_size: int,
    state=None,
    progress: bool = False,
    seed_space: str = "benchmark",
    **call_kwargs,
):
    """Generates `num_samples` samples in batches seeded by [`batch_seed`] in `seed_space` (`untied-sc tune` draws
    its bank in the `tuning` space); returns (texts, generator ids, seconds).

    With a `state` ([`untied_sc.distributed.process_state`]) of several processes, this process samples only its
    shard of the batches ([`shard_batches`]) and every process returns all the samples, in batch order: the same
    samples as one process, since batch b is drawn from `batch_seed(seed, b)` whatever process draws it. `seconds` is
    the sampling time of the slowest process (the sum of its batches' times; with one process, of all batches).
    `progress` shows a bar over this process's batches on the main process.
    """
    family = family_of(pipe)
    pad = pipe.tokenizer.pad_token_id if pipe.tokenizer.pad_token_id is not None else pipe.tokenizer.eos_token_id
    num_batches = -(-num_samples // batch_size)
    mine = {}
    for batch_index in main_process_progress(shard_batches(num_batches, state), state, progress, desc="batches"):
        start = batch_index * batch_size
        size = min(batch_size, num_samples - start)
        generator = torch.Generator().manual_seed(batch_seed(seed, batch_index, seed_space))
        began = time.perf_counter()
        output = pipe(batch_size=size, num_inference_steps=num_inference_steps, generator=generator, **call_kwargs)
        if output.sequences is not None and output.sequences.is_cuda:
            torch.cuda.synchronize(output.sequences.device)
        seconds = time.perf_counter() - began
        mine[batch_index] = (output.texts, generator_ids(output.sequences, family, pad), seconds)
    batches = gather_in_order(mine, state)
    texts = [text for batch_texts, _, _ in batches for text in batch_texts]
    ids = [row for _, batch_ids, _ in batches for row in batch_ids]
    seconds = slowest_process_seconds([batch_seconds for _, _, batch_seconds in batches], process_rank(state)[1])
    return texts, ids, seconds
