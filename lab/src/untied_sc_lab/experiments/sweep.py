"""The matched generation sweep behind `untied-sc benchmark`: every sampler at every NFE and seed, then scored
(docs/algorithm.md §6).

For every seed s, NFE N and sampler, the pipeline generates `num_samples` samples in batches; batch b of every
sampler is drawn from `torch.Generator().manual_seed(batch_seed(s, b))`, so sample i of the official run and sample i
of the untied run share the initial latent z_0 and the random stream (pairs are matched; results depend on
`batch_size` through the batch seeds, which is recorded). Each run is scored with [`evaluate_samples`] (GenPPL under
the evaluator and protocol, entropies, Rep-4, distinct-n, per-sample NLL) and timed (samples/s of sampling alone).
The diversity sweep runs the official sampler at several values of the family's diversity knob (LangFlow: the
temperature T of x̂ = softmax(logits / T)·E_norm; ELF: the temperature T of the final decode's softmax, 0 = argmax)
so that samplers can be compared at equal entropy.

[`run_sweep`] is [`generate_sweep`] (sampling, e.g. on a GPU) then [`score_sweep`] (scoring, where the evaluator is);
a run store carries a generation between the two (`stored_sweeps.py`). The statistics are
[`analyse`]'s (`aggregation.py`), the files [`write_results`]'s (`report.py`).

The sweep runs pipelines (with `sampling.generate`; `generate.py`, behind `untied-sc generate`, is the only other
place in `evaluation` that does) but scores only texts and token ids.
Under `accelerate launch` the sampling is split across the processes by batch (`untied_sc.distributed`) with the same
samples as one process; scoring runs once, on the main process, which alone writes files.
"""

import os
import shlex
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from tqdm.auto import tqdm

from untied_sc.distributed import is_main_process, main_process_progress, process_device, process_rank
from untied_sc.families import default_protocol
from untied_sc.generation import (
    SamplerSpec,
    build_scheduler,
    check_ace_statistics,
    check_runs,
    diversity_knob,
    family_of,
    generate,
    refuse_leaked_seeds,
    run_samples,
    tokenizer_description,
    warn_few_clusters,
)
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers import UntiedSelfConditioningScheduler, entropy_matched_setting

from ..evaluation.evaluator import describe_evaluator, load_evaluator
from ..evaluation.io import evaluate_samples, samples_key
from ..runs.store import RunKey, RunStore, StoreScoring, open_store
from .aggregation import analyse
from .definitions import BASELINE, DEFAULT_SAMPLERS, normalise_samplers
from .generation_record import Generation
from .records import RunRecord
from .report import write_results
from .sweep_settings import DEFAULT_SCORING, DEFAULT_SWEEP, ScoringSettings, SweepSettings
from .tuning_records import KnobTuning


BATCH_SEED_RULE = "1_000_003 * seed + batch_index"  # as reports record it ([`batch_seed`] in the benchmark space)
EVALUATOR_OPTIONS = ("cache_dir", "device", "dtype")  # [`load_evaluator`]'s, beside the evaluator's name


def _check_evaluator_options(options: Mapping) -> None:
    """Refuses keywords [`load_evaluator`] does not take: a scoring setting belongs in the [`ScoringSettings`]."""
    unknown = [key for key in options if key not in EVALUATOR_OPTIONS]
    if unknown:
        raise TypeError(
            f"Unknown evaluator options {unknown} (they are {list(EVALUATOR_OPTIONS)}); the evaluator, protocol, "
            "eval_batch_size, max_length and num_resamples go in a ScoringSettings."
        )


def _sweep_runs(
    nfe: Sequence[int],
    seeds: Sequence[int],
    samplers: Mapping[str, SamplerSpec],
    diversity_values: Sequence[float] | None,
    diversity_samplers: Sequence[str],
    diversity_nfe: Sequence[int] | None,
) -> list[tuple[str, int, int, float | None]]:
    """The sweep's runs in order: (sampler, NFE, seed, diversity value or `None` for a main run)."""
    plan = [(s, n, seed, None) for n in nfe for seed in seeds for s in samplers]
    for value in diversity_values or ():
        plan += [(s, n, seed, value) for n in (diversity_nfe or nfe) for seed in seeds for s in diversity_samplers]
    return plan


