"""`--experiment baselines` split across machines: sample on a GPU without the evaluator, then choose the
knobs and score where the evaluator is.

The one-machine run chooses each comparison sampler's knob on the tuning bank, then samples the benchmark at the
chosen knob (`experiments/baselines.py`). A machine without the evaluator cannot choose, so `--generate-only` samples
everything a choice could need ([`generate_baseline_candidates`]):

- the tuning bank of the official sampler and of every grid value of every method, at every NFE;
- the benchmark runs of every grid value (a method's neutral value is the official sampler bit for bit, so the
  official runs serve for it).

`--from` then scores the bank, chooses with the one-machine run's rule ([`choose_knob`]), keeps the benchmark runs of
the chosen values under each method's name and scores those alone ([`select_chosen_runs`]). The report is the
one-machine run's on the same samples (tested); the split costs the sampling of the grid values that were not chosen,
and no extra scoring of benchmark runs. One visible difference: a method left at its neutral value reuses the
official runs' timings too, so its retained throughput reads exactly 1.
"""

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from ..defaults import TUNE_SEED
from ..evaluation.sampling import KNOBS_KEY
from ..schedulers.comparison_names import COMPARISON_METHODS
from ..seeds import check_seed
from .definitions import BASELINE, normalise_samplers
from .generation_files import CANDIDATES_KEY
from .score_reuse import lend_or_score, samples_fingerprint


BANK_PREFIX = "tuning bank: "


def knob_label(knobs: Mapping[str, float]) -> str:
    """`"momentum_beta=0.9"`: a grid value as it appears in run names."""
    return ", ".join(f"{key}={float(value):g}" for key, value in knobs.items())


def _knob_key(knobs: Mapping[str, float]) -> tuple:
    return tuple(sorted((key, round(float(value), 12)) for key, value in knobs.items()))


def candidate_samplers(samplers: Mapping[str, Mapping], nfe: Sequence[int]) -> tuple[dict[str, dict], dict[str, dict]]:
    """
    The benchmark's sampler set with each comparison sampler replaced by one sampler per grid value.

    Returns:
        `(expanded, variants)`: the specs to sample (official, untied and `"<name> (<knobs>)"` per grid value, the
        knobs at every NFE), and per variant its `sampler` name, `method` and `knobs`.
    """
    from ..calibration.baseline_knobs import KNOB_GRIDS

    expanded, variants = {}, {}
    for name, spec in normalise_samplers(samplers).items():
        method = spec["scheduler"]
        if method not in COMPARISON_METHODS:
            expanded[name] = dict(spec)
            continue
        for knobs in KNOB_GRIDS[method].candidates():
            variant = f"{name} ({knob_label(knobs)})"
            expanded[variant] = {**spec, KNOBS_KEY: {str(n): dict(knobs) for n in nfe}}
            variants[variant] = {"sampler": name, "method": method, "knobs": dict(knobs)}
    return expanded, variants


def bank_runs(samplers: Mapping[str, Mapping]) -> dict[str, dict]:
    """The tuning bank's runs per NFE: the official sampler and every grid value of every comparison method, by run
    name (`"tuning bank: official"`, `"tuning bank: <method> (<knobs>)"`), each with its `method` and `knobs`."""
    from ..calibration.baseline_knobs import KNOB_GRIDS

    methods = dict.fromkeys(spec["scheduler"] for spec in normalise_samplers(samplers).values())
    runs = {BANK_PREFIX + BASELINE: {"method": BASELINE, "knobs": {}}}
    for method in (m for m in methods if m in COMPARISON_METHODS):
        for knobs in KNOB_GRIDS[method].candidates():
            runs[f"{BANK_PREFIX}{method} ({knob_label(knobs)})"] = {"method": method, "knobs": dict(knobs)}
    return runs


