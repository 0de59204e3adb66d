"""The matched benchmark behind `untied-sc benchmark`: official vs untied sampling across NFEs and seeds
(docs/algorithm.md §6).

For every seed s, NFE N and sampler, the pipeline generates `num_samples` samples in batches; batch b of every
sampler is drawn from `torch.Generator().manual_seed(batch_seed(s, b))`, so sample i of the official run and sample i
of the untied run share the initial latent z_0 and the random stream (pairs are matched; results depend on
`batch_size` through the batch seeds, which is recorded). Each run is scored with [`evaluate_samples`] (GenPPL under
the evaluator and protocol, entropies, Rep-4, distinct-n, per-sample NLL) and timed (samples/s of sampling alone).

Aggregates per (sampler, NFE): mean ± standard error over seeds. Paired per (candidate, NFE) against the baseline
sampler, pooling the pairs of all seeds: the GenPPL ratio candidate / baseline with a paired bootstrap CI, the mean
per-token ΔNLL with its CI and the fraction of pairs where the candidate is worse ([`paired_comparison`]), and the
retained throughput. The diversity sweep runs the official sampler at several values of the family's diversity knob
(LangFlow: the temperature T of x̂ = softmax(logits / T)·E_norm; ELF: the temperature T of the final decode's softmax,
0 = argmax) so that samplers can be compared at equal entropy (GenPPL–entropy curves).

The benchmark runs pipelines (it is the one place in `evaluation` that does) but scores only texts and token ids.
"""

import json
import math
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from ..calibration.calibrate import calibration_seeds
from ..schedulers.sampler_statistics import COEFFICIENT_NAMES
from .curves import FIT_DESCRIPTION, RunSamples, equal_entropy_ratio, gen_ppl_on_curve
from .evaluator import SMOLLM2_NAME, describe_evaluator
from .io import Sample, evaluate_samples, read_samples, write_samples
from .metrics import retained_throughput, samples_per_second
from .sampling import (
    CALL_KEYS,
    RESAMPLING_UNITS,
    build_scheduler,
    diversity_knob,
    family_of,
    generate,
    resampling_clusters,
    tokenizer_description,
    tuning_seeds,
)
from .statistics import cluster_resample_weights, mean_and_standard_error, paired_comparison, percentile_interval


DEFAULT_NFE = (8, 16, 32, 64)
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_SAMPLERS = {"official": {}, "untied": {}}
BASELINE = "official"
AGGREGATED_METRICS = (
    "gen_ppl",
    "nll_per_token",
    "entropy",
    "entropy_generator_ids",
    "entropy_evaluator_ids",
    "rep_4",
    "distinct_1",
    "distinct_2",
    "distinct_3",
    "distinct_4",
    "token_rep_4",
    "token_distinct_4",
    "longest_repeat",
    "samples_per_second",
)


# The paper's controlled experiments as sampler sets (Table "placement": (a) where the correction goes, (b) which
# components are on; Appendix "parameter sensitivity": one coefficient at a time over ×½..×2).
SENSITIVITY_FACTORS = (0.5, 0.75, 1.5, 2.0)


def experiment_samplers(name: str) -> dict[str, dict]:
    """Sampler specs of an experiment: `main`, `placement`, `components` or `sensitivity` (official always first)."""
    if name == "main":
        return dict(DEFAULT_SAMPLERS)
    if name == "placement":
        return {
            BASELINE: {},
            "untied (correction off)": {"eta_t": 0.0},
            "untied (correction to solver)": {"correction_routing": "solver"},
            "untied (correction to next SC)": {"correction_routing": "self_conditioning"},
            "untied (correction to both)": {"correction_routing": "both"},
        }
    if name == "components":
        return {
            BASELINE: {},
            "untied (SC transform only)": {"eta_t": 0.0},
            "untied (correction only)": {"eta_r": 0.0},
            "untied (both)": {},
        }
    if name == "sensitivity":
        samplers = {BASELINE: {}, "untied": {}}
        for coefficient in COEFFICIENT_NAMES:
            for factor in SENSITIVITY_FACTORS:
                samplers[f"untied ({coefficient} x{factor:g})"] = {f"{coefficient}_scale": factor}
        return samplers
    raise ValueError(f"Unknown experiment {name!r}; choose main, placement, components or sensitivity.")


def with_preset(samplers: Mapping[str, Mapping], preset: str | None) -> dict[str, dict]:
    """The sampler set with every untied sampler on the paper coefficient `preset` (unchanged when `None`)."""
    if preset is None:
        return dict(samplers)
    return {
        name: dict(spec) if name == BASELINE else {"coefficients": preset, **spec} for name, spec in samplers.items()
    }


def _normalise_samplers(samplers: Mapping[str, Mapping]) -> dict[str, dict]:
    """Each spec gets an explicit `scheduler` key: `"official"` for the sampler named official, else `"untied"`."""
    if BASELINE not in samplers:
        raise ValueError(
            f"`samplers` must include the baseline {BASELINE!r} (the pairs' first side), got {list(samplers)}."
        )
    return {
        name: {"scheduler": "official" if name == BASELINE else "untied", **dict(spec)}
        for name, spec in samplers.items()
    }


# Per-sample records a run keeps (the intervals and the equal-entropy control resample them).
PER_SAMPLE_KEYS = ("mean_nll", "nll_sum", "num_tokens", "entropy")


def _run_record(result: dict, sampler: str, nfe: int, seed: int, knob: str, value, seconds: float) -> dict:
    per_sample = result["per_sample"]
    return {
        "sampler": sampler,
        "nfe": nfe,
        "seed": seed,
        knob: value,
        "num_samples": result["num_samples"],
        "num_scored": result["num_scored"],
        "seconds": seconds,
        "samples_per_second": samples_per_second(result["num_samples"], seconds),
        **{key: result.get(key) for key in AGGREGATED_METRICS if key != "samples_per_second"},
        "num_tokens": result["num_tokens"],
        "per_sample": {key: [r.get(key) for r in per_sample] for key in PER_SAMPLE_KEYS},
    }


def _mean_se(values) -> dict:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    if not finite:
        return {"mean": None, "se": None, "n": 0}
    mean, se = mean_and_standard_error(finite)
    return {"mean": mean, "se": None if math.isnan(se) else se, "n": len(finite)}


