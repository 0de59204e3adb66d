"""`--experiment baselines` split across steps: tune and sample where the evaluator is, score from the run store.

Every comparison sampler is tuned by the search of `calibration/search.py`, whose candidates depend on the scores of
the ones before: the tuning bank cannot be sampled ahead of the scoring. `--generate-only --tune-here` therefore tunes
on the sampling machine, with the evaluator ([`generate_baseline_candidates`]): it stores every bank run the search
sampled (official's curve and each candidate, with its settings), then samples the benchmark runs of each method at
its chosen knobs (a method left at its neutral value is the official sampler bit for bit: official's runs stand for
it). `benchmark --store DIR` scores the stored bank and replays the search on it ([`choose_from_bank`]: the choice is a function of
the bank's scores, so it is the same one unless another evaluator or protocol scores it, which the record shows),
keeps the runs of the chosen values under each method's name ([`select_chosen_runs`]) and scores those. One visible
difference from the one-machine run: a method left at its neutral value reuses the official runs' timings too, so
its retained throughput reads exactly 1.
"""

import time
from collections.abc import Callable, Mapping
from dataclasses import replace

from tqdm.auto import tqdm

from untied_sc.families import default_protocol
from untied_sc.generation import SamplerSpec, diversity_knob, family_of, resampling_clusters, run_samples
from untied_sc.schedulers import COMPARISON_METHODS
from untied_sc.seeds import check_seed

from ..evaluation.evaluator import describe_evaluator
from ..runs.store import StoreScoring, open_store, samples_fingerprint
from ..tuning.baseline_knobs import is_neutral, search_methods
from ..tuning.search import BankRun
from ..tuning.tune import run_key, score_bank_samples, scoring_evaluator
from .baselines import ace_record, apply_knob_choices, tune_baselines, tuning_bank, untied_tuning_record
from .definitions import BASELINE, normalise_samplers
from .generation_record import BankSample, BaselineCandidates, Generation
from .sweep import generate_sweep, place_pipeline, score_sweep
from .sweep_settings import DEFAULT_SCORING, DEFAULT_TUNING, ScoringSettings, SweepSettings, TuningSettings
from .tuning_records import KnobTuning, SampledBank, TunedWhenSampled


BANK_PREFIX = "tuning bank: "


def bank_key(n: int, spec: SamplerSpec, call_kwargs: Mapping) -> str:
    """The key of one bank run: its NFE, sampler spec and call arguments (as [`BankScorer`] caches it)."""
    return run_key(n, spec, call_kwargs)


def bank_label(spec: SamplerSpec, call_kwargs: Mapping) -> str:
    """`"tuning bank: higs (higs_weight=1.75, higs_routing=both)"`: a bank run as it appears in run names."""
    knobs = {key: value for key, value in spec.to_json().items() if key != "scheduler"}
    inside = ", ".join(
        f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"
        for key, value in {**knobs, **call_kwargs}.items()
    )
    return f"{BANK_PREFIX}{spec.scheduler}" + (f" ({inside})" if inside else "")


