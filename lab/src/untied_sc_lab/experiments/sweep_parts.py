"""The parts of one benchmark sweep, sampled by several `untied-sc benchmark --generate-only` commands (say one
process per NFE on one GPU, or parts on several machines), merged into the sweep one command would have sampled
([`merge_generations`]); what every part must share ([`SHARED_SETTINGS`]) and the one-part order of its runs.
"""

from collections.abc import Mapping, Sequence

from untied_sc.generation import SamplerSpec

from ..runs.store import RUN_SETTINGS


GENERATION_FORMAT = "untied-sc benchmark generation"  # the `format` of a [`generate_sweep`] result
CANDIDATES_KEY = "baseline_candidates"  # the baselines experiment's tuning-bank candidates in a sampled sweep

# What every part of a merged sweep must share: the model, the settings that decide a run's samples
# ([`RUN_SETTINGS`]) and the sampler set. `device` and `torch` may differ between parts: every pair, knob choice and
# throughput ratio stays within one NFE, so within one part, and the report names each part's machine
# ([`merge_generations`]).
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


def merge_generations(generations: Sequence[Mapping], names: Sequence[str] | None = None) -> dict:
    """
    One generation from parts that sampled disjoint sets of NFEs of the same sweep (the same model, seeds, batch
    size and samplers: [`SHARED_SETTINGS`]). The runs are put in the one-part order, so the merged generation scores
    as if one command had sampled every NFE; `seconds` adds the parts' sampling times, and the commands are kept, one
    per part. Parts may come from different machines (a GPU for some NFEs, a CPU for others): samples then differ
    from what one machine would draw, but every matched pair and knob choice lies within one NFE, so within one part;
    `device` and `torch` then name each part's, by NFE.

    Args:
        generations (`Sequence[Mapping]`): the parts ([`generate_sweep`] results, or the parts of a run store that
            [`read_stored_sweeps`] reads).
        names (`Sequence[str]`, *optional*): the parts' names (their files in the store), for errors.

    Raises:
        ValueError: when the parts differ in a shared setting or overlap in an NFE (the error names both parts).
    """
    if len(generations) == 1:
        return dict(generations[0])
    names = list(names) if names is not None else [f"part {i + 1}" for i in range(len(generations))]
    first = generations[0]
    for name, part in zip(names[1:], generations[1:], strict=True):
        differing = [key for key in SHARED_SETTINGS if _shared(part, key) != _shared(first, key)]
        if CANDIDATES_KEY in part or CANDIDATES_KEY in first:
            ours, theirs = part.get(CANDIDATES_KEY) or {}, first.get(CANDIDATES_KEY) or {}
            differing += [
                f"{CANDIDATES_KEY}.{key}"
                for key in ("samplers", "variants", "bank")
                if ours.get(key) != theirs.get(key)
            ]
            if "ace" in ours and "ace" in theirs and ours["ace"] != theirs["ace"]:  # parts sampled with other ACE
                differing.append(f"{CANDIDATES_KEY}.ace")
        if "knob_tuning" in part or "knob_tuning" in first:
            differing += ["knob_tuning"] if part.get("knob_tuning") != first.get("knob_tuning") else []
        if differing:
            raise ValueError(
                f"{name} and {names[0]} are not parts of one sweep: they differ in {', '.join(differing)}. Merge only "
                "the parts of one --generate-only sweep, sampled with the same options but --nfe."
            )
    seen: dict[int, str] = {}
    for name, part in zip(names, generations, strict=True):
        for n in part["nfe"]:
            if n in seen:
                raise ValueError(f"{name} and {seen[n]} both sampled NFE {n}: merge parts with disjoint --nfe.")
            seen[n] = name
    nfe = sorted(seen)
    diversity_nfe = sorted({n for part in generations for n in part.get("diversity_nfe") or []})
    coefficients: dict[str, dict] = {}
    for part in generations:
        for sampler, by_steps in (part.get("coefficients") or {}).items():
            coefficients.setdefault(sampler, {}).update(by_steps)
    samplers = _merged_specs([_part_specs(part) for part in generations])
    merged = {**first, "nfe": nfe, "diversity_nfe": diversity_nfe, "coefficients": coefficients, "samplers": samplers}
    merged["seconds"] = sum(part["seconds"] for part in generations)
    merged["command"] = " ; ".join(part["command"] for part in generations)
    merged["parts"] = [
        {key: part.get(key) for key in ("nfe", "command", "seconds", "device", "torch")} for part in generations
    ]
    for key in ("device", "torch"):
        merged[key] = _by_part(generations, key)
    tuned_here = [part["tuned_when_sampled"] for part in generations if "tuned_when_sampled" in part]
    if tuned_here:  # `--tune-here` parts: what each sampled, by NFE
        sampled = {n: names for tuned in tuned_here for n, names in tuned["sampled"].items()}
        merged["tuned_when_sampled"] = {**tuned_here[0], "sampled": sampled}
    if CANDIDATES_KEY in first:
        untied: dict[str, dict] = {}
        for part in generations:
            for sampler, by_steps in part[CANDIDATES_KEY]["untied"].items():
                untied.setdefault(sampler, {}).update(by_steps)
        merged[CANDIDATES_KEY] = {**first[CANDIDATES_KEY], "untied": untied}
    merged["runs"] = sorted((run for part in generations for run in part["runs"]), key=_run_order(merged))
    return merged