def _nan_if_none(values) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def run_clusters(runs: Sequence[dict], clusters: Sequence | None = None) -> tuple[list, list]:
    """Cluster and stratum labels of the pooled samples of `runs` (one run per seed, in order): `(seed, cluster)` and
    the seed, `clusters` being the label of sample i within a seed ([`resampling_clusters`]; `None`: i itself)."""
    if clusters is None:
        clusters = range(max(len(run["per_sample"]["nll_sum"]) for run in runs))
    labels, strata = [], []
    for position, run in enumerate(runs):  # one run per seed
        count = len(run["per_sample"]["nll_sum"])
        if count > len(clusters):
            raise ValueError(f"A run holds {count} samples but only {len(clusters)} cluster labels were given.")
        labels += [(position, clusters[i]) for i in range(count)]
        strata += [position] * count
    return labels, strata


def genppl_ratio_ci(
    baseline_runs: Sequence[dict],
    candidate_runs: Sequence[dict],
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = 0,
) -> tuple[float, tuple[float, float]]:
    """Pooled GenPPL ratio candidate / baseline over matched runs, and its paired cluster bootstrap CI.

    GenPPL = exp(Σ nll_sum / Σ num_tokens) pooled over the pairs of all the runs (one run per seed, same order), so the
    ratio is exp(NLL/token of the candidate - NLL/token of the baseline). `clusters` labels sample i of a seed with its
    resampling unit ([`resampling_clusters`]; default: every sample its own); clusters are resampled within seeds.
    """
    columns = []
    for a, b in zip(baseline_runs, candidate_runs, strict=True):
        pa, pb = a["per_sample"], b["per_sample"]
        columns += list(zip(pa["nll_sum"], pa["num_tokens"], pb["nll_sum"], pb["num_tokens"], strict=True))
    table = torch.tensor(columns, dtype=torch.float64)
    labels, strata = run_clusters(baseline_runs, clusters)
    weights = torch.cat(
        [
            torch.ones(1, len(labels), dtype=torch.float64),
            cluster_resample_weights(labels, num_resamples, generator, strata),
        ]
    )
    sums = weights @ table  # (1 + R, 4): Σ nll_a, Σ tokens_a, Σ nll_b, Σ tokens_b
    ratios = torch.exp(sums[:, 2] / sums[:, 3].clamp(min=1) - sums[:, 0] / sums[:, 1].clamp(min=1))
    return float(ratios[0]), percentile_interval(ratios[1:], confidence)


def aggregate(
    runs: Sequence[dict],
    baseline: str = BASELINE,
    num_resamples: int = 1000,
    generator: int = 0,
    clusters: Sequence | None = None,
) -> dict:
    """Aggregates the main-sweep runs (those without a diversity value).

    Returns `{"by_sampler": {sampler: {nfe: {metric: {mean, se, n}}}}, "paired": {candidate: {nfe: {...}}}}`, NFEs as
    strings (JSON keys). `paired` pools the pairs of all seeds present in both samplers, matched by seed and order;
    its intervals resample `clusters` (the resampling unit of sample i of a seed, [`resampling_clusters`]; default:
    every sample its own) within seeds.
    """
    by_sampler: dict = {}
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(run["sampler"], {}).setdefault(run["nfe"], {})[run["seed"]] = run
    for sampler, by_nfe in grouped.items():
        by_sampler[sampler] = {
            str(nfe): {metric: _mean_se([r.get(metric) for r in seeds.values()]) for metric in AGGREGATED_METRICS}
            for nfe, seeds in sorted(by_nfe.items())
        }
    paired: dict = {}
    for sampler, by_nfe in grouped.items():
        if sampler == baseline or baseline not in grouped:
            continue
        for nfe, seeds in sorted(by_nfe.items()):
            common = sorted(set(seeds) & set(grouped[baseline].get(nfe, {})))
            if not common:
                continue
            a = [grouped[baseline][nfe][s] for s in common]
            b = [seeds[s] for s in common]
            labels, strata = run_clusters(a, clusters)
            nll_a = [x for run in a for x in _nan_if_none(run["per_sample"]["mean_nll"])]
            nll_b = [x for run in b for x in _nan_if_none(run["per_sample"]["mean_nll"])]
            comparison = paired_comparison(
                nll_a, nll_b, num_resamples=num_resamples, generator=generator, clusters=labels, strata=strata
            )
            ratio, ratio_ci = genppl_ratio_ci(a, b, clusters, num_resamples=num_resamples, generator=generator)
            per_seed_ratio = [rb["gen_ppl"] / ra["gen_ppl"] for ra, rb in zip(a, b, strict=True)]
            retained = [
                retained_throughput(ra["samples_per_second"], rb["samples_per_second"])
                for ra, rb in zip(a, b, strict=True)
            ]
            paired.setdefault(sampler, {})[str(nfe)] = {
                "baseline": baseline,
                "seeds": common,
                "gen_ppl_ratio": ratio,
                "gen_ppl_ratio_ci": list(ratio_ci),
                "gen_ppl_ratio_per_seed": _mean_se(per_seed_ratio),
                **{key: list(v) if isinstance(v, tuple) else v for key, v in vars(comparison).items()},
                "retained_throughput": _mean_se(retained),
            }
    return {"by_sampler": by_sampler, "paired": paired}


GENERATION_FORMAT = "untied-sc benchmark generation"


def _sweep_runs(
    nfe: Sequence[int],
    seeds: Sequence[int],
    samplers: Mapping[str, Mapping],
    diversity_values: Sequence[float] | None,
    diversity_samplers: Sequence[str],
    diversity_nfe: Sequence[int] | None,
) -> list[tuple[str, int, int, float | None]]:
    """The sweep's runs in order: (sampler, NFE, seed, diversity value or `None` for a main run)."""
    plan = [(s, n, seed, None) for n in nfe for seed in seeds for s in samplers]
    for value in diversity_values or ():
        plan += [(s, n, seed, value) for n in (diversity_nfe or nfe) for seed in seeds for s in diversity_samplers]
    return plan