def place_pipeline(pipe, state=None, device: str | torch.device | None = None) -> None:
    """Moves `pipe` where a sweep samples: `device`, or under several processes each process's own
    ([`process_device`]); left where it is when neither names one."""
    if state is not None:
        device = process_device(state, device)
    if device is not None:
        pipe.to(device)


def default_name(pipeline_dir_or_pipe) -> str:
    """The model name of a sweep's files when none is given: the pipeline folder's (or Hub id's) last part."""
    if isinstance(pipeline_dir_or_pipe, (str, os.PathLike)):
        return Path(str(pipeline_dir_or_pipe).rstrip("/")).name
    pipe = pipeline_dir_or_pipe
    return Path(str(getattr(pipe, "name_or_path", None) or type(pipe).__name__).rstrip("/")).name


def generate_sweep(
    pipeline_dir_or_pipe,
    settings: SweepSettings = DEFAULT_SWEEP,
    *,
    name: str | None = None,
    command: str | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
    state=None,
    knob_tuning: KnobTuning | None = None,
    only: Mapping[int, Collection[str]] | None = None,
    store: str | os.PathLike | RunStore | None = None,
) -> Generation:
    """The sampling half of [`run_sweep`]: generates every run of the sweep and returns it, unscored.

    The arguments are [`run_sweep`]'s, and `only`: per NFE, the samplers to sample there (the others' runs are left
    out; `--experiment baselines --tune-here` samples only the chosen knob values). `store` keeps every run sampled
    here and gives back, with its sampling seconds, every run it holds ([`RunStore.sampled`]: the first batch of each
    sampler read from it is sampled again as a check). With a `state` of several processes ([`untied_sc.distributed.process_state`],
    e.g. under `accelerate launch`), each process samples its shard of every run's batches on its own device
    ([`process_device`]: `device`, else the process's) and every process returns the whole sweep, the same as one
    process would. Sampling and scoring can run on different machines (sample on a GPU, score on
    a machine that has the evaluator): [`store_sweep`] records the result in a run store, [`read_stored_sweeps`] reads
    it back and [`score_sweep`] scores it, with the same numbers as [`run_sweep`] on the same samples.

    Returns:
        [`Generation`]: the sweep's settings, the coefficients (η_R, η_T, η_O, α each untied sampler ran with, by
        NFE), where it ran, its wall time, and one [`RunRecord`] per (sampler, NFE, seed[, knob value]) with its
        sampling seconds (its slowest process's) and its samples ([`Sample`]s).
    """
    began = time.perf_counter()
    nfe, seeds, num_samples, batch_size = settings.nfe, settings.seeds, settings.num_samples, settings.batch_size
    diversity_values, diversity_samplers = settings.diversity_values, settings.diversity_samplers
    diversity_nfe, samplers = settings.diversity_nfe, settings.samplers
    if command is None:
        command = shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])
    if isinstance(pipeline_dir_or_pipe, (str, os.PathLike)):
        pipe = load_pipeline(pipeline_dir_or_pipe)
    else:
        pipe = pipeline_dir_or_pipe
    name = name or default_name(pipeline_dir_or_pipe)
    place_pipeline(pipe, state, device)
    num_processes = process_rank(state)[1]
    family = family_of(pipe)
    refuse_leaked_seeds(seeds, pipe)
    knob = diversity_knob(family)
    samplers = normalise_samplers(samplers if samplers is not None else DEFAULT_SAMPLERS)
    unknown = [s for s in diversity_samplers if s not in samplers]
    if diversity_values and unknown:
        raise ValueError(f"diversity_samplers {unknown} are not among the samplers {list(samplers)}.")
    if num_samples < 1 or batch_size < 1:
        raise ValueError(f"num_samples and batch_size must be positive, got {num_samples} and {batch_size}.")
    warn_few_clusters(family, len(seeds), num_samples, batch_size)  # ELF: one time grid per batch
    plan = _sweep_runs(nfe, seeds, samplers, diversity_values, diversity_samplers, diversity_nfe)
    if only is not None:
        plan = [run for run in plan if run[0] in only.get(run[1], ())]
    source = str(pipeline_dir_or_pipe) if isinstance(pipeline_dir_or_pipe, (str, os.PathLike)) else "PIPELINE_DIR"
    check_ace_statistics(pipe, samplers, source)
    check_runs(pipe, samplers, plan, source)
    store = open_store(store)
    device_name = str(pipe.device) + (
        f" ({torch.cuda.get_device_name(pipe.device)})" if pipe.device.type == "cuda" else ""
    )
    # The settings first (the store's run keys read them); the coefficients, wall time and runs once sampled.
    sweep = Generation(
        model=name,
        family=family,
        pipeline_class=type(pipe).__name__,
        generator_tokenizer=tokenizer_description(pipe.tokenizer),
        nfe=tuple(nfe),
        seeds=tuple(seeds),
        num_samples=num_samples,
        batch_size=batch_size,
        batch_seed=BATCH_SEED_RULE,
        samplers=samplers,
        coefficients={},
        baseline=BASELINE,
        diversity_knob=knob,
        diversity_values=tuple(diversity_values or ()),
        diversity_samplers=tuple(diversity_samplers) if diversity_values else (),
        diversity_nfe=tuple(diversity_nfe or nfe) if diversity_values else (),
        device=device_name + (f", {num_processes} processes" if num_processes > 1 else ""),
        num_processes=num_processes,
        torch=torch.__version__,
        command=command,
        seconds=0.0,
        knob_tuning=knob_tuning,
    )

    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    runs = []
    coefficients: dict[str, dict[int, dict[str, float]]] = {}  # as run: presets, tuned values and scales resolved
    try:
        for sampler, n, seed, value in main_process_progress(plan, state, progress, desc=f"sampling {name}"):
            spec = samplers[sampler]
            pipe.scheduler = build_scheduler(pipe, spec, original_scheduler.config, n)
            call_kwargs = dict(spec.call)
            if value is not None:
                call_kwargs[knob] = value
            if isinstance(pipe.scheduler, UntiedSelfConditioningScheduler) and value is None:
                resolved = pipe.scheduler.resolve_coefficients(n)
                stored = entropy_matched_setting(pipe.scheduler.config, n, knob)
                if stored is not None and knob not in call_kwargs:  # the pipeline's call runs it: say so
                    resolved[knob] = stored
                coefficients.setdefault(sampler, {})[n] = resolved

            def sample(
                count: int = num_samples, sampler=sampler, n=n, seed=seed, value=value, call_kwargs=call_kwargs
            ):
                texts, ids, seconds = generate(pipe, n, seed, count, batch_size, state=state, **call_kwargs)
                return run_samples(texts, ids, seed, batch_size, sampler, n, **{knob: value}), seconds

            if store is None:
                samples, seconds = sample()
            else:
                key = RunKey.of(sweep.run_settings, spec, coefficients.get(sampler, {}).get(n), n, seed, value)
                samples, seconds = store.sampled(
                    key,
                    sampler,
                    sample,
                    lambda sample=sample: sample(batch_size)[0],
                    partial(run_samples, seed=seed, batch_size=batch_size, sampler=sampler, nfe=n, **{knob: value}),
                )
            runs.append(RunRecord(sampler, n, seed, value, seconds, samples))
    finally:
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)
    return replace(
        sweep,
        coefficients=coefficients,
        seconds=time.perf_counter() - began,
        store=None if store is None else store.account(),
        runs=tuple(runs),
    )