def _by_part(generations: Sequence[Mapping], key: str) -> str:
    """A setting the parts may differ in, as one string: the value when all share it, else each value with its NFEs
    ("cuda:0 (NVIDIA H200) at NFE 8, 16; cpu at NFE 64")."""
    nfe_by_value: dict[str, list[int]] = {}
    for part in generations:
        nfe_by_value.setdefault(str(part.get(key)), []).extend(part["nfe"])
    if len(nfe_by_value) == 1:
        return next(iter(nfe_by_value))
    return "; ".join(
        f"{value} at NFE {', '.join(str(n) for n in sorted(nfe))}"
        for value, nfe in sorted(nfe_by_value.items(), key=lambda item: min(item[1]))
    )


def _part_specs(generation: Mapping) -> dict[str, SamplerSpec]:
    """A part's sampler specs, read from its JSON."""
    return {name: SamplerSpec.from_json(spec, f"samplers[{name!r}]") for name, spec in generation["samplers"].items()}


def _merged_specs(parts: Sequence[Mapping[str, SamplerSpec]]) -> dict[str, dict]:
    """The merged sweep's sampler specs, as JSON: the first part's, a spec's per-NFE knobs (the baselines' grid
    values) those of every part's NFEs."""
    merged = {}
    for name, spec in parts[0].items():
        if spec.knobs_by_steps is not None:
            spec = spec.with_knobs(
                {n: knobs for part in parts for n, knobs in (part[name].knobs_by_steps or {}).items()}
            )
        merged[name] = spec.to_json()
    return merged


def _shared(generation: Mapping, key: str):
    """A setting as the parts must share it: sampler specs without their per-NFE knobs."""
    if key != "samplers":
        return generation.get(key)
    return {name: spec.without_knobs() for name, spec in _part_specs(generation).items()}


def _run_order(generation: Mapping):
    """The one-part order of runs: main runs (NFE, seed, sampler), then diversity runs (value, NFE, seed, sampler),
    then anything else (a tuning bank) by NFE."""
    knob = generation["diversity_knob"]
    nfe, seeds = generation["nfe"], generation["seeds"]
    samplers = list(generation["samplers"])
    values = list(generation.get("diversity_values") or [])

    def key(run: Mapping) -> tuple:
        n = nfe.index(run["nfe"])
        if run["sampler"] not in samplers:  # the sort is stable: a part's own order within an NFE
            return (2, 0, n, 0, 0)
        place = (seeds.index(run["seed"]), samplers.index(run["sampler"]))
        if run[knob] is None:
            return (0, 0, n, *place)
        return (1, values.index(run[knob]), n, *place)

    return key