def generate_baseline_candidates(
    pipe,
    samplers: Mapping[str, Mapping],
    nfe: Sequence[int],
    seeds: Sequence[int],
    num_samples: int,
    batch_size: int,
    tune_seed: int = TUNE_SEED,
    tune_num_samples: int = 64,
    max_entropy_drop: float = 0.05,
    confidence: float = 0.95,
    progress: bool = True,
    state=None,
    source: str = "PIPELINE_DIR",
    evaluator=None,
    protocol: str | None = None,
    eval_batch_size: int = 8,
    evaluator_name: str | None = None,
    **sweep_kwargs,
) -> dict:
    """
    `--experiment baselines --generate-only`: every run a knob choice could need, unscored (module docstring).

    The checks of the one-machine run come first (seeds, ACE statistics, calibrated NFEs; nothing is sampled when one
    fails). With a `state` of several processes, every run's batches are split across the processes, as in
    [`generate_sweep`], with the same samples as one process.

    With an `evaluator` (`--tune-here`: a machine that has it, but samples in parts that others merge), the bank is
    sampled first and scored here, the knobs are chosen with [`choose_from_bank`], and only the benchmark runs of the
    chosen values are sampled: the file merges and scores with `--from` as any other part (`--from` chooses again
    from the same bank, and says so if it chose otherwise), at a fraction of the sampling.

    Args:
        pipe: the loaded pipeline.
        samplers (`Mapping[str, Mapping]`): the `baselines` sampler set.
        nfe, seeds, num_samples, batch_size: the benchmark sweep's.
        tune_seed, tune_num_samples: the tuning bank (seed in the tuning seed space, size).
        max_entropy_drop, confidence: the choice's guard and keep rule, recorded for the scoring half.
        progress (`bool`): progress bars.
        state: a [`untied_sc.distributed.process_state`] (several processes), or `None`.
        source (`str`): the pipeline as the user named it (for the commands errors suggest).
        evaluator (*optional*): an evaluator name or a loaded `(model, tokenizer)` pair: choose here, sample the chosen.
        protocol, eval_batch_size: the bank's scoring with `evaluator` (protocol default: the model's family).
        evaluator_name (`str`, *optional*): how the record names a loaded `evaluator` (default: its model's name).
        **sweep_kwargs: `name`, `command`, `device`, `diversity_values`, `diversity_nfe` for [`generate_sweep`].

    Returns:
        A [`generate_sweep`] result whose runs hold the benchmark runs of every grid value (with an `evaluator`: of
        the chosen values) and the tuning bank's runs, with `baseline_candidates`: the sampler set, the variants, the
        bank's settings and runs, and how the untied coefficients were chosen; with an `evaluator`,
        `tuned_when_sampled` too: the evaluator, the protocol and the runs sampled per NFE.
    """
    from ..distributed import main_process_progress
    from ..evaluation.sampling import build_scheduler, diversity_knob, family_of, generate, run_samples
    from .baselines import ace_record, untied_tuning_record
    from .sweep import check_ace_statistics, check_runs, generate_sweep, place_pipeline, refuse_leaked_seeds

    samplers = normalise_samplers(samplers)
    tune_seed = check_seed(tune_seed, "--tune-seed")
    if tune_num_samples < 2:
        raise ValueError(f"The tuning bank needs at least 2 samples, got {tune_num_samples}.")
    check_ace_statistics(pipe, samplers, source)
    refuse_leaked_seeds(seeds, pipe)
    expanded, variants = candidate_samplers(samplers, nfe)
    # before the bank: the diversity runs are official's, so the main runs hold every statistics need
    check_runs(pipe, expanded, [(name, n, seed, None) for n in nfe for seed in seeds for name in expanded], source)
    candidates = {
        "samplers": samplers,
        "variants": variants,
        "bank": {
            "seed": tune_seed,
            "seed_space": "tuning",
            "num_samples": tune_num_samples,
            "batch_size": batch_size,
            "max_entropy_drop": max_entropy_drop,
            "confidence": confidence,
            "runs": bank_runs(samplers),
        },
        "untied": {
            name: untied_tuning_record(pipe, nfe) for name, spec in samplers.items() if spec["scheduler"] == "untied"
        },
        "ace": ace_record(pipe),
    }
    place_pipeline(pipe, state, sweep_kwargs.get("device"))  # the bank is sampled before generate_sweep places it
    knob = diversity_knob(family_of(pipe))
    bank = candidates["bank"]["runs"]
    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    plan = [(name, n) for n in nfe for name in bank]
    began = time.perf_counter()
    bank_records = []
    try:
        for name, n in main_process_progress(plan, state, progress, desc="sampling the tuning bank"):
            spec = {"scheduler": bank[name]["method"], **bank[name]["knobs"]}
            pipe.scheduler = build_scheduler(pipe, spec, original_scheduler.config, n)
            texts, ids, seconds = generate(
                pipe, n, tune_seed, tune_num_samples, batch_size, state=state, seed_space="tuning"
            )
            samples = run_samples(texts, ids, tune_seed, batch_size, name, n, **{knob: None})
            bank_records.append(
                {
                    "sampler": name,
                    "nfe": n,
                    "seed": tune_seed,
                    knob: None,
                    "num_samples": tune_num_samples,
                    "seconds": seconds,
                    "samples": samples,
                }
            )
    finally:
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)
    bank_seconds = time.perf_counter() - began
    only, tuned_here = None, None
    if evaluator is not None:
        from ..calibration.tune import scoring_evaluator

        loaded, name = scoring_evaluator(evaluator)
        evaluator_name = evaluator_name or name
        bank_only = {"family": family_of(pipe), "nfe": list(nfe), "runs": bank_records, CANDIDATES_KEY: candidates}
        tuned, _ = choose_from_bank(bank_only, loaded, protocol, eval_batch_size, progress)
        only = {n: {BASELINE, *(_chosen_source(name, spec, n, variants) for name, spec in tuned.items())} for n in nfe}
        tuned_here = {
            "evaluator": evaluator_name,
            "protocol": protocol or family_of(pipe),
            "sampled": {str(n): [name for name in expanded if name in only[n]] for n in nfe},
        }
    generation = generate_sweep(
        pipe,
        nfe=nfe,
        seeds=seeds,
        num_samples=num_samples,
        batch_size=batch_size,
        samplers=expanded,
        progress=progress,
        state=state,
        only=only,
        **sweep_kwargs,
    )
    generation["runs"] += bank_records
    generation["seconds"] += bank_seconds
    generation[CANDIDATES_KEY] = candidates
    if tuned_here is not None:
        generation["tuned_when_sampled"] = tuned_here
    return generation