def generate_sweep(
    pipeline_dir_or_pipe,
    nfe: Sequence[int] = DEFAULT_NFE,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    num_samples: int = 256,
    batch_size: int = 32,
    samplers: Mapping[str, Mapping] | None = None,
    diversity_values: Sequence[float] | None = None,
    diversity_samplers: Sequence[str] = (BASELINE,),
    diversity_nfe: Sequence[int] | None = None,
    name: str | None = None,
    command: str | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> dict:
    """The sampling half of [`run_sweep`]: generates every run of the sweep and returns it, unscored.

    The arguments are [`run_sweep`]'s. Sampling and scoring can run on different machines (sample on a GPU, score on
    a machine that has the evaluator): [`write_generation`] saves the result, [`read_generation`] loads it and
    [`score_sweep`] scores it, with the same numbers as [`run_sweep`] on the same samples.

    Returns:
        `dict` with the sweep's settings (`model`, `family`, `pipeline_class`, `nfe`, `seeds`, `num_samples`,
        `batch_size`, `samplers`, `diversity_*`), `coefficients` (η_R, η_T, η_O, α each untied sampler ran with, by
        NFE), `device`, `torch`, `command`, `seconds` (wall time) and `runs`: one
        dict per (sampler, NFE, seed[, knob value]) with `seconds` of sampling and its `samples` ([`Sample`]s).
    """
    from tqdm.auto import tqdm

    from ..schedulers import UntiedSelfConditioningScheduler

    began = time.perf_counter()
    if command is None:
        command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    if isinstance(pipeline_dir_or_pipe, (str, os.PathLike)):
        from ..pipelines import load_pipeline

        name = name or Path(str(pipeline_dir_or_pipe).rstrip("/")).name
        pipe = load_pipeline(pipeline_dir_or_pipe)
    else:
        pipe = pipeline_dir_or_pipe
        name = name or Path(str(getattr(pipe, "name_or_path", None) or type(pipe).__name__).rstrip("/")).name
    if device is not None:
        pipe.to(device)
    family = family_of(pipe)
    statistics = getattr(pipe, "sampler_statistics", None)
    for used, what, remedy in (
        (tuning_seeds(statistics), "are the bank the sampler coefficients were tuned on (`untied-sc tune`)", ""),
        (
            calibration_seeds(statistics),
            "drew the trajectory banks the sampler statistics were calibrated on (`untied-sc calibrate --seed`)",
            " or recalibrate with another seed",
        ),
    ):
        leaked = sorted(set(seeds) & used)
        if leaked:
            raise ValueError(f"Seeds {leaked} {what}; evaluating on them would leak. Choose other --seeds{remedy}.")
    knob = diversity_knob(family)
    samplers = _normalise_samplers(samplers if samplers is not None else DEFAULT_SAMPLERS)
    unknown = [s for s in diversity_samplers if s not in samplers]
    if diversity_values and unknown:
        raise ValueError(f"diversity_samplers {unknown} are not among the samplers {list(samplers)}.")
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"num_samples and batch_size must be positive, got {num_samples} and {batch_size}.")
    plan = _sweep_runs(nfe, seeds, samplers, diversity_values, diversity_samplers, diversity_nfe)

    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    runs = []
    coefficients: dict[str, dict[str, dict[str, float]]] = {}  # as run: presets, tuned values and scales resolved
    try:
        for sampler, n, seed, value in tqdm(plan, desc=f"sampling {name}", disable=not progress):
            spec = samplers[sampler]
            pipe.scheduler = build_scheduler(pipe, spec, original_scheduler.config, n)
            if isinstance(pipe.scheduler, UntiedSelfConditioningScheduler):
                coefficients.setdefault(sampler, {})[str(n)] = pipe.scheduler.resolve_coefficients(n, statistics)
            call_kwargs = {key: spec[key] for key in CALL_KEYS if key in spec}
            if value is not None:
                call_kwargs[knob] = value
            texts, ids, seconds = generate(pipe, n, seed, num_samples, batch_size, **call_kwargs)
            samples = [
                Sample(
                    text=t,
                    ids=i,
                    seed=seed,
                    batch=j // batch_size,
                    sampler=sampler,
                    nfe=n,
                    extra={"index": j, knob: value},
                )
                for j, (t, i) in enumerate(zip(texts, ids, strict=True))
            ]
            runs.append(
                {"sampler": sampler, "nfe": n, "seed": seed, knob: value, "seconds": seconds, "samples": samples}
            )
    finally:
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)
    return {
        "format": GENERATION_FORMAT,
        "model": name,
        "family": family,
        "pipeline_class": type(pipe).__name__,
        "generator_tokenizer": tokenizer_description(pipe.tokenizer),
        "nfe": list(nfe),
        "seeds": list(seeds),
        "num_samples": num_samples,
        "batch_size": batch_size,
        "batch_seed": "1_000_003 * seed + batch_index",
        "samplers": samplers,
        "coefficients": coefficients,
        "baseline": BASELINE,
        "diversity_knob": knob,
        "diversity_values": list(diversity_values or []),
        "diversity_samplers": list(diversity_samplers) if diversity_values else [],
        "diversity_nfe": list(diversity_nfe or nfe) if diversity_values else [],
        "device": str(pipe.device)
        + (f" ({torch.cuda.get_device_name(pipe.device)})" if pipe.device.type == "cuda" else ""),
        "torch": torch.__version__,
        "command": command,
        "seconds": time.perf_counter() - began,
        "runs": runs,
    }


