"""The parts of one benchmark sweep, sampled by several `untied-sc benchmark --generate-only` commands (say one
process per NFE on one GPU, or parts on several machines), merged into the sweep one command would have sampled
([`merge_generations`]); what every part must share ([`SHARED_SETTINGS`]) and the one-part order of its runs.
"""

from collections.abc import Mapping, Sequence
from dataclasses import replace

from untied_sc.generation import SamplerSpec

from ..runs.store import RUN_SETTINGS
from .generation_record import CANDIDATES_KEY, Generation
from .provenance import SampledPart
from .records import RunRecord


# What every part of a merged sweep must share: the model, the settings that decide a run's samples
# ([`RUN_SETTINGS`]) and the sampler set (a stored part's file is named after them, with its `format`). `device` and
# `torch` may differ between parts: every pair, knob choice and throughput ratio stays within one NFE, so within one
# part, and the report names each part's machine ([`merge_generations`]).
SHARED_SETTINGS = (
    "format",
    "model",
    *RUN_SETTINGS,
    "seeds",
    "samplers",
    "baseline",
    "diversity_values",
    "diversity_samplers",
)


def merge_generations(generations: Sequence[Generation], names: Sequence[str] | None = None) -> Generation:
    """
    One generation from parts that sampled disjoint sets of NFEs of the same sweep (the same model, seeds, batch
    size and samplers: [`SHARED_SETTINGS`]). The runs are put in the one-part order, so the merged generation scores
    as if one command had sampled every NFE; `seconds` adds the parts' sampling times, and the commands are kept, one
    per part. Parts may come from different machines (a GPU for some NFEs, a CPU for others): samples then differ
    from what one machine would draw, but every matched pair and knob choice lies within one NFE, so within one part;
    `device` and `torch` then name each part's, by NFE.

    Args:
        generations (`Sequence[Generation]`): the parts ([`generate_sweep`] results, or the parts of a run store that
            [`read_stored_sweeps`] reads).
        names (`Sequence[str]`, *optional*): the parts' names (their files in the store), for errors.

    Raises:
        ValueError: when the parts differ in a shared setting or overlap in an NFE (the error names both parts).
    """
    if len(generations) == 1:
        return generations[0]
    names = list(names) if names is not None else [f"part {i + 1}" for i in range(len(generations))]
    first = generations[0]
    for name, part in zip(names[1:], generations[1:], strict=True):
        differing = [key for key in SHARED_SETTINGS if key != "format" and _shared(part, key) != _shared(first, key)]
        if part.candidates is not None or first.candidates is not None:
            differing += [
                f"{CANDIDATES_KEY}.{key}"
                for key in ("samplers", "bank", "ace")
                if getattr(part.candidates, key, None) != getattr(first.candidates, key, None)
            ]
        differing += ["knob_tuning"] if part.knob_tuning != first.knob_tuning else []
        if differing:
            raise ValueError(
                f"{name} and {names[0]} are not parts of one sweep: they differ in {', '.join(differing)}. Merge only "
                "the parts of one --generate-only sweep, sampled with the same options but --nfe."
            )
    seen: dict[int, str] = {}
    for name, part in zip(names, generations, strict=True):
        for n in part.nfe:
            if n in seen:
                raise ValueError(f"{name} and {seen[n]} both sampled NFE {n}: merge parts with disjoint --nfe.")
            seen[n] = name
    nfe = tuple(sorted(seen))
    coefficients: dict[str, dict] = {}
    for part in generations:
        for sampler, by_steps in (part.coefficients or {}).items():
            coefficients.setdefault(sampler, {}).update(by_steps)
    tuned_here = [part.tuned_when_sampled for part in generations if part.tuned_when_sampled is not None]
    tuned = None
    if tuned_here:  # `--tune-here` parts: what each sampled, by NFE
        tuned = replace(tuned_here[0], sampled={n: runs for t in tuned_here for n, runs in t.sampled.items()})
    candidates = first.candidates
    if candidates is not None:
        untied: dict[str, dict] = {}
        for part in generations:
            for sampler, by_steps in part.candidates.untied.items():
                untied.setdefault(sampler, {}).update(by_steps)
        candidates = replace(candidates, untied=untied)
    merged = replace(
        first,
        nfe=nfe,
        diversity_nfe=tuple(sorted({n for part in generations for n in part.diversity_nfe})),
        coefficients=coefficients,
        samplers=_merged_specs([part.samplers for part in generations]),
        seconds=sum(part.seconds for part in generations),
        command=" ; ".join(part.command for part in generations),
        parts=tuple(
            SampledPart(part.nfe, part.command, part.seconds, part.device, part.torch) for part in generations
        ),
        device=_by_part(generations, "device"),
        torch=_by_part(generations, "torch"),
        tuned_when_sampled=tuned,
        candidates=candidates,
    )
    return replace(
        merged,
        runs=tuple(sorted((run for part in generations for run in part.runs), key=_run_order(merged))),
        bank_runs=tuple(
            sorted((run for part in generations for run in part.bank_runs), key=lambda r: nfe.index(r.nfe))
        ),
    )


def _by_part(generations: Sequence[Generation], key: str) -> str:
    """A setting the parts may differ in, as one string: the value when all share it, else each value with its NFEs
    ("cuda:0 (NVIDIA H200) at NFE 8, 16; cpu at NFE 64")."""
    nfe_by_value: dict[str, list[int]] = {}
    for part in generations:
        nfe_by_value.setdefault(str(getattr(part, key)), []).extend(part.nfe)
    if len(nfe_by_value) == 1:
        return next(iter(nfe_by_value))
    return "; ".join(
        f"{value} at NFE {', '.join(str(n) for n in sorted(nfe))}"
        for value, nfe in sorted(nfe_by_value.items(), key=lambda item: min(item[1]))
    )


def _merged_specs(parts: Sequence[Mapping[str, SamplerSpec]]) -> dict[str, SamplerSpec]:
    """The merged sweep's sampler specs: the first part's, a spec's per-NFE knobs (the baselines' grid values) those
    of every part's NFEs."""
    merged = {}
    for name, spec in parts[0].items():
        if spec.knobs_by_steps is not None:
            spec = spec.with_knobs(
                {n: knobs for part in parts for n, knobs in (part[name].knobs_by_steps or {}).items()}
            )
        merged[name] = spec
    return merged


def _shared(generation: Generation, key: str):
    """A setting as the parts must share it: sampler specs without their per-NFE knobs."""
    if key != "samplers":
        return getattr(generation, key)
    return {name: spec.without_knobs() for name, spec in generation.samplers.items()}


def _run_order(generation: Generation):
    """The one-part order of runs: main runs (NFE, seed, sampler), then diversity runs (value, NFE, seed, sampler)."""
    nfe, seeds, samplers = generation.nfe, generation.seeds, list(generation.samplers)

    def key(run: RunRecord) -> tuple:
        place = (nfe.index(run.nfe), seeds.index(run.seed), samplers.index(run.sampler))
        return (0, 0, *place) if run.value is None else (1, generation.diversity_values.index(run.value), *place)

    return key
