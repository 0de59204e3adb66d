"""Scoring samples files: the data behind `untied-sc evaluate` (the files themselves: `untied_sc.generation`)."""

import math
import os
from collections.abc import Sequence

import torch

from untied_sc.generation import PROVENANCE_KEYS, RUN_KEYS, Sample, read_samples, word_repetition

from .evaluator import load_evaluator
from .metrics import (
    distinct_n,
    generative_perplexity,
    longest_repeated_run,
    mean_unigram_entropy,
    token_distinct_n,
    token_repetition,
    unigram_entropy,
)
from .statistics import paired_comparison


def _finite_or_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def evaluate_samples(
    samples: str | os.PathLike | Sequence[Sample],
    evaluator="smollm2-135m",
    protocol: str = "elf",
    batch_size: int | None = None,
    max_length: int | None = None,
    context_size: int | None = None,
    repetition_n: int = 4,
    distinct: Sequence[int] = (1, 2, 3, 4),
    **evaluator_kwargs,
) -> dict:
    """Scores a samples file (or a list of [`Sample`]) and returns a JSON-ready result dict.

    Args:
        samples: a JSONL path (see the module docstring) or a list of [`Sample`].
        evaluator: an evaluator name for [`load_evaluator`] (default `"smollm2-135m"`), or a `(model, tokenizer)` pair.
        protocol (`str`, defaults to `"elf"`): `"elf"` or `"langflow"` (see [`sample_nlls`]).
        batch_size, max_length, context_size: passed to [`sample_nlls`] (`batch_size=None`: by length, see there).
        repetition_n (`int`, defaults to 4): n of the word and token Rep-n.
        distinct (`Sequence[int]`, defaults to `(1, 2, 3, 4)`): the n of each distinct-n (words and token ids).
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        `dict` with `protocol`, `evaluator`, counts, `gen_ppl`, `nll_per_token`, `num_tokens`, `entropy` (the
        protocol's own: evaluator ids for `"elf"`, generator ids for `"langflow"`, `None` when the file has no ids),
        both entropies, `rep_<n>`, `distinct_<n>` (word metrics over the samples the protocol scores), the subword
        twins on generator ids `token_rep_<n>`, `token_distinct_<n>` and `longest_repeat` (mean over samples of
        [`longest_repeated_run`]; `None` without ids), and `per_sample` (one dict per sample, in file order, with its
        provenance and scores, for paired comparisons).
    """
    if isinstance(samples, (str, os.PathLike)):
        samples = read_samples(samples)
    if isinstance(evaluator, (str, os.PathLike)):
        evaluator_name = str(evaluator)
        model, tokenizer = load_evaluator(evaluator, **evaluator_kwargs)
    else:
        model, tokenizer = evaluator
        evaluator_name = getattr(model, "name_or_path", None) or type(model).__name__
    result = generative_perplexity(
        [sample.text for sample in samples],
        model,
        tokenizer,
        protocol=protocol,
        batch_size=batch_size,
        max_length=max_length,
        context_size=context_size,
    )
    return _summary(samples, result, protocol, evaluator_name, repetition_n, distinct)


def _summary(
    samples: Sequence[Sample], result, protocol: str, evaluator_name: str, repetition_n: int, distinct
) -> dict:
    """[`evaluate_samples`]'s result from the evaluator's scores of `samples` (`result`, [`generative_perplexity`]'s):
    everything but the network call, so that runs with the same texts share one."""
    texts = [sample.text for sample in samples]
    scores = result.per_sample
    scored = scores.scored.tolist()
    scored_texts = [text for text, keep in zip(texts, scored, strict=True) if keep]
    evaluator_entropy = mean_unigram_entropy(
        [ids for ids, keep in zip(scores.evaluator_ids, scored, strict=True) if keep]
    )[0]
    has_ids = all(sample.ids is not None for sample in samples)
    generator_entropy = mean_unigram_entropy([sample.ids for sample in samples])[0] if has_ids else float("nan")
    mean_nll = scores.mean_nll.tolist()
    per_sample = []
    for i, sample in enumerate(samples):
        record = _provenance(sample)
        evaluator_h = _finite_or_none(unigram_entropy(scores.evaluator_ids[i])) if scored[i] else None
        generator_h = _finite_or_none(unigram_entropy(sample.ids)) if sample.ids is not None else None
        record.update(
            index=i,
            scored=scored[i],
            nll_sum=float(scores.nll_sum[i]),
            num_tokens=int(scores.num_tokens[i]),
            mean_nll=_finite_or_none(mean_nll[i]),
            entropy=evaluator_h if protocol == "elf" else generator_h,  # the protocol's, as the run's mean
            entropy_evaluator_ids=evaluator_h,
            entropy_generator_ids=generator_h,
            **{f"rep_{repetition_n}": word_repetition(sample.text, repetition_n)},
        )
        if sample.ids is not None:
            record[f"token_rep_{repetition_n}"] = token_repetition(sample.ids, repetition_n)
            record["longest_repeat"] = longest_repeated_run(sample.ids)
        per_sample.append(record)
    official_entropy = evaluator_entropy if protocol == "elf" else generator_entropy
    ids = [sample.ids for sample in samples] if has_ids else None
    return {
        "protocol": protocol,
        "evaluator": evaluator_name,
        "num_samples": len(samples),
        "num_scored": sum(scored),
        "num_dropped": len(samples) - sum(scored),
        **_run_provenance(samples),
        "gen_ppl": result.gen_ppl,
        "nll_per_token": result.nll_per_token,
        "num_tokens": result.num_tokens,
        "entropy": _finite_or_none(official_entropy),
        "entropy_evaluator_ids": _finite_or_none(evaluator_entropy),
        "entropy_generator_ids": _finite_or_none(generator_entropy),
        f"rep_{repetition_n}": sum(word_repetition(t, repetition_n) for t in scored_texts) / max(len(scored_texts), 1),
        **{f"distinct_{n}": distinct_n(scored_texts, n) for n in distinct},
        f"token_rep_{repetition_n}": None
        if ids is None
        else sum(token_repetition(row, repetition_n) for row in ids) / max(len(ids), 1),
        **{f"token_distinct_{n}": None if ids is None else token_distinct_n(ids, n) for n in distinct},
        "longest_repeat": None if ids is None else sum(map(longest_repeated_run, ids)) / max(len(ids), 1),
        "per_sample": per_sample,
    }