def write_generation(generation: dict, output_dir: str | os.PathLike) -> dict[str, Path]:
    """Writes a [`generate_sweep`] result as `<model>.generation.json` (settings, run timings) and
    `<model>.generation-samples.jsonl.gz` (every sample, with its run's sampler, NFE, seed, batch, index and knob
    value; a name apart from the report's own `<model>.samples.jsonl.gz`, which holds only the runs it scored)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = generation["model"]
    paths = {
        "generation": folder / f"{stem}.generation.json",
        "samples": folder / f"{stem}.generation-samples.jsonl.gz",
    }
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
        if [s.extra.get("index") for s in samples] != list(range(generation["num_samples"])):
            raise ValueError(
                f"{generation['samples_file']} holds {len(samples)} samples of run {key} (sampler, NFE, seed, "
                f"{knob}), not samples 0..{generation['num_samples'] - 1} in order: the file is incomplete or was "
                "edited. Generate it again."
            )
        run["samples"] = samples
    if by_run:
        raise ValueError(
            f"{generation['samples_file']} holds samples of runs {sorted(by_run, key=str)} that "
            f"{path.name} does not list."
        )
    return generation


def score_sweep(
    generation: dict,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    eval_batch_size: int = 8,
    max_length: int | None = None,
    num_resamples: int = 1000,
    output_dir: str | os.PathLike | None = None,
    command: str | None = None,
    progress: bool = True,
    main_only: bool = False,
    **evaluator_kwargs,
) -> dict:
    """The scoring half of [`run_sweep`]: scores a [`generate_sweep`] result (or a [`read_generation`] one) and
    aggregates it. The arguments are [`run_sweep`]'s; `command` is the scoring command when it differs from the
    generation's; `main_only` leaves the diversity runs out (no GenPPL–entropy curves; scoring is the costly half)."""
    from tqdm.auto import tqdm

    from .evaluator import load_evaluator

    began = time.perf_counter()
    family, knob = generation["family"], generation["diversity_knob"]
    if main_only:
        main = [run for run in generation["runs"] if run[knob] is None]
        generation = {
            **generation,
            "runs": main,
            "diversity_values": [],
            "diversity_samplers": [],
            "diversity_nfe": [],
        }
    protocol = protocol or family
    if isinstance(evaluator, (str, os.PathLike)):
        evaluator_name = str(evaluator)
        evaluator = load_evaluator(evaluator, **evaluator_kwargs)
    else:
        evaluator_name = getattr(evaluator[0], "name_or_path", None) or type(evaluator[0]).__name__
    runs = []
    for run in tqdm(generation["runs"], desc=f"scoring {generation['model']}", disable=not progress):
        result = evaluate_samples(
            run["samples"], evaluator=evaluator, protocol=protocol, batch_size=eval_batch_size, max_length=max_length
        )
        runs.append(_run_record(result, run["sampler"], run["nfe"], run["seed"], knob, run[knob], run["seconds"]))

    knob_default = 1.0 if knob == "temperature" else 0.0  # the official sampler's value
    settings = ("model", "family", "pipeline_class", "nfe", "seeds", "num_samples", "batch_size", "batch_seed")
    results = {
        **{key: generation[key] for key in settings},
        "protocol": protocol,
        "evaluator": evaluator_name,
        "evaluator_description": describe_evaluator(evaluator_name, next(evaluator[0].parameters()).dtype),
        "samplers": generation["samplers"],
        "coefficients": generation.get("coefficients"),  # absent from generation files written before it existed
        "generator_tokenizer": generation.get("generator_tokenizer"),
        **{key: generation[key] for key in ("baseline", "diversity_knob", "diversity_values")},
        **{key: generation[key] for key in ("diversity_samplers", "diversity_nfe", "device", "torch")},
        "runs": runs,
        "diversity_default": knob_default,
        "command": generation["command"],
        "main_only": main_only,
    }
    if command is not None and command != generation["command"]:
        results["scoring_command"] = command
        results["scoring_device"] = str(next(evaluator[0].parameters()).device)
    analyse(results, num_resamples=num_resamples)
    results["sampling_seconds"] = generation["seconds"]
    results["scoring_seconds"] = time.perf_counter() - began
    results["wall_seconds"] = results["sampling_seconds"] + results["scoring_seconds"]
    if output_dir is not None:
        samples = [sample for run in generation["runs"] for sample in run["samples"]]
        results["samples_file"] = f"{results['model']}.samples.jsonl.gz"
        results["files"] = {k: str(v) for k, v in write_results(results, output_dir, samples).items()}
    return results


def analyse(results: dict, num_resamples: int = 1000) -> dict:
    """Computes a scored sweep's statistics from its run records, in place: the resampling unit, `aggregates`,
    `diversity_curves` and `equal_entropy` (a report is a function of its runs, so old reports can be re-analysed)."""
    knob = results["diversity_knob"]
    unit, why = RESAMPLING_UNITS[results["family"]]
    clusters = resampling_clusters(results["family"], results["num_samples"], results["batch_size"])
    results["resampling_unit"] = {"unit": unit, "why": why, "stratified_by": "seed"}
    runs = results["runs"]
    results["aggregates"] = aggregate(
        [run for run in runs if run[knob] is None], num_resamples=num_resamples, clusters=clusters
    )
    results["diversity_curves"] = diversity_curves(runs, knob, results["diversity_default"])
    results["equal_entropy_fit"] = FIT_DESCRIPTION
    results["equal_entropy"] = equal_entropy_comparison(
        results["aggregates"]["by_sampler"],
        results["diversity_curves"],
        runs=runs,
        knob=knob,
        clusters=clusters,
        num_resamples=num_resamples,
    )
    return results


def run_sweep(
    pipeline_dir_or_pipe,
    nfe: Sequence[int] = DEFAULT_NFE,
    seeds: Sequence[int] = DEFAULT_SEEDS,
    num_samples: int = 256,
    batch_size: int = 32,
    samplers: Mapping[str, Mapping] | None = None,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    diversity_values: Sequence[float] | None = None,
    diversity_samplers: Sequence[str] = (BASELINE,),
    diversity_nfe: Sequence[int] | None = None,
    eval_batch_size: int = 8,
    max_length: int | None = None,
    num_resamples: int = 1000,
    name: str | None = None,
    output_dir: str | os.PathLike | None = None,
    command: str | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
    **evaluator_kwargs,
) -> dict:
    """Runs the matched official-vs-untied sweep and (with `output_dir`) writes `<name>.json`, `.md` and `.png`.

    [`generate_sweep`] then [`score_sweep`]: use those two to sample and score on different machines.

    Args:
        pipeline_dir_or_pipe: a pipeline folder / Hub id ([`load_pipeline`]) or a loaded pipeline. The untied sampler
            needs its `sampler_statistics` calibrated at every NFE in `nfe` (`untied-sc calibrate`).
        nfe (`Sequence[int]`, defaults to `(8, 16, 32, 64)`): numbers of function evaluations.
        seeds (`Sequence[int]`, defaults to `(0, 1, 2)`): benchmark seeds; batch b of seed s uses
            [`batch_seed`]`(s, b)` for every sampler and NFE.
        num_samples (`int`, defaults to 256): samples per (sampler, NFE, seed).
        batch_size (`int`, defaults to 32): samples per pipeline call (part of the seeding: keep it fixed to compare).
        samplers (`Mapping[str, Mapping]`, defaults to `{"official": {}, "untied": {}}`): name → spec. A spec's
            `scheduler` is `"official"` or `"untied"` (default: `"official"` for the sampler named `official`, else
            `"untied"`); `temperature` / `sc_cfg_scale` / `decode_temperature` go to the pipeline call; every other
            key (`eta_r`, `eta_t`, `eta_o`, `alpha`, `coefficients`, …) overrides the scheduler config.
            `"official"` must be present: it is the baseline of the paired comparisons.
        evaluator: an evaluator name for [`load_evaluator`] (`"smollm2-135m"`, `"gpt2-large"`, a folder) or a
            `(model, tokenizer)` pair.
        protocol (`str`, *optional*): `"elf"` or `"langflow"`; defaults to the pipeline's family.
        diversity_values (`Sequence[float]`, *optional*): values of the family's diversity knob (LangFlow: temperature
            T; ELF: decode temperature) at which `diversity_samplers` also run, for GenPPL–entropy curves.
        diversity_samplers (`Sequence[str]`, defaults to `("official",)`): samplers swept over `diversity_values`.
        diversity_nfe (`Sequence[int]`, *optional*): NFEs of the diversity sweep (default: all of `nfe`).
        eval_batch_size, max_length: passed to [`evaluate_samples`] (`batch_size`, `max_length`).
        num_resamples (`int`, defaults to 1000): bootstrap resamples of the paired statistics.
        name (`str`, *optional*): the model name of the output files (default: the pipeline folder's name).
        output_dir (`str` or `os.PathLike`, *optional*): where to write `<name>.json`, `<name>.md`, `<name>.png` and
            the scored samples `<name>.samples.jsonl.gz`; nothing is written when `None`.
        command (`str`, *optional*): the command line stored in the results (default: this process's argv).
        progress (`bool`, defaults to `True`): a tqdm bar over the runs.
        device: where to run the pipeline and a named evaluator (default: where the pipeline is; evaluator on CPU).
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        The results dict (see [`write_results`] for the files): `model`, `family`, `protocol`, `evaluator`, settings,
        `diversity_knob`, `runs` (one record per (sampler, NFE, seed[, knob value]) with its metrics, samples/s and
        per-sample NLLs), `aggregates` ([`aggregate`] of the main runs), `wall_seconds`, `command`.
    """
    generation = generate_sweep(
        pipeline_dir_or_pipe,
        nfe=nfe,
        seeds=seeds,
        num_samples=num_samples,
        batch_size=batch_size,
        samplers=samplers,
        diversity_values=diversity_values,
        diversity_samplers=diversity_samplers,
        diversity_nfe=diversity_nfe,
        name=name,
        command=command,
        progress=progress,
        device=device,
    )
    if device is not None and isinstance(evaluator, (str, os.PathLike)):
        evaluator_kwargs.setdefault("device", device)
    return score_sweep(
        generation,
        evaluator=evaluator,
        protocol=protocol,
        eval_batch_size=eval_batch_size,
        max_length=max_length,
        num_resamples=num_resamples,
        output_dir=output_dir,
        progress=progress,
        **evaluator_kwargs,
    )