def score_sweep(
    generation: Generation,
    scoring: ScoringSettings = DEFAULT_SCORING,
    *,
    output_dir: str | os.PathLike | None = None,
    command: str | None = None,
    progress: bool = True,
    main_only: bool = False,
    evaluator_name: str | None = None,
    scored: Mapping[tuple, dict] | None = None,
    store: str | os.PathLike | RunStore | None = None,
    **evaluator_kwargs,
) -> dict:
    """The scoring half of [`run_sweep`]: scores a [`generate_sweep`] result (or a [`read_stored_sweeps`] one) and
    aggregates it. The arguments are [`run_sweep`]'s; `command` is the scoring command when it differs from the
    generation's; `main_only` leaves the diversity runs out (no GenPPL–entropy curves; scoring is the costly half);
    `evaluator_name` names a loaded `(model, tokenizer)` `evaluator` in the report (default: the model's own name);
    `scored` holds runs already scored here with this evaluator (`untied-sc evaluate`'s), by [`samples_key`], as
    [`evaluate_samples`] returns them; `store` keeps every run scored here, read back instead of scored again by a
    later call ([`RunStore`], [`StoreScoring`]; scores an earlier report lends are read into it by
    [`import_report`])."""
    _check_evaluator_options(evaluator_kwargs)
    began = time.perf_counter()
    evaluator, eval_batch_size, max_length = scoring.evaluator, scoring.eval_batch_size, scoring.max_length
    family, knob = generation.family, generation.diversity_knob
    records = list(generation.runs)
    if main_only:
        records = [record for record in records if record.is_main]
        generation = replace(generation, diversity_values=(), diversity_samplers=(), diversity_nfe=())
    protocol = scoring.protocol or default_protocol(family)
    if isinstance(evaluator, (str, os.PathLike)):
        evaluator_name = str(evaluator)
        evaluator = load_evaluator(evaluator, **evaluator_kwargs)
    elif evaluator_name is None:
        evaluator_name = getattr(evaluator[0], "name_or_path", None) or type(evaluator[0]).__name__
    description = describe_evaluator(evaluator_name, next(evaluator[0].parameters()).dtype)
    runs = []
    # A run holding the very samples of a run already scored (a comparison sampler that chose its neutral knob runs
    # as official) takes its scores: the same batches give the same numbers, and scoring is the costly half.
    scored = dict(scored or {})
    store = open_store(store)
    parts = None if store is None else StoreScoring(store, description, protocol, eval_batch_size, max_length)
    for record in tqdm(records, desc=f"scoring {generation.model}", disable=not progress):
        key = samples_key(record.samples)
        if key not in scored:

            def score(samples=record.samples) -> dict:
                return evaluate_samples(
                    samples, evaluator=evaluator, protocol=protocol, batch_size=eval_batch_size, max_length=max_length
                )

            scored[key] = score() if parts is None else parts.scored(record.samples, score, record.label())
        runs.append(record.scored(scored[key]).to_json(knob))

    knob_default = 1.0 if knob == "temperature" else 0.0  # the official sampler's value
    account = generation.store if store is None else store.account()  # under `run_sweep` one store for both
    results = {
        "model": generation.model,
        "family": generation.family,
        "pipeline_class": generation.pipeline_class,
        "nfe": list(generation.nfe),
        "seeds": list(generation.seeds),
        "num_samples": generation.num_samples,
        "batch_size": generation.batch_size,
        "batch_seed": generation.batch_seed,
        "protocol": protocol,
        "evaluator": evaluator_name,
        "evaluator_description": description,
        "samplers": generation.samplers_json(),
        "coefficients": generation.coefficients_json(),  # absent from rescored reports that record none
        "generator_tokenizer": generation.generator_tokenizer,
        "baseline": generation.baseline,
        "diversity_knob": knob,
        "diversity_values": list(generation.diversity_values),
        "diversity_samplers": list(generation.diversity_samplers),
        "diversity_nfe": list(generation.diversity_nfe),
        "device": generation.device,
        "torch": generation.torch,
        "num_processes": generation.num_processes,
        "runs": runs,
        "diversity_default": knob_default,
        "command": generation.command,
        "main_only": main_only,
        **({} if generation.knob_tuning is None else {"knob_tuning": generation.knob_tuning.to_json()}),
        **({} if generation.parts is None else {"parts": [part.to_json() for part in generation.parts]}),
        **({} if account is None else {"store": account.to_json()}),
    }
    if generation.bank_scores is not None:  # --experiment baselines scored on another machine, for a --store-from
        results["bank_scores"] = {key: run.to_json() for key, run in generation.bank_scores.items()}
    if command is not None and command != generation.command:
        results["scoring_command"] = command
        results["scoring_device"] = str(next(evaluator[0].parameters()).device)
    analyse(results, num_resamples=scoring.num_resamples)
    results["sampling_seconds"] = generation.seconds
    results["scoring_seconds"] = time.perf_counter() - began
    results["wall_seconds"] = results["sampling_seconds"] + results["scoring_seconds"]
    if output_dir is not None:
        samples = [sample for record in records for sample in record.samples]
        results["samples_file"] = f"{generation.model}.samples.jsonl.gz"
        results["files"] = {k: str(v) for k, v in write_results(results, output_dir, samples).items()}
    return results