def generate_baseline_candidates(
    pipe,
    settings: SweepSettings,
    tuning: TuningSettings = DEFAULT_TUNING,
    *,
    progress: bool = True,
    state=None,
    source: str = "PIPELINE_DIR",
    evaluator=None,
    protocol: str | None = None,
    eval_batch_size: int = 8,
    evaluator_name: str | None = None,
    log: Callable[[str], None] | None = None,
    name: str | None = None,
    command: str | None = None,
    device=None,
) -> Generation:
    """
    `--experiment baselines --generate-only --tune-here`: the comparison samplers tuned here on the bank, then the
    benchmark runs of the chosen values, unscored (module docstring).

    The checks of the one-machine run come first (seeds, ACE statistics, calibrated NFEs; nothing is sampled when one
    fails). With a `state` of several processes every process tunes on the whole bank (the same choice: it is a
    function of the scores; the tuning is not split), then the benchmark runs' batches are split across them, as in
    [`generate_sweep`], with the same samples as one process.

    Args:
        pipe: the loaded pipeline.
        settings ([`SweepSettings`]): the benchmark sweep, its `samplers` the `baselines` sampler set.
        tuning ([`TuningSettings`], defaults to `DEFAULT_TUNING`): the bank and the rule (as [`tune_baselines`]).
        progress (`bool`): progress bars.
        state: a [`untied_sc.distributed.process_state`] (several processes), or `None`.
        source (`str`): the pipeline as the user named it (for the commands errors suggest).
        evaluator: an evaluator name or a loaded `(model, tokenizer)` pair (required: the search needs scores).
        protocol, eval_batch_size: the bank's scoring (protocol default: the model's family).
        evaluator_name (`str`, *optional*): how the record names a loaded `evaluator` (default: its model's name).
        log (*optional*): gets a line per scored bank run (a long run without progress bars).
        name, command, device: for [`generate_sweep`].

    Returns:
        A [`generate_sweep`] result of the tuned samplers (each method sampled only where its choice is not neutral),
        with the bank's runs, its `candidates` (the sampler set, the bank's settings and how the untied coefficients
        were chosen) and `tuned_when_sampled` (the evaluator, the protocol and the runs sampled per NFE).
    """
    if evaluator is None:
        raise ValueError(
            "The comparison samplers are tuned by a search whose every candidate depends on the scores before it, "
            "so the tuning bank cannot be sampled ahead of scoring: tune where the evaluator is (`--generate-only "
            "--tune-here --evaluator ...`, or the one-machine run without --generate-only)."
        )
    samplers = normalise_samplers(settings.samplers)
    nfe, batch_size = settings.nfe, settings.batch_size
    tune_seed = check_seed(tuning.seed, "--tune-seed")
    if tuning.num_samples < 2:
        raise ValueError(f"The tuning bank needs at least 2 samples, got {tuning.num_samples}.")
    place_pipeline(pipe, state, device)  # the bank is sampled before generate_sweep places it
    knob = diversity_knob(family_of(pipe))
    loaded, loaded_name = scoring_evaluator(evaluator)
    evaluator_name = evaluator_name or loaded_name
    bank_runs = []
    began = time.perf_counter()

    def keep(spec, n, call_kwargs, texts, ids):
        label = bank_label(spec, call_kwargs)
        samples = run_samples(texts, ids, tune_seed, batch_size, label, n, **{knob: None})
        key = bank_key(n, spec, call_kwargs)
        bank_runs.append(
            BankSample(label, n, tune_seed, key, spec, dict(call_kwargs), tuning.num_samples, 0.0, samples)
        )

    tuned, _ = tune_baselines(
        pipe,
        replace(settings, samplers=samplers),
        loaded,
        tuning,
        eval_batch_size=eval_batch_size,
        protocol=protocol,
        progress=progress,
        source=source,
        on_sampled=keep,
        evaluator_name=evaluator_name,
        log=log,
    )
    bank_seconds = time.perf_counter() - began
    ace = ace_record(pipe)
    untied = {name: untied_tuning_record(pipe, nfe) for name, spec in samplers.items() if spec.scheduler == "untied"}
    bank = SampledBank(
        tune_seed,
        "tuning",
        tuning.num_samples,
        batch_size,
        tuning.budget,
        tuning.confidence,
        tuning.curve_values,
        tuning.extrapolate,
    )
    only = {n: {name for name, spec in tuned.items() if _chosen_source(name, spec, n) == name} for n in nfe}
    generation = generate_sweep(
        pipe,
        replace(settings, samplers=tuned),
        name=name,
        command=command,
        progress=progress,
        device=device,
        state=state,
        only=only,
    )
    return replace(
        generation,
        bank_runs=tuple(bank_runs),
        seconds=generation.seconds + bank_seconds,
        candidates=BaselineCandidates(samplers, bank, untied, ace),
        tuned_when_sampled=TunedWhenSampled(
            evaluator_name,
            protocol or default_protocol(family_of(pipe)),
            {n: [name for name in tuned if name in only[n]] for n in nfe},
        ),
    )