def diversity_curves(runs: Sequence[dict], knob: str, default: float | None = None) -> dict:
    """GenPPL and entropy (mean ± SE over seeds) per sampler, NFE and knob value, for samplers that were swept.

    The main runs (knob value `None`) join their sampler's curve at `default` (the knob's value in the main runs: T = 1,
    or the config's w) with `"default": true`. Returns `{sampler: {nfe: [{knob: value, "default": bool, "gen_ppl":
    {mean, se, n}, "entropy": {...}}, …]}}`, sorted by knob value.
    """
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(run["sampler"], {}).setdefault(str(run["nfe"]), {}).setdefault(run[knob], []).append(run)
    curves: dict = {}
    for sampler, by_nfe in grouped.items():
        for nfe, by_value in by_nfe.items():
            if len(by_value) < 2 and None in by_value:
                continue  # no sweep for this sampler and NFE
            points = [
                {
                    knob: default if value is None else value,
                    "default": value is None,
                    "gen_ppl": _mean_se([r["gen_ppl"] for r in group]),
                    "entropy": _mean_se([r["entropy"] for r in group]),
                }
                for value, group in by_value.items()
            ]
            curves.setdefault(sampler, {})[nfe] = sorted(
                points, key=lambda p: (p[knob] is not None, p[knob] if p[knob] is not None else 0.0)
            )
    return curves


def gen_ppl_at_entropy(points: Sequence[dict], entropy: float) -> float | None:
    """GenPPL of a swept curve at `entropy`: the curve's monotone cubic fit in log-GenPPL against entropy
    ([`gen_ppl_on_curve`]); `None` outside the swept entropy range (no extrapolation)."""
    usable = [p for p in points if p["entropy"].get("mean") is not None and p["gen_ppl"].get("mean")]
    if not usable:
        return None
    return gen_ppl_on_curve([p["entropy"]["mean"] for p in usable], [p["gen_ppl"]["mean"] for p in usable], entropy)


def _run_samples(runs: Sequence[dict], sampler: str, nfe: str, knob: str, value) -> list[RunSamples]:
    """Per-sample records of one sampler, NFE and knob value (`None`: main runs), by seed."""
    chosen = sorted(
        (r for r in runs if r["sampler"] == sampler and str(r["nfe"]) == nfe and r[knob] == value),
        key=lambda r: r["seed"],
    )
    blocks = []
    for run in chosen:
        per_sample = run["per_sample"]
        entropy = per_sample.get("entropy")  # absent from reports written before per-sample entropies were kept
        blocks.append(RunSamples(per_sample["nll_sum"], per_sample["num_tokens"], entropy, run["entropy"]))
    return blocks