def _chosen_source(name: str, spec: Mapping, n: int, variants: Mapping[str, Mapping]) -> str:
    """The run name whose benchmark runs stand for sampler `name` (tuned `spec`) at NFE `n`: a comparison sampler's
    chosen grid value, or official where it chose its neutral value (bit for bit the official sampler); itself for
    official and untied."""
    from ..calibration.baseline_knobs import KNOB_GRIDS

    if spec["scheduler"] not in COMPARISON_METHODS:
        return name
    chosen = _knob_key(spec[KNOBS_KEY][str(n)])
    if chosen == _knob_key(KNOB_GRIDS[spec["scheduler"]].neutral_knobs()):
        return BASELINE
    return next(v for v, entry in variants.items() if entry["sampler"] == name and _knob_key(entry["knobs"]) == chosen)


def choose_from_bank(
    generation: Mapping,
    evaluator,
    protocol: str | None = None,
    eval_batch_size: int = 8,
    progress: bool = True,
    reusable=None,
) -> tuple[dict[str, dict], dict]:
    """
    Scores the tuning bank stored in a [`generate_baseline_candidates`] result and chooses every comparison
    sampler's knob at every NFE with the one-machine run's rule ([`choose_knob`]).

    Args:
        generation (`Mapping`): the result (or its [`read_generation`] reading).
        evaluator: a loaded `(model, tokenizer)` pair.
        protocol (`str`, *optional*): the scoring protocol (default: the model's family).
        eval_batch_size (`int`): the evaluator's batch size.
        progress (`bool`): a progress bar over the bank's runs.
        reusable (`ReusableScores`, *optional*): an earlier report's scores ([`read_report_scores`]); bank runs it
            scored take its scores, the first of them scored again as a check.

    Returns:
        `(samplers, record)` as [`tune_baselines`] returns them, the record with two more keys: `bank_scores`, every
        bank run's scores under its [`samples_fingerprint`] (what a later `--reuse-scores` lends), and, when some were
        lent, `bank_scores_reused`.
    """
    from tqdm.auto import tqdm

    from ..calibration.baseline_knobs import KNOB_GRIDS, choose_knob
    from ..calibration.tune import Candidate, score_bank_samples
    from ..evaluation.sampling import resampling_clusters
    from .baselines import apply_knob_choices

    candidates = generation[CANDIDATES_KEY]
    settings = candidates["bank"]
    family = generation["family"]
    protocol = protocol or family
    runs = {(run["sampler"], run["nfe"]): run for run in generation["runs"] if run["sampler"] in settings["runs"]}
    scores, bank_scores, lent = {}, {}, None
    for key in tqdm(
        sorted(runs, key=lambda key: (key[1], key[0])), desc="scoring the tuning bank", disable=not progress
    ):
        name, n = key
        entry = settings["runs"][name]
        fingerprint = samples_fingerprint(runs[key]["samples"])
        result, lent = lend_or_score(
            reusable.bank.get(fingerprint) if reusable is not None else None,
            lent,
            lambda key=key: score_bank_samples(runs[key]["samples"], evaluator, protocol, eval_batch_size),
            lambda scored: scored[2],  # the per-sample NLLs
            reusable.path if reusable is not None else None,
            f"{name} at NFE {n}",
        )
        scores[entry["method"], _knob_key(entry["knobs"]), n] = result
        bank_scores[fingerprint] = list(result)
    clusters = resampling_clusters(family, settings["num_samples"], settings["batch_size"])
    methods = dict.fromkeys(spec["scheduler"] for spec in candidates["samplers"].values())
    choices = []
    for n in generation["nfe"]:
        ppl, entropy, nlls = _stored(scores, BASELINE, {}, n)
        official = Candidate({}, ppl, entropy, True, list(nlls))
        for method in (m for m in methods if m in COMPARISON_METHODS):
            choices.append(
                choose_knob(
                    method,
                    n,
                    KNOB_GRIDS[method],
                    official,
                    lambda knobs, n=n, method=method: _stored(scores, method, knobs, n),
                    settings["max_entropy_drop"],
                    settings["confidence"],
                    clusters,
                )
            )
    bank = {key: settings[key] for key in ("seed", "seed_space", "num_samples", "batch_size")}
    bank.update(
        evaluator=None,  # the caller names it
        protocol=protocol,
        max_entropy_drop=settings["max_entropy_drop"],
        confidence=settings["confidence"],
        ace=candidates.get("ace"),  # absent from files written before it was recorded
    )
    samplers, record = apply_knob_choices(
        candidates["samplers"], choices, generation["nfe"], bank, candidates["untied"]
    )
    record["bank_scores"] = bank_scores
    if lent is not None:
        record["bank_scores_reused"] = lent
    return samplers, record