def _run_provenance(samples: Sequence[Sample]) -> dict:
    """The samplers and NFE a run's samples come from, as its result names them."""
    return {
        "samplers": sorted({s.sampler for s in samples if s.sampler is not None}),
        "nfe": sorted({s.nfe for s in samples if s.nfe is not None}),
    }


def _provenance(sample: Sample) -> dict:
    """Where a sample comes from, as its per-sample record begins: its seed, batch, sampler and NFE that are set."""
    return {key: getattr(sample, key) for key in PROVENANCE_KEYS if getattr(sample, key) is not None}


def with_provenance(result: dict, samples: Sequence[Sample]) -> dict:
    """[`evaluate_samples`]'s `result` of other runs' samples with the same texts and ids, as `samples`' own: the
    samplers, NFE and each sample's provenance are `samples`', every score and statistic is the result's."""
    if len(result["per_sample"]) != len(samples):
        raise ValueError(f"A result of {len(result['per_sample'])} samples cannot be that of {len(samples)}.")
    per_sample = [
        {**_provenance(sample), **{k: v for k, v in record.items() if k not in PROVENANCE_KEYS}}
        for sample, record in zip(samples, result["per_sample"], strict=True)
    ]
    return {**result, **_run_provenance(samples), "per_sample": per_sample}


def samples_key(samples: Sequence[Sample]) -> tuple:
    """What makes two runs the same for the evaluator: their texts and token ids, in order."""
    return tuple((sample.text, tuple(sample.ids or ())) for sample in samples)


def run_key(sample: Sample) -> dict:
    """The run a sample belongs to: its values of [`RUN_KEYS`] (sampler, NFE, seed, diversity knob) that are set."""
    record = sample.to_dict()
    return {key: record[key] for key in RUN_KEYS if record.get(key) is not None}


def group_runs(samples: Sequence[Sample]) -> list[tuple[dict, list[Sample]]]:
    """The samples grouped by [`run_key`], in order of first appearance: `(key, samples of that run)` pairs."""
    groups: dict[tuple, tuple[dict, list[Sample]]] = {}
    for sample in samples:
        key = run_key(sample)
        groups.setdefault(tuple(sorted(key.items())), (key, []))[1].append(sample)
    return list(groups.values())