def equal_entropy_comparison(
    by_sampler: dict,
    curves: dict,
    baseline: str = BASELINE,
    runs: Sequence[dict] | None = None,
    knob: str = "temperature",
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> dict[str, dict[str, dict]]:
    """Every other sampler against the baseline's diversity curve at the same NFE, at the sampler's own entropy.

    Returns `{sampler: {nfe: {"entropy", "gen_ppl", "baseline_gen_ppl_at_entropy", "ratio", "ratio_ci", ...}}}`: the
    curve is read with [`gen_ppl_at_entropy`] (`None` where the sampler's entropy lies outside the swept range). With
    `runs` (the run records, which hold per-sample NLLs), `ratio_ci` is the cluster bootstrap interval of
    [`equal_entropy_ratio`], which re-fits the curve on every resample (`clusters`: the resampling unit of sample i,
    default every sample its own; generator 0), with `fraction_outside` and `entropy_resampled`; otherwise `None`.
    """
    out: dict[str, dict[str, dict]] = {}
    for sampler, by_nfe in by_sampler.items():
        if sampler == baseline:
            continue
        for nfe, metrics in by_nfe.items():
            curve = curves.get(baseline, {}).get(nfe)
            entropy, ppl = metrics.get("entropy", {}).get("mean"), metrics.get("gen_ppl", {}).get("mean")
            if not curve or entropy is None or ppl is None:
                continue
            reference = gen_ppl_at_entropy(curve, entropy)
            row = {
                "entropy": entropy,
                "gen_ppl": ppl,
                "baseline_gen_ppl_at_entropy": reference,
                "ratio": None if reference is None else ppl / reference,
                "ratio_ci": None,
            }
            candidate = [] if runs is None else _run_samples(runs, sampler, nfe, knob, None)
            if candidate:
                points = [_run_samples(runs, baseline, nfe, knob, None if p["default"] else p[knob]) for p in curve]
                bootstrap = equal_entropy_ratio(
                    candidate,
                    points,
                    clusters,
                    num_resamples=num_resamples,
                    confidence=confidence,
                    generator=0,
                )
                row.update({key: bootstrap[key] for key in ("ratio_ci", "fraction_outside", "entropy_resampled")})
            out.setdefault(sampler, {})[nfe] = row
    return out


def _fmt(stat: dict | None, digits: int = 2) -> str:
    if not stat or stat.get("mean") is None:
        return "n/a"
    if stat.get("se") is None:
        return f"{stat['mean']:.{digits}f}"
    return f"{stat['mean']:.{digits}f} ± {stat['se']:.{digits}f}"


def entropy_label(results: dict) -> str:
    """What a report's entropy column measures: the protocol's ids, with their tokenizer named."""
    if results["protocol"] == "elf":
        name = "SmolLM2-135M-Instruct" if results["evaluator"] == SMOLLM2_NAME else results["evaluator"]
        return f"per-sample unigram entropy (nats) of the evaluator's token ids (the {name} tokenizer)"
    tokenizer = results.get("generator_tokenizer")
    tokenizer = (
        f"the generating model's own tokenizer: {tokenizer}" if tokenizer else "the generating model's tokenizer"
    )
    return f"per-sample unigram entropy (nats) of the generator's token ids ({tokenizer})"


def interval_label(results: dict) -> str:
    """How a report's intervals were computed: the bootstrap's resampling unit, and why."""
    unit = results.get("resampling_unit") or {"unit": "sample", "why": "", "stratified_by": "seed"}
    why = f" ({unit['why']})" if unit.get("why") else ""
    plural = {"batch": "batches", "sample": "samples"}.get(unit["unit"], unit["unit"])
    return f"95% paired bootstrap CIs resampling whole {plural}{why}, stratified by {unit['stratified_by']}"


def _repetition_lines(results: dict, samplers: Sequence[str]) -> list[str]:
    """The repetition table: word Rep-4 beside its subword twins on generator ids (they see loops inside words)."""
    by_sampler = results["aggregates"]["by_sampler"]
    columns = ("rep_4", "token_rep_4", "token_distinct_4", "longest_repeat")
    lines = [
        "",
        "## Repetition (mean ± SE over seeds)",
        "",
        "Rep-4: fraction of a sample's 4-grams that repeat an earlier one, on words and on generator token ids; "
        "token distinct-4: unique / all id 4-grams, pooled; longest run: the longest stretch (in generator tokens) "
        "repeating one unit of 1-4 tokens back to back, averaged over samples.",
        "",
    ]
    if not any(
        by_sampler.get(s, {}).get(str(n), {}).get("token_rep_4", {}).get("mean") is not None
        for s in samplers
        for n in results["nfe"]
    ):
        note = "" if results.get("samples_file") else " Its samples are not committed, so they cannot be added."
        return lines + [f"Word Rep-4 only: this report's runs were scored before the subword measures existed.{note}"]
    lines += [
        "| sampler | NFE | word Rep-4 | token Rep-4 | token distinct-4 | longest run |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for sampler in samplers:
        for nfe in results["nfe"]:
            metrics = by_sampler.get(sampler, {}).get(str(nfe), {})
            if metrics:
                cells = [_fmt(metrics.get(key), 3 if key != "longest_repeat" else 1) for key in columns]
                lines.append(f"| {sampler} | {nfe} | " + " | ".join(cells) + " |")
    return lines


def format_markdown(results: dict) -> str:
    """The results as Markdown: NFE × sampler table (GenPPL and entropy side by side), paired comparison, curves."""
    samplers = list(results["samplers"])
    by_sampler = results["aggregates"]["by_sampler"]
    knob = results["diversity_knob"]
    evaluator = results.get("evaluator_description") or results["evaluator"]
    lines = [
        f"# Benchmark: {results['model']} ({results['pipeline_class']})",
        "",
        f"Evaluator: {evaluator}; protocol `{results['protocol']}`. {len(results['seeds'])} seeds "
        f"{results['seeds']} × {results['num_samples']} samples, batch size {results['batch_size']}; every "
        "official/untied pair shares its initial latent and random stream. Mean ± standard error over seeds. "
        f"Entropy: {entropy_label(results)}."
        + (" The generation's diversity runs were not scored (`--main-only`)." if results.get("main_only") else ""),
        "",
        "| NFE | " + " | ".join(f"{s} GenPPL | {s} entropy" for s in samplers) + " |",
        "|---:|" + "---:|---:|" * len(samplers),
    ]
    for nfe in results["nfe"]:
        cells = []
        for sampler in samplers:
            metrics = by_sampler.get(sampler, {}).get(str(nfe), {})
            cells += [_fmt(metrics.get("gen_ppl")), _fmt(metrics.get("entropy"), 3)]
        lines.append(f"| {nfe} | " + " | ".join(cells) + " |")
    paired = results["aggregates"]["paired"]
    if paired:
        lines += [
            "",
            f"## Paired comparison against `{results['baseline']}` (pairs pooled over seeds)",
            "",
            f"{interval_label(results)}.",
            "",
            "| sampler | NFE | pairs | GenPPL ratio [CI] | mean ΔNLL/token [CI] | worse in [CI] | retained throughput |",
            "|---|---:|---:|---|---|---|---:|",
        ]
        for sampler, by_nfe in paired.items():
            for nfe, p in by_nfe.items():
                low, high = p["gen_ppl_ratio_ci"]
                d_low, d_high = p["mean_delta_ci"]
                w_low, w_high = p["fraction_b_worse_ci"]
                lines.append(
                    f"| {sampler} | {nfe} | {p['num_pairs']} | {p['gen_ppl_ratio']:.3f} [{low:.3f}, {high:.3f}] | "
                    f"{p['mean_delta']:+.4f} [{d_low:+.4f}, {d_high:+.4f}] | {p['fraction_b_worse']:.1%} "
                    f"[{w_low:.1%}, {w_high:.1%}] | {_fmt(p['retained_throughput'], 3)} |"
                )
    lines += _repetition_lines(results, samplers)
    lines += ["", "## Throughput (samples/s of sampling, mean ± SE over seeds)", ""]
    lines += ["| NFE | " + " | ".join(samplers) + " |", "|---:|" + "---:|" * len(samplers)]
    for nfe in results["nfe"]:
        cells = [_fmt(by_sampler.get(s, {}).get(str(nfe), {}).get("samples_per_second")) for s in samplers]
        lines.append(f"| {nfe} | " + " | ".join(cells) + " |")
    if results.get("coefficients"):
        lines += ["", "## Coefficients the untied samplers ran with", ""]
        if any("alpha_scale" in spec for spec in results["samplers"].values()):
            lines += ["α is an average's weight, in (0, 1]: a scaled α above 1 runs at 1.", ""]
        lines += ["| sampler | NFE | η_R | η_T | η_O | α |", "|---|---:|---:|---:|---:|---:|"]
        for sampler, by_nfe in results["coefficients"].items():
            for nfe, c in by_nfe.items():
                values = " | ".join(f"{c[name]:.4g}" for name in COEFFICIENT_NAMES)
                lines.append(f"| {sampler} | {nfe} | {values} |")
    if results["diversity_curves"]:
        lines += [
            "",
            f"## GenPPL–entropy curves ({knob} sweep; `(default)` marks the main runs)",
            "",
            f"| sampler | NFE | {knob} | GenPPL | entropy |",
            "|---|---:|---:|---|---|",
        ]
        for sampler, by_nfe in results["diversity_curves"].items():
            for nfe, points in by_nfe.items():
                for point in points:
                    value = "n/a" if point[knob] is None else f"{point[knob]:g}"
                    value += " (default)" if point["default"] else ""
                    lines.append(
                        f"| {sampler} | {nfe} | {value} | {_fmt(point['gen_ppl'])} | {_fmt(point['entropy'], 3)} |"
                    )
    if results.get("equal_entropy"):
        rows = [row for by_nfe in results["equal_entropy"].values() for row in by_nfe.values()]
        held = any(row.get("entropy_resampled") is False for row in rows)
        lines += [
            "",
            f"## At equal entropy: `{results['baseline']}`'s curve read at each sampler's entropy",
            "",
            f"Curve fit: {results.get('equal_entropy_fit', FIT_DESCRIPTION)}; `outside` where the sampler's entropy "
            f"lies outside the swept range. {interval_label(results)}, the same resample applied to the sampler and "
            "to every point of the curve, which is re-fitted on each; no interval when more than 2.5% of the "
            "resamples fall outside the curve's range (one tail unknown)."
            + (
                " This report's runs hold no per-sample entropies (scored before they were kept), so the entropies "
                "are held at their measured values and only GenPPL is resampled."
                if held
                else ""
            ),
            "",
            f"| sampler | NFE | entropy | GenPPL | {results['baseline']} GenPPL at that entropy | ratio [CI] |",
            "|---|---:|---:|---:|---:|---|",
        ]
        for sampler, by_nfe in results["equal_entropy"].items():
            for nfe, row in by_nfe.items():
                reference, ratio, interval = row["baseline_gen_ppl_at_entropy"], row["ratio"], row.get("ratio_ci")
                ratio_text = "outside" if ratio is None else f"{ratio:.3f}"
                if ratio is not None:
                    if interval:
                        ratio_text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
                    elif row.get("fraction_outside") is not None:
                        ratio_text += f" (no CI: {row['fraction_outside']:.0%} of resamples outside)"
                lines.append(
                    f"| {sampler} | {nfe} | {row['entropy']:.3f} | {row['gen_ppl']:.2f} | "
                    f"{'outside' if reference is None else f'{reference:.2f}'} | {ratio_text} |"
                )
    commands = [results["command"]]
    if "scoring_command" in results:  # sampled on one machine, scored on another
        commands.append(results["scoring_command"])
        where = (
            f"Sampled in {results['sampling_seconds']:.1f} s on {results['device']} with torch {results['torch']}, then "
            f"scored in {results['scoring_seconds']:.1f} s on {results['scoring_device']}. Commands:"
        )
    else:
        where = (
            f"Wall time {results['wall_seconds']:.1f} s on {results['device']} with torch {results['torch']}. Command:"
        )
    lines += ["", where, "", "```", *commands, "```", ""]
    return "\n".join(lines)


def write_results(
    results: dict, output_dir: str | os.PathLike, samples: Sequence[Sample] | None = None, stem: str | None = None
) -> dict[str, Path]:
    """Writes `<model>.json` (everything), `<model>.md` ([`format_markdown`]), `<model>.png` ([`plot_benchmark`]) and,
    given the scored `samples`, `<model>.samples.jsonl.gz` beside them (what the tables measured, re-scorable with
    `untied-sc evaluate`). `stem` replaces `<model>` in the names (a report re-rendered under its own file name)."""
    from .plots import plot_benchmark

    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = stem or results["model"]
    paths = {"json": folder / f"{stem}.json", "markdown": folder / f"{stem}.md", "plot": folder / f"{stem}.png"}
    if samples is not None:
        paths["samples"] = write_samples(folder / f"{stem}.samples.jsonl.gz", samples)
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n")
    paths["markdown"].write_text(format_markdown(results))
    plot_benchmark(results, paths["plot"])
    return paths


# ---- `untied-sc benchmark` ----------------------------------------------------------------------------------------


# Options that define the sweep (what is sampled): a generation file fixes them, so they are refused beside one.
SWEEP_DEFAULTS = {
    "nfe": list(DEFAULT_NFE),
    "seeds": list(DEFAULT_SEEDS),
    "num_samples": 256,
    "batch_size": 32,
    "experiment": "main",
    "temperatures": None,
    "diversity_nfe": None,
    "coefficients": None,
}


# Options of the scoring half alone: a --generate-only command line leaves them out.
SCORING_OPTIONS = ("evaluator", "protocol", "eval_batch_size", "max_length", "num_resamples", "dtype", "cache_dir")


def add_benchmark_arguments(parser):
    """Adds the `benchmark` arguments to an `argparse` parser and returns it."""
    from .cli import DTYPES
    from .evaluator import SMOLLM2_NAME

    parser.add_argument(
        "pipeline", nargs="?", help="Pipeline folder (or Hub repo id), calibrated at every --nfe (not with --from)."
    )
    parser.add_argument("--nfe", type=int, nargs="+", help="NFEs (default 8 16 32 64).")
    parser.add_argument("--seeds", type=int, nargs="+", help="Seeds (default 0 1 2).")
    parser.add_argument("--num-samples", type=int, help="Samples per (sampler, NFE, seed) (default 256).")
    parser.add_argument("--batch-size", type=int, help="Samples per pipeline call, part of the seeding (default 32).")
    parser.add_argument(
        "--evaluator",
        default=SMOLLM2_NAME,
        help=f"'{SMOLLM2_NAME}' (offline), a Hub id such as gpt2-large, or a folder.",
    )
    parser.add_argument(
        "--protocol", choices=["elf", "langflow"], help="GenPPL protocol (default: the pipeline's family)."
    )
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        help="Diversity sweep of the official sampler: LangFlow x̂ temperatures, or ELF decode temperatures (0: argmax).",
    )
    parser.add_argument("--diversity-nfe", type=int, nargs="+", help="NFEs of the diversity sweep (default: --nfe).")
    parser.add_argument(
        "--experiment",
        choices=["main", "placement", "components", "sensitivity"],
        help="Sampler set: official vs untied (main, the default), or one of the paper's controlled experiments.",
    )
    parser.add_argument(
        "--coefficients",
        help="Paper coefficient preset for every untied sampler (e.g. langflow-lm1b) instead of the statistics' own.",
    )
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--generate-only",
        action="store_true",
        help="Only sample: write <model>.generation.json and .generation-samples.jsonl.gz, to score elsewhere with "
        "--from.",
    )
    parser.add_argument(
        "--main-only", action="store_true", help="With --from: score the main runs only, not the diversity sweep."
    )
    split.add_argument(
        "--from",
        dest="from_generation",
        metavar="GENERATION_JSON",
        help="Score a --generate-only result instead of sampling (its sweep options are fixed by the file).",
    )
    parser.add_argument("--output-dir", default="benchmarks/results", help="Where <model>.json/.md/.png go.")
    parser.add_argument("--name", help="Model name of the output files (default: the pipeline folder's name).")
    parser.add_argument("--eval-batch-size", type=int, default=8, help="Samples per evaluator forward pass.")
    parser.add_argument("--max-length", type=int, help="Evaluator truncation length (default: its context).")
    parser.add_argument("--num-resamples", type=int, default=1000, help="Bootstrap resamples.")
    parser.add_argument("--device", help="Device of the pipeline and the evaluator (default: cpu).")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="Evaluator dtype.")
    parser.add_argument("--cache-dir", help="Evaluator cache folder (default ~/.cache/untied-sc/evaluators).")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def register_benchmark_command(commands):
    """Registers `benchmark` on an `add_subparsers()` object and returns its parser."""
    parser = commands.add_parser(
        "benchmark", help="Matched official vs untied sweep over NFEs and seeds: GenPPL, entropy, paired CIs, plot."
    )
    add_benchmark_arguments(parser)
    parser.set_defaults(handler=benchmark_command)
    return parser