def _stored(scores: Mapping, method: str, knobs: Mapping, n: int):
    try:
        return scores[method, _knob_key(knobs), n]
    except KeyError:
        raise ValueError(
            f"The generation file holds no tuning-bank run of {method} ({knob_label(knobs) or 'no knobs'}) at NFE "
            f"{n}: it is incomplete or was edited. Generate it again."
        ) from None


def select_chosen_runs(generation: Mapping, samplers: Mapping[str, Mapping], record: Mapping) -> dict:
    """
    The generation as the one-machine run would have sampled it: each comparison sampler's benchmark runs at its
    chosen knob (the official runs where it chose the neutral value), under its own name; the untried grid values
    and the bank left out; the tuned `samplers` and the tuning `record` in place of the candidates.
    """
    candidates = generation[CANDIDATES_KEY]
    knob = generation["diversity_knob"]
    by_run = {(run["sampler"], run["nfe"], run["seed"], run[knob]): run for run in generation["runs"]}
    runs = []
    for n in generation["nfe"]:
        for seed in generation["seeds"]:
            for name, spec in samplers.items():
                source = _chosen_source(name, spec, n, candidates["variants"])
                run = by_run.get((source, n, seed, None))
                if run is None:
                    raise ValueError(_missing_chosen_run(generation, source, n))
                samples = [sample if source == name else replace(sample, sampler=name) for sample in run["samples"]]
                runs.append({**run, "sampler": name, "samples": samples})
    runs += [run for run in generation["runs"] if run[knob] is not None]  # the official diversity curve, if any
    coefficients = {name: value for name, value in (generation.get("coefficients") or {}).items() if name in samplers}
    selected = {key: value for key, value in generation.items() if key != CANDIDATES_KEY}
    selected.update(samplers=dict(samplers), runs=runs, coefficients=coefficients, knob_tuning=dict(record))
    return selected