def _chosen_source(name: str, spec: SamplerSpec, n: int) -> str:
    """The run name whose benchmark runs stand for sampler `name` (tuned `spec`) at NFE `n`: official where a
    comparison sampler chose its neutral value (bit for bit the official sampler), else itself."""
    if spec.scheduler in COMPARISON_METHODS and is_neutral(spec.scheduler, spec.knobs_at(n)):
        return BASELINE
    return name


def choose_from_bank(
    generation: Generation,
    evaluator,
    protocol: str | None = None,
    eval_batch_size: int = 8,
    progress: bool = True,
    scoring=None,
) -> tuple[dict[str, SamplerSpec], KnobTuning, dict[str, BankRun]]:
    """
    Scores the tuning bank stored in a [`generate_baseline_candidates`] result and replays the search of every
    comparison sampler at every NFE on those scores ([`search_methods`]).

    Args:
        generation ([`Generation`]): the result (or its [`read_stored_sweeps`] reading).
        evaluator: a loaded `(model, tokenizer)` pair.
        protocol (`str`, *optional*): the scoring protocol (default: the model's family).
        eval_batch_size (`int`): the evaluator's batch size.
        progress (`bool`): a progress bar over the bank's runs.
        scoring (`StoreScoring`, *optional*): a run store's bank scores (`kind="bank"`): bank runs it holds are read
            (the first imported one scored again as a check), the others scored and stored.

    Returns:
        `(samplers, tuning, bank_scores)`: the specs as [`tune_baselines`] returns them, the tuning record
        ([`KnobTuning`], its evaluator `None`: the caller names it) and every bank run's scores under its
        [`samples_fingerprint`] (what a later `--store-from` imports).
    """
    candidates = generation.candidates
    if candidates is None:
        raise ValueError(
            f"The sampled sweep of {generation.model} holds no tuning bank: it was not sampled with "
            "`--experiment baselines --generate-only --tune-here`. Score it without --experiment baselines."
        )
    settings = candidates.bank
    family = generation.family
    protocol = protocol or default_protocol(family)
    runs = {run.key: run for run in generation.bank_runs}
    bank_scores = {}
    bar = tqdm(total=len(runs), desc="scoring the tuning bank", disable=not progress)
    scored: dict[str, BankRun] = {}

    def score(n: int, spec: SamplerSpec, **call_kwargs) -> BankRun:
        key = bank_key(n, spec, call_kwargs)
        if key in scored:
            return scored[key]
        run = runs.get(key)
        if run is None:
            raise ValueError(
                f"The sampled sweep holds no tuning-bank run of {bank_label(spec, call_kwargs)} at NFE {n}, which "
                "the search asks for: it was tuned with another evaluator or protocol, or the store is incomplete. "
                "Score it with the evaluator and protocol it was tuned with (`tuned_when_sampled`)."
            )

        def fresh() -> dict:
            return score_bank_samples(run.samples, evaluator, protocol, eval_batch_size).to_json()

        label = f"bank run {run.sampler} at NFE {n}"
        stored = fresh() if scoring is None else scoring.scored(run.samples, fresh, label, lambda r: r["nll_sum"])
        result = BankRun.from_json(stored)
        bank_scores[samples_fingerprint(run.samples)] = result
        scored[key] = result
        bar.update()
        return result

    samplers = candidates.samplers
    methods = [m for m in dict.fromkeys(spec.scheduler for spec in samplers.values()) if m in COMPARISON_METHODS]
    try:
        results = search_methods(
            score,
            methods,
            generation.nfe,
            family,
            diversity_knob(family),
            resampling_clusters(family, settings.num_samples, settings.batch_size),
            settings.budget,
            settings.curve_values,
            settings.extrapolate,
            settings.confidence,
        )
    finally:
        bar.close()
    bank = tuning_bank(
        settings.seed,
        settings.num_samples,
        settings.batch_size,
        None,  # the caller names the evaluator
        protocol,
        settings.budget,
        settings.confidence,
        candidates.ace,
        settings.seed_space,
    )
    samplers, tuning = apply_knob_choices(samplers, results, generation.nfe, bank, candidates.untied)
    return samplers, tuning, bank_scores