def run_sweep(
    pipeline_dir_or_pipe,
    settings: SweepSettings = DEFAULT_SWEEP,
    scoring: ScoringSettings = DEFAULT_SCORING,
    *,
    name: str | None = None,
    output_dir: str | os.PathLike | None = None,
    command: str | None = None,
    progress: bool = True,
    device: str | torch.device | None = None,
    state=None,
    knob_tuning: KnobTuning | None = None,
    store: str | os.PathLike | RunStore | None = None,
    **evaluator_kwargs,
) -> dict | None:
    """Runs the matched official-vs-untied sweep and (with `output_dir`) writes `<name>.json`, `.md` and `.png`.

    [`generate_sweep`] then [`score_sweep`]: use those two to sample and score on different machines.

    Args:
        pipeline_dir_or_pipe: a pipeline folder / Hub id ([`load_pipeline`]) or a loaded pipeline. The untied sampler
            needs its `sampler_statistics` calibrated at every NFE in `nfe` (`untied-sc calibrate`).
        settings ([`SweepSettings`]): what is sampled: NFEs, seeds, samples, batch size, samplers, diversity sweep.
        scoring ([`ScoringSettings`]): the evaluator, protocol, scoring batch size, maximum length and bootstrap.
        name (`str`, *optional*): the model name of the output files (default: the pipeline folder's name).
        output_dir (`str` or `os.PathLike`, *optional*): where to write `<name>.json`, `<name>.md`, `<name>.png` and
            the scored samples `<name>.samples.jsonl.gz`; nothing is written when `None`.
        command (`str`, *optional*): the command line stored in the results (default: this process's argv).
        progress (`bool`, defaults to `True`): a tqdm bar over the runs.
        device: where to run the pipeline and a named evaluator (default: where the pipeline is; evaluator on CPU).
        state: the [`untied_sc.distributed.process_state`] of several processes (`accelerate launch`): sampling is
            split across them by batch ([`generate_sweep`]); the main process alone scores and writes, the others
            return `None`. Scoring is not split: it runs once, on the main process.
        knob_tuning ([`KnobTuning`], *optional*): the record of how the comparison samplers' knobs were chosen
            ([`untied_sc_lab.experiments.baselines.tune_baselines`]), kept in the results and the report.
        store (`str`, `os.PathLike` or [`RunStore`], *optional*): a store folder that keeps every run sampled and
            scored, so that a stopped sweep resumes and does only the missing work ([`generate_sweep`],
            [`score_sweep`]).
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        The results dict (see [`write_results`] for the files): `model`, `family`, `protocol`, `evaluator`, settings,
        `diversity_knob`, `runs` (one record per (sampler, NFE, seed[, knob value]) with its metrics, samples/s and
        per-sample NLLs), `aggregates` ([`aggregate`] of the main runs), `wall_seconds`, `command`; `None` on a
        process other than the main one.
    """
    _check_evaluator_options(evaluator_kwargs)
    store = open_store(store)  # one store, so the report counts its sampled and scored runs
    generation = generate_sweep(
        pipeline_dir_or_pipe,
        settings,
        name=name,
        command=command,
        progress=progress,
        device=device,
        state=state,
        knob_tuning=knob_tuning,
        store=store,
    )
    if not is_main_process(state):
        return None
    if device is not None and isinstance(scoring.evaluator, (str, os.PathLike)):
        evaluator_kwargs.setdefault("device", device)
    return score_sweep(generation, scoring, output_dir=output_dir, progress=progress, store=store, **evaluator_kwargs)