def command_line(args) -> str:
    """The fully explicit `untied-sc benchmark` command of parsed `args` (every option spelled out, defaults included)."""
    words = ["untied-sc", "benchmark"] + ([args.pipeline] if args.pipeline else [])
    skipped = ("pipeline", "command", "handler") + (SCORING_OPTIONS if args.generate_only else ())
    for name, value in vars(args).items():
        if name in skipped or value is None or value is False:
            continue
        option = "--from" if name == "from_generation" else "--" + name.replace("_", "-")
        if value is True:
            words.append(option)
        elif isinstance(value, list):
            words += [option, *(f"{v:g}" if isinstance(v, float) else str(v) for v in value)]
        else:
            words += [option, str(value)]
    return shlex.join(words)


def _experiment_name(pipeline: str, experiment: str, preset: str | None = None) -> str | None:
    """`<model>-<experiment>[-<preset>]` for the controlled experiments and presets, so that they do not overwrite the
    main results."""
    suffix = ("" if experiment == "main" else f"-{experiment}") + (f"-{preset}" if preset else "")
    return f"{Path(str(pipeline).rstrip('/')).name}{suffix}" if suffix else None


def benchmark_command(args) -> dict:
    """Handler of `untied-sc benchmark`: [`run_sweep`] (or one half of it) and the Markdown table."""
    from .cli import DTYPES

    evaluator_kwargs = {"cache_dir": args.cache_dir, "dtype": DTYPES[args.dtype]}
    if args.from_generation:
        given = [f"--{k.replace('_', '-')}" for k in SWEEP_DEFAULTS if getattr(args, k) is not None]
        if args.pipeline or given:
            extra = ([args.pipeline] if args.pipeline else []) + given
            raise SystemExit(
                f"--from scores the sweep stored in {args.from_generation}; drop {' '.join(extra)} (the pipeline and "
                "the sweep options were fixed when it was generated)."
            )
        generation = read_generation(args.from_generation)
        if args.name:
            generation["model"] = args.name
        if args.device:
            evaluator_kwargs["device"] = args.device
        results = score_sweep(
            generation,
            evaluator=args.evaluator,
            protocol=args.protocol,
            eval_batch_size=args.eval_batch_size,
            max_length=args.max_length,
            num_resamples=args.num_resamples,
            output_dir=args.output_dir,
            command=command_line(args),
            progress=not args.no_progress,
            main_only=args.main_only,
            **evaluator_kwargs,
        )
        print(format_markdown(results))
        print("Wrote " + ", ".join(results["files"].values()))
        return results
    if not args.pipeline:
        raise SystemExit("Name a pipeline folder (or Hub id) to benchmark, or score a generation file with --from.")
    if args.main_only:
        raise SystemExit(
            "--main-only scores part of a generation file: use it with --from (or leave --temperatures out)."
        )
    for key, default in SWEEP_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    command = command_line(args)
    sweep = {
        "nfe": args.nfe,
        "seeds": args.seeds,
        "num_samples": args.num_samples,
        "batch_size": args.batch_size,
        "samplers": with_preset(experiment_samplers(args.experiment), args.coefficients),
        "diversity_values": args.temperatures,
        "diversity_nfe": args.diversity_nfe,
        "name": args.name or _experiment_name(args.pipeline, args.experiment, args.coefficients),
        "command": command,
        "progress": not args.no_progress,
        "device": args.device,
    }
    if args.generate_only:
        generation = generate_sweep(args.pipeline, **sweep)
        paths = write_generation(generation, args.output_dir)
        count = sum(len(run["samples"]) for run in generation["runs"])
        print(
            f"Sampled {count} samples in {len(generation['runs'])} runs in {generation['seconds']:.1f} s on "
            f"{generation['device']}. Score them with: untied-sc benchmark --from {paths['generation']}"
        )
        return generation
    results = run_sweep(
        args.pipeline,
        evaluator=args.evaluator,
        protocol=args.protocol,
        eval_batch_size=args.eval_batch_size,
        max_length=args.max_length,
        num_resamples=args.num_resamples,
        output_dir=args.output_dir,
        **sweep,
        **evaluator_kwargs,
    )
    print(format_markdown(results))
    print("Wrote " + ", ".join(results["files"].values()))
    return results
