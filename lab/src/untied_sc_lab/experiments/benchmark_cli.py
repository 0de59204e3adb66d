"""`untied-sc benchmark`: the matched sweep ([`run_sweep`], or one half of it: `--generate-only --store DIR`, then
`--store DIR` alone), a report's rescoring ([`rescore_report`]), and the Markdown report printed.
"""

from pathlib import Path

from untied_sc.families import get_family

from .benchmark_checks import (
    OTHER_NAME,
    benchmark_outputs,
    check_generation_scoring,
    check_rescore,
    check_sweep_arguments,
    scores_generation,
)
from .benchmark_options import add_benchmark_arguments, benchmark_command_line


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads.


def _rescore(args, name: str) -> dict:
    """`--rescore`: [`rescore_report`] under the options' evaluator, written and printed."""
    from .rescore import rescore_report

    results = rescore_report(
        args.rescore,
        _scoring_settings(args),  # its --protocol is refused: the report's protocol is kept
        name=name,
        output_dir=args.output_dir,
        command=benchmark_command_line(args),
        progress=not args.no_progress,
        cache_dir=args.cache_dir,
        device=args.device or "cpu",
        dtype=args.dtype,
        store=_open_store(args),
    )
    _print_written(results)
    return results


def _score_stored_sweep(args, scoring, outputs: dict) -> dict:
    """`--store DIR` without a pipeline: [`score_sweep`] on the `--generate-only` sweep stored in DIR, whose pipeline
    and sweep options it fixes."""
    from dataclasses import replace

    from .baseline_generation import score_baseline_candidates
    from .stored_sweeps import read_stored_sweeps
    from .sweep import score_sweep

    generation = read_stored_sweeps(outputs["store"])
    if args.name:
        generation = replace(generation, model=args.name)
    if generation.candidates is not None:  # --experiment baselines: choose the knobs on the stored bank first
        evaluator_kwargs = {key: outputs.pop(key) for key in ("cache_dir", "dtype")}
        evaluator_kwargs["device"] = args.device or "cpu"
        return score_baseline_candidates(
            generation,
            scoring,
            **outputs,
            evaluator_kwargs=evaluator_kwargs,
            command=benchmark_command_line(args),
            progress=not args.no_progress,
            main_only=args.main_only,
        )
    return score_sweep(
        generation,
        scoring,
        **outputs,
        **({"device": args.device} if args.device else {}),
        command=benchmark_command_line(args),
        progress=not args.no_progress,
        main_only=args.main_only,
    )


def _load_evaluator(args):
    """The benchmark's evaluator as the options name it (on --device, else the CPU) for choosing knobs on the bank."""
    from ..evaluation.evaluator import load_evaluator

    return load_evaluator(args.evaluator, cache_dir=args.cache_dir, device=args.device or "cpu", dtype=args.dtype)


def _tune_baselines(args, settings, state, store):
    """`--experiment baselines`: loads the pipeline and the evaluator, checks the sweep, chooses the comparison
    samplers' knobs on the tuning bank ([`tune_baselines`]) and returns the loaded pipeline (the sweep samples it;
    scoring loads the evaluator again by name, so the report names it as any other), the settings with the tuned
    sampler specs, and the tuning record. The bank's scored runs are kept in the run store `store` where given (a
    stopped tuning resumes from it)."""
    from dataclasses import replace

    from untied_sc.distributed import process_device, process_rank
    from untied_sc.pipelines import load_pipeline

    from .baselines import tune_baselines

    if process_rank(state)[1] > 1:
        raise SystemExit(
            "--experiment baselines tunes its knobs in one process: run it without `accelerate launch` (one GPU)."
        )
    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    pipe = load_pipeline(args.pipeline).to(process_device(state, args.device))
    settings = _default_frontier(settings, pipe)
    evaluator = _load_evaluator(args)
    samplers, record = tune_baselines(
        pipe,
        settings,
        evaluator,
        _tuning_settings(args),
        eval_batch_size=args.eval_batch_size,
        protocol=args.protocol,
        progress=not args.no_progress,
        source=args.pipeline,
        store=store,
        evaluator_name=args.evaluator,
        log=_tuning_log(args),
    )
    return pipe, replace(settings, samplers=samplers), replace(record, evaluator=args.evaluator)


def _scoring_settings(args):
    """How the runs are scored and analysed, as the options give it ([`ScoringSettings`])."""
    from .sweep_settings import ScoringSettings

    return ScoringSettings(
        evaluator=args.evaluator,
        protocol=args.protocol,
        eval_batch_size=args.eval_batch_size,
        max_length=args.max_length,
        num_resamples=args.num_resamples,
    )


def _tuning_settings(args):
    """The knob tuning of `--experiment baselines` as the options give it ([`TuningSettings`]; their defaults are set
    by [`check_sweep_arguments`])."""
    from .sweep_settings import TuningSettings

    return TuningSettings(
        seed=args.tune_seed, num_samples=args.tune_num_samples, budget=args.tune_budget, confidence=args.confidence
    )


def _tuning_log(args):
    """With `--no-progress`, a timestamped line on standard error per scored bank run (as `untied-sc tune`'s): a
    tuning of an hour or more on a CPU is otherwise silent."""
    from ..tuning.tune import stderr_log

    return stderr_log if args.no_progress else None


def _default_frontier(settings, pipe):
    """`--experiment baselines` without `--temperatures`: every sampler swept over the family's `frontier_values`."""
    from dataclasses import replace

    if settings.diversity_values is not None:
        return settings
    values = get_family(pipe.family).require("frontier_values", "The baselines experiment's default sweep")
    return replace(settings, diversity_values=list(values))