def _missing_chosen_run(generation: Mapping, source: str, n: int) -> str:
    message = f"The generation holds no benchmark run of {source!r} at NFE {n}, which the report needs."
    tuned = generation.get("tuned_when_sampled")
    if tuned and source not in tuned["sampled"].get(str(n), [source]):
        return (
            f"{message} Its NFE {n} was sampled with --tune-here, which chose with {tuned['evaluator']} under the "
            f"{tuned['protocol']} protocol and sampled only {', '.join(tuned['sampled'][str(n)])}: score it with that "
            "evaluator and protocol, or sample that NFE again without --tune-here (every grid value)."
        )
    return f"{message} The file is incomplete or was edited: generate it again."


def score_baseline_candidates(
    generation: Mapping,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    eval_batch_size: int = 8,
    progress: bool = True,
    evaluator_kwargs: Mapping | None = None,
    **score_kwargs,
) -> dict:
    """
    `--from` on a [`generate_baseline_candidates`] result: [`choose_from_bank`], [`select_chosen_runs`], then
    [`score_sweep`] with the same evaluator (loaded once).

    Args:
        generation (`Mapping`): the result (or its [`read_generation`] reading).
        evaluator: an evaluator name or a loaded `(model, tokenizer)` pair.
        protocol, eval_batch_size, progress: as in [`score_sweep`].
        evaluator_kwargs (`Mapping`, *optional*): `cache_dir`, `device`, `dtype` for [`load_evaluator`].
        **score_kwargs: the other [`score_sweep`] arguments (`output_dir`, `num_resamples`, `command`, ...).
    """
    from ..calibration.tune import scoring_evaluator
    from ..evaluation.evaluator import describe_evaluator
    from .score_reuse import reusable_scores
    from .sweep import score_sweep

    loaded, name = scoring_evaluator(evaluator, **dict(evaluator_kwargs or {}))
    reusable = score_kwargs.get("reuse_scores")
    if reusable is not None:  # read and refused before the bank is scored, not after
        description = describe_evaluator(name, next(loaded[0].parameters()).dtype)
        reusable = reusable_scores(reusable, name, description, protocol or generation["family"])
        score_kwargs["reuse_scores"] = reusable
    samplers, record = choose_from_bank(generation, loaded, protocol, eval_batch_size, progress, reusable)
    record["evaluator"] = name
    # The bank's scores go beside the tuning record, which stays the one-machine run's.
    bank = {key: record.pop(key) for key in ("bank_scores", "bank_scores_reused") if key in record}
    selected = {**select_chosen_runs(generation, samplers, record), **bank}
    return score_sweep(
        selected,
        evaluator=loaded,
        evaluator_name=name,
        protocol=protocol,
        eval_batch_size=eval_batch_size,
        progress=progress,
        **score_kwargs,
    )