def evaluate_runs(
    samples: str | os.PathLike | Sequence[Sample],
    evaluator="smollm2-135m",
    state=None,
    progress: bool = False,
    parts=None,
    **options,
) -> list[dict]:
    """Scores every run of a samples file apart (a benchmark report's `<report>.samples.jsonl.gz` holds many).

    Samples are grouped by [`run_key`] in file order; each group is scored with [`evaluate_samples`] (`options` are its
    keyword arguments; `cache_dir`, `device`, `dtype` load a named evaluator once), so each result equals the report's
    record of that run. A run whose samples (texts and ids) repeat an earlier run's (a comparison sampler that its
    tuning switched off draws official's samples) is not passed through the evaluator again: its result is the earlier
    run's, with its own provenance ([`with_provenance`]).

    With a `state` of several processes ([`untied_sc.distributed.process_state`], e.g. under `accelerate launch` or
    `torchrun`), the distinct runs are dealt out by index (run r to process r mod N), each scored whole by one process,
    and every process receives all scores in run order: the results equal one process's, whatever N. `progress` shows
    a bar over the (main process's) runs to score.

    `parts` keeps each distinct run's result as soon as it is scored, so that a stopped scoring resumes: any object
    with `scored(samples, score, run) -> dict` that returns the kept result of those samples, or else calls `score()`
    and keeps what it returns (`untied-sc evaluate --store` gives a run store,
    [`untied_sc_lab.runs.store.StoreScoring`]).
    Returns one dict per run: its key under `"run"`, then the [`evaluate_samples`] result.
    """
    from untied_sc.distributed import gather_in_order, main_process_progress, shard_batches

    if isinstance(samples, (str, os.PathLike)):
        samples = read_samples(samples)
    name = None
    if isinstance(evaluator, (str, os.PathLike)):
        name = str(evaluator)
        loading = {key: options.pop(key) for key in ("cache_dir", "device", "dtype") if key in options}
        evaluator = load_evaluator(evaluator, **loading)
    model, tokenizer = evaluator
    evaluator_name = name or getattr(model, "name_or_path", None) or type(model).__name__
    summary = {"repetition_n": options.pop("repetition_n", 4), "distinct": options.pop("distinct", (1, 2, 3, 4))}
    protocol = options.get("protocol", "elf")
    groups = group_runs(samples)
    holders: dict[tuple, list[int]] = {}  # [`samples_key`] -> the runs that hold those samples, by index in `groups`
    for index, (_, group) in enumerate(groups):
        holders.setdefault(samples_key(group), []).append(index)
    distinct = list(holders.values())

    def score_distinct(runs: list[int]) -> list[dict]:
        key, first = groups[runs[0]]

        def score() -> dict:
            scores = generative_perplexity([sample.text for sample in first], model, tokenizer, **options)
            return _summary(first, scores, protocol, evaluator_name, **summary)

        label = ", ".join(f"{k} {v}" for k, v in key.items())
        result = score() if parts is None else parts.scored(first, score, label)
        return [with_provenance(result, groups[index][1]) for index in runs]

    mine = {
        index: score_distinct(distinct[index])
        for index in main_process_progress(shard_batches(len(distinct), state), state, progress, desc="scoring runs")
    }
    by_run: dict[int, dict] = {}
    for runs, results in zip(distinct, gather_in_order(mine, state), strict=True):
        by_run.update(zip(runs, results, strict=True))
    return [
        {"run": key, **by_run[index], **({"evaluator": name} if name else {})} for index, (key, _) in enumerate(groups)
    ]


def compare_results(
    baseline: dict,
    candidate: dict,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
    unit: str = "sample",
) -> dict:
    """Paired comparison of two [`evaluate_samples`] results (baseline = a, candidate = b), pairing samples by order.

    The two files must hold the same number of samples and, where both record seeds, the same seed at each position.
    `unit` is the bootstrap's resampling unit: `"sample"`, or `"batch"` (ELF: a batch shares one time grid), which
    needs every sample's `seed` and `batch`. Returns [`PairedComparison`]'s fields as a dict (Δ = candidate - baseline
    per-token NLL) and the unit.
    """
    a, b = baseline["per_sample"], candidate["per_sample"]
    if len(a) != len(b):
        raise ValueError(f"Paired files must hold the same number of samples, got {len(a)} and {len(b)}.")
    for first, second in zip(a, b, strict=True):
        if "seed" in first and "seed" in second and first["seed"] != second["seed"]:
            raise ValueError(
                f"Sample {first['index']} has seed {first['seed']} in the baseline but {second['seed']} in the "
                "candidate; write both files in the same seed order."
            )
    if unit == "batch":
        missing = [r["index"] for r in a if "seed" not in r or "batch" not in r]
        if missing:
            raise ValueError(
                f"Resampling whole batches needs each sample's 'seed' and 'batch'; samples {missing[:5]} lack them. "
                "Write them (a benchmark's samples files do) or resample single samples (unit 'sample')."
            )
        clusters, strata = [(r["seed"], r["batch"]) for r in a], [r["seed"] for r in a]
    elif unit == "sample":
        clusters, strata = None, None
    else:
        raise ValueError(f"`unit` must be 'sample' or 'batch', got {unit!r}.")
    nan = float("nan")
    comparison = paired_comparison(
        [nan if r["mean_nll"] is None else r["mean_nll"] for r in a],
        [nan if r["mean_nll"] is None else r["mean_nll"] for r in b],
        num_resamples=num_resamples,
        confidence=confidence,
        generator=generator,
        clusters=clusters,
        strata=strata,
    )
    return {**vars(comparison), "resampling_unit": unit}