def _generate_baseline_candidates(args, settings, run: dict) -> dict:
    """`--experiment baselines --generate-only --tune-here`: the comparison samplers tuned here on the bank, then the
    benchmark runs of the chosen values ([`generate_baseline_candidates`]); `--store DIR` alone replays the choice and
    scores."""
    from untied_sc.distributed import process_device
    from untied_sc.pipelines import load_pipeline

    from .baseline_generation import generate_baseline_candidates

    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    pipe = load_pipeline(args.pipeline).to(process_device(run["state"], args.device))
    return generate_baseline_candidates(
        pipe,
        _default_frontier(settings, pipe),
        _tuning_settings(args),
        evaluator=_load_evaluator(args),
        evaluator_name=args.evaluator,
        protocol=args.protocol,
        eval_batch_size=args.eval_batch_size,
        log=_tuning_log(args),
        source=args.pipeline,
        **run,
    )


def _print_written(results: dict) -> None:
    """Prints the report's Markdown as it was written (rendered once, by `write_results`) and the files written."""
    files = results["files"]
    print(Path(files["markdown"]).read_text())
    print("Wrote " + ", ".join(files.values()))


def _open_store(args):
    """The `--store` folder opened, with the `--store-from` reports read into it; `None` without `--store`."""
    if not args.store:
        return None
    from ..runs.store import RunStore
    from .report_import import import_report

    store = RunStore(args.store)
    for path in args.store_from or ():
        import_report(store, path, args.eval_batch_size, args.max_length)
    return store


def benchmark_command(args) -> dict | None:
    """Handler of `untied-sc benchmark`: [`run_sweep`] (or one half of it) and the Markdown table.

    Under `accelerate launch` (or `torchrun`) the sampling is split across the processes by batch, with the samples of
    one process; the main process alone scores, writes and prints (the others return `None`). Scoring a sampled sweep
    (`--store DIR` alone) is not split: it runs on the main process only.
    """
    # Everything that needs no model is checked first, before torch loads (see `check_sweep_arguments`).
    from untied_sc.output_paths import claimed_outputs

    if args.rescore:
        name = check_rescore(args)
        with claimed_outputs(benchmark_outputs(args, name), args.overwrite, OTHER_NAME):  # scored in one process
            return _rescore(args, name)
    if scores_generation(args):
        name = check_generation_scoring(args)
    else:
        name = check_sweep_arguments(args)

    from untied_sc.distributed import is_main_process, process_state

    state = process_state(args.device)
    # The main process, which alone writes, holds the result files from here to its last write: a second run of the
    # same name is refused now (a store whose sweep is unreadable names none: `read_stored_sweeps` says why).
    outputs = benchmark_outputs(args, name) if name else []
    with claimed_outputs(outputs, args.overwrite, OTHER_NAME, active=is_main_process(state)):
        return _benchmark_into(args, name, state)


def _benchmark_into(args, name: str | None, state) -> dict | None:
    """The work of `benchmark_command`, once its outputs are claimed."""
    from untied_sc.distributed import is_main_process, silence_other_processes

    from .definitions import select_samplers, with_preset
    from .stored_sweeps import store_sweep
    from .sweep import generate_sweep, run_sweep
    from .sweep_settings import SweepSettings

    scoring = _scoring_settings(args)
    outputs = {"output_dir": args.output_dir, "cache_dir": args.cache_dir, "dtype": args.dtype}
    outputs["store"] = _open_store(args)
    silence_other_processes(state)
    if scores_generation(args):
        if not is_main_process(state):
            return None
        results = _score_stored_sweep(args, scoring, outputs)
        _print_written(results)
        return results
    baselines = args.experiment == "baselines"
    settings = SweepSettings(
        nfe=args.nfe,
        seeds=args.seeds,
        num_samples=args.num_samples,
        batch_size=args.batch_size,
        samplers=with_preset(select_samplers(args.experiment, args.samplers), args.coefficients),
        diversity_values=args.temperatures,
        diversity_nfe=args.diversity_nfe,
        # baselines: every sampler's own frontier (its tuned point and the temperatures), read at official's entropy
        **({"diversity_samplers": list(select_samplers(args.experiment, args.samplers))} if baselines else {}),
    )
    run = {"name": name, "command": benchmark_command_line(args), "progress": not args.no_progress}
    run.update(device=args.device, state=state)
    if baselines and args.generate_only:  # tuned here, then the chosen values sampled
        generation = _generate_baseline_candidates(args, settings, run)
    elif args.generate_only:
        generation = generate_sweep(args.pipeline, settings, **run, store=outputs["store"])
    if args.generate_only:
        if not is_main_process(state):
            return None
        where = store_sweep(outputs["store"], generation)  # the store carries the sweep
        count = sum(len(run.samples) for run in generation.sampled_runs)
        print(
            f"Sampled {count} samples in {len(generation.sampled_runs)} runs in {generation.seconds:.1f} s on "
            f"{generation.device} into {where}. Score them with: untied-sc benchmark --store {args.store}"
        )
        return generation
    # baselines: the pipeline loaded, checked and tuned on; otherwise its folder, loaded by the sweep
    if baselines:
        pipeline, settings, record = _tune_baselines(args, settings, state, outputs["store"])
        run["knob_tuning"] = record
    else:
        pipeline = args.pipeline
    results = run_sweep(pipeline, settings, scoring, **run, **outputs)
    if results is None:  # not the main process
        return None
    _print_written(results)
    return results


def register_benchmark_command(commands):
    """Registers `benchmark` on an `add_subparsers()` object and returns its parser."""
    parser = commands.add_parser(
        "benchmark", help="Matched official vs untied sweep over NFEs and seeds: GenPPL, entropy, paired CIs, plot."
    )
    add_benchmark_arguments(parser)
    parser.set_defaults(handler=benchmark_command)
    return parser
