"""The files that carry a benchmark generation from the machine that samples to the machine that scores
(`untied-sc benchmark --generate-only`, then `--from`): [`write_generation`], [`read_generation`], and
[`merge_generations`] for a sweep sampled in parts (say one process per NFE on one GPU, or parts on several machines).
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from untied_sc.generation import KNOBS_KEY, Sample, read_samples, write_samples
from untied_sc.output_paths import generation_paths  # noqa: F401  (re-exported)

from ..runs.store import RUN_SETTINGS


GENERATION_FORMAT = "untied-sc benchmark generation"
CANDIDATES_KEY = "baseline_candidates"  # the baselines experiment's tuning-bank candidates in a generation file

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


def write_generation(generation: dict, output_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes a [`generate_sweep`] result as `<model>.generation.json` (settings, run timings) and
    `<model>.generation-samples.jsonl.gz` (every sample, with its run's sampler, NFE, seed, batch, index and knob
    value; a name apart from the report's own `<model>.samples.jsonl.gz`, which holds only the runs it scored)."""
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    paths = generation_paths(output_dir, generation["model"])
    header = {**generation, "runs": [{k: v for k, v in run.items() if k != "samples"} for run in generation["runs"]]}
    header["samples_file"] = paths["samples"].name
    paths["generation"].write_text(json.dumps(header, indent=1) + "\n")
    write_samples(paths["samples"], (sample for run in generation["runs"] for sample in run["samples"]))
    return paths


def read_generation(path: str | os.PathLike) -> dict:
    """Reads a `<model>.generation.json` written by [`write_generation`] (and its samples file beside it), checking
    that every run holds its `num_samples` samples in order."""
    path = Path(path)
    try:
        generation = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot read the generation file {path}: {error}") from error
    if generation.get("format") != GENERATION_FORMAT:
        raise ValueError(
            f"{path} is not a benchmark generation file (written by `untied-sc benchmark --generate-only`)."
        )
    knob = generation["diversity_knob"]
    by_run: dict[tuple, list[Sample]] = {}
    for sample in read_samples(path.parent / generation["samples_file"]):
        key = (sample.sampler, sample.nfe, sample.seed, sample.extra.get(knob))
        by_run.setdefault(key, []).append(sample)
    for run in generation["runs"]:
        key = (run["sampler"], run["nfe"], run["seed"], run[knob])
        samples = by_run.pop(key, [])
        expected = run.get("num_samples", generation["num_samples"])  # a tuning bank's runs have their own size
        if [s.extra.get("index") for s in samples] != list(range(expected)):
            raise ValueError(
                f"{generation['samples_file']} holds {len(samples)} samples of run {key} (sampler, NFE, seed, "
                f"{knob}), not samples 0..{expected - 1} in order: the file is incomplete or was "
                "edited. Generate it again."
            )
        run["samples"] = samples
    if by_run:
        raise ValueError(
            f"{generation['samples_file']} holds samples of runs {sorted(by_run, key=str)} that "
            f"{path.name} does not list."
        )
    return generation


def merge_generations(generations: Sequence[Mapping], names: Sequence[str] | None = None) -> dict:
    """
    One generation from parts that sampled disjoint sets of NFEs of the same sweep (the same model, seeds, batch
    size and samplers: [`SHARED_SETTINGS`]). The runs are put in the one-part order, so the merged generation scores
    as if one command had sampled every NFE; `seconds` adds the parts' sampling times, and the commands are kept, one
    per part. Parts may come from different machines (a GPU for some NFEs, a CPU for others): samples then differ
    from what one machine would draw, but every matched pair and knob choice lies within one NFE, so within one part;
    `device` and `torch` then name each part's, by NFE.

    Args:
        generations (`Sequence[Mapping]`): the parts ([`read_generation`] readings).
        names (`Sequence[str]`, *optional*): the parts' file names, for errors.

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
    samplers = {name: dict(spec) for name, spec in first["samplers"].items()}
    for name, spec in samplers.items():  # a spec's per-NFE knobs (the baselines' grid values): each part's NFEs
        if KNOBS_KEY in spec:
            spec[KNOBS_KEY] = {k: v for part in generations for k, v in part["samplers"][name][KNOBS_KEY].items()}
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


def _shared(generation: Mapping, key: str):
    """A setting as the parts must share it: sampler specs without their per-NFE knobs."""
    if key != "samplers":
        return generation.get(key)
    return {name: {k: v for k, v in spec.items() if k != KNOBS_KEY} for name, spec in generation[key].items()}


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


def read_generations(paths: Sequence[str | os.PathLike]) -> dict:
    """[`read_generation`] of each file, merged ([`merge_generations`]) when there are several."""
    return merge_generations([read_generation(path) for path in paths], [str(path) for path in paths])