def select_chosen_runs(generation: Generation, samplers: Mapping[str, SamplerSpec], tuning: KnobTuning) -> Generation:
    """
    The generation as the one-machine run would have sampled it: each comparison sampler's benchmark runs (main and
    diversity) at its chosen knobs, official's where it chose the neutral value, under its own name and in the
    one-machine run's order; the bank left out; the tuned `samplers` and the `tuning` record in place of the
    candidates.
    """
    by_run = {run.key: run for run in generation.runs}
    plan = [(name, n, seed, None) for n in generation.nfe for seed in generation.seeds for name in samplers]
    for value in generation.diversity_values:
        for n in generation.diversity_nfe or generation.nfe:
            plan += [(name, n, seed, value) for seed in generation.seeds for name in generation.diversity_samplers]
    runs = []
    for name, n, seed, value in plan:
        source = _chosen_source(name, samplers[name], n)
        run = by_run.get((source, n, seed, value))
        if run is None:
            raise ValueError(_missing_chosen_run(generation, source, n))
        samples = [sample if source == name else replace(sample, sampler=name) for sample in run.samples]
        runs.append(replace(run, sampler=name, samples=samples))
    coefficients = {name: value for name, value in (generation.coefficients or {}).items() if name in samplers}
    return replace(
        generation,
        samplers=dict(samplers),
        runs=tuple(runs),
        bank_runs=(),
        coefficients=coefficients,
        knob_tuning=tuning,
        candidates=None,
        tuned_when_sampled=None,
    )


def _missing_chosen_run(generation: Generation, source: str, n: int) -> str:
    message = f"The generation holds no benchmark run of {source!r} at NFE {n}, which the report needs."
    tuned = generation.tuned_when_sampled
    if tuned and source not in tuned.sampled.get(n, [source]):
        return (
            f"{message} Its NFE {n} was tuned with {tuned.evaluator} under the {tuned.protocol} protocol, "
            f"which chose otherwise and sampled only {', '.join(tuned.sampled[n])}: score it with that "
            "evaluator and protocol."
        )
    return f"{message} The store is incomplete or was edited: sample that part again with --generate-only."


def score_baseline_candidates(
    generation: Generation,
    scoring: ScoringSettings = DEFAULT_SCORING,
    *,
    progress: bool = True,
    evaluator_kwargs: Mapping | None = None,
    **score_kwargs,
) -> dict:
    """
    `benchmark --store DIR` on a [`generate_baseline_candidates`] result: [`choose_from_bank`], [`select_chosen_runs`], then
    [`score_sweep`] with the same evaluator (loaded once).

    Args:
        generation ([`Generation`]): the result (or its [`read_stored_sweeps`] reading).
        scoring ([`ScoringSettings`]): as in [`score_sweep`]; its evaluator a name or a loaded `(model, tokenizer)`
            pair, its protocol and scoring batch size also the bank's.
        progress: as in [`score_sweep`].
        evaluator_kwargs (`Mapping`, *optional*): `cache_dir`, `device`, `dtype` for [`load_evaluator`].
        **score_kwargs: the other [`score_sweep`] arguments (`output_dir`, `command`, `store`, ...).
    """
    protocol, eval_batch_size = scoring.protocol, scoring.eval_batch_size
    loaded, name = scoring_evaluator(scoring.evaluator, **dict(evaluator_kwargs or {}))
    store = score_kwargs["store"] = open_store(score_kwargs.get("store"))
    bank_scoring = None
    if store is not None:
        description = describe_evaluator(name, next(loaded[0].parameters()).dtype)
        protocol_used = protocol or default_protocol(generation.family)
        bank_scoring = StoreScoring(store, description, protocol_used, eval_batch_size, None, kind="bank")
    samplers, tuning, bank_scores = choose_from_bank(
        generation, loaded, protocol, eval_batch_size, progress, bank_scoring
    )
    # The bank's scores go beside the tuning record, which stays the one-machine run's.
    selected = replace(
        select_chosen_runs(generation, samplers, replace(tuning, evaluator=name)), bank_scores=bank_scores
    )
    return score_sweep(
        selected, replace(scoring, evaluator=loaded), evaluator_name=name, progress=progress, **score_kwargs
    )
