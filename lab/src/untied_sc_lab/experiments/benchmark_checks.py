"""The refusals of `untied-sc benchmark` that need no model: run before torch loads, so that hours of work do not
end in a refusal.
"""

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from untied_sc.input_checks import (
    check_source_exists,
)

from .benchmark_options import SWEEP_DEFAULTS, TUNING_DEFAULTS


# What these checks need (reports, the pipeline's folder) is imported lazily: they run before torch loads.


@dataclass(frozen=True)
class Refusal:
    """A combination of options a sampling `benchmark` refuses (`refused(args)`), and what the refusal says."""

    refused: Callable[[argparse.Namespace], bool]
    message: str


def _baselines(args) -> bool:
    return args.experiment == "baselines"


# The options a sampling `benchmark` refuses together, in the order they are checked ([`refuse_combinations`]). The
# tuning bank's runs and --store: the one-machine run keeps each scored bank run in its store and resumes its tuning
# from there; --generate-only --tune-here scores its bank here only to choose the knobs, so its store gets the bank's
# samples (scored again by `benchmark --store DIR`, [`choose_from_bank`]) and no scored bank run, and it samples every
# bank run again rather than read one.
SAMPLING_RULES = (
    Refusal(
        lambda args: args.main_only,
        "--main-only scores part of a sampled sweep: use it with --store DIR without a pipeline (or leave "
        "--temperatures out).",
    ),
    Refusal(
        lambda args: args.tune_here and not (_baselines(args) and args.generate_only),
        "--tune-here chooses the comparison samplers' knobs before sampling a part: use it with --experiment "
        "baselines --generate-only (without --generate-only the run always chooses first).",
    ),
    Refusal(
        lambda args: _baselines(args) and args.generate_only and not args.tune_here,
        "--experiment baselines --generate-only needs --tune-here: the comparison samplers are tuned by a search "
        "whose candidates depend on the scores, so the evaluator must be where the tuning bank is sampled.",
    ),
    Refusal(
        lambda args: args.generate_only and not args.store,
        "--generate-only samples a sweep to score elsewhere: give the run store that carries it, --store DIR (then "
        "score it with `untied-sc benchmark --store DIR`).",
    ),
)


def refuse_combinations(args, rules: Sequence[Refusal]) -> None:
    """Exits with the message of the first of `rules` that refuses `args`."""
    for rule in rules:
        if rule.refused(args):
            raise SystemExit(rule.message)


OTHER_NAME = "give --name NAME (or --output-dir) to write elsewhere"


def refuse_existing_outputs(paths, overwrite: bool) -> None:
    """Before any work: refuses to replace an existing result unless `--overwrite` is given."""
    existing = [str(path) for path in paths if Path(path).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: pass --overwrite to replace "
            "the results, or --name NAME (or --output-dir) to write them elsewhere."
        )


def benchmark_outputs(args, name: str) -> list[Path]:
    """The files this `benchmark` command writes for the model name `name`."""
    from untied_sc.output_paths import report_paths

    if args.generate_only:  # the store holds the sweep
        return []
    return list(report_paths(args.output_dir, name, samples=not args.rescore).values())


def scores_generation(args) -> bool:
    """Whether `benchmark` scores a `--generate-only` sweep: `--store DIR` with no pipeline (the sweep stored in
    DIR)."""
    return bool(args.store and not args.pipeline and not args.generate_only)


def check_generation_scoring(args) -> str | None:
    """`--store DIR` without a pipeline, before any work: no sweep option beside the stored sweep (it fixes them), and
    the outputs named by `--name` or the sweep's model are new (or `--overwrite`)."""
    from .stored_sweeps import stored_model

    options = (*SWEEP_DEFAULTS, *TUNING_DEFAULTS, "samplers")
    given = [f"--{k.replace('_', '-')}" for k in options if getattr(args, k) is not None]
    given += ["--tune-here"] if args.tune_here else []
    if given:
        raise SystemExit(
            f"--store scores the sweep stored in {args.store}; drop {' '.join(given)} (the pipeline and the sweep "
            "options were fixed when it was generated)."
        )
    check_store_from(args)
    model = stored_model(args.store)  # read_stored_sweeps says what is wrong with the store
    if args.name or model:
        refuse_existing_outputs(benchmark_outputs(args, args.name or model), args.overwrite)
    return args.name or model


# Options that choose what is sampled, or how scores are taken: a report's rescoring has them fixed by the report.
RESCORE_FIXED = (*SWEEP_DEFAULTS, *TUNING_DEFAULTS, "samplers", "protocol")


def _ran_dtype(report: dict) -> str | None:
    """The dtype a report's evaluator ran in, from its description ("..., run in float32"); `None` when unrecorded."""
    _, found, dtype = (report.get("evaluator_description") or "").rpartition(", run in ")
    return dtype if found and dtype else None


def _is_same_evaluator(given: str, recorded: str) -> bool:
    """One evaluator by name, or one model folder by two spellings of its path."""
    if given == recorded:
        return True
    paths = Path(given).expanduser(), Path(recorded).expanduser()
    return all(path.exists() for path in paths) and paths[0].resolve() == paths[1].resolve()


def _scored_like_this_run(args, report: dict) -> tuple[bool, str]:
    """Whether `report` was scored by `--evaluator` (same name or same folder) in this run's dtype, and that dtype."""
    from untied_sc.hardware import auto_dtype_name

    dtype = args.dtype if args.dtype != "auto" else auto_dtype_name(args.device or "cpu")
    same = _is_same_evaluator(str(args.evaluator), str(report["evaluator"]))
    return same and _ran_dtype(report) in (dtype, None), dtype


def check_rescore(args) -> str:
    """`--rescore`, before any work: no pipeline or option the report fixes, the report and its samples exist, the
    evaluator differs from the report's (in name or dtype), and the outputs are new (or `--overwrite`) and are not the
    report itself. Returns the new report's name."""
    from untied_sc.input_checks import read_benchmark_report
    from untied_sc.output_paths import rescored_report_name

    given = [f"--{key.replace('_', '-')}" for key in RESCORE_FIXED if getattr(args, key) is not None]
    given += [option for option, on in (("--tune-here", args.tune_here), ("--main-only", args.main_only)) if on]
    if args.pipeline or given:
        extra = ([args.pipeline] if args.pipeline else []) + given
        raise SystemExit(
            f"--rescore scores the runs of {args.rescore} again; drop {' '.join(extra)} (the pipeline, the sweep, "
            "the knobs and the protocol are the report's)."
        )
    report = read_benchmark_report(args.rescore, "--rescore")
    alike, dtype = _scored_like_this_run(args, report)
    if alike:
        raise SystemExit(
            f"--rescore: {args.rescore} was scored with {report['evaluator']} in {_ran_dtype(report) or 'its dtype'} "
            "already: nothing to control. Give another --evaluator (e.g. gemma3-270m) or --dtype."
        )
    check_store_from(args)
    same = _is_same_evaluator(str(args.evaluator), str(report["evaluator"]))
    name = args.name or rescored_report_name(
        report.get("model") or Path(args.rescore).stem, args.evaluator, dtype if same else None
    )
    outputs = benchmark_outputs(args, name)
    if Path(outputs[0]).resolve() == Path(args.rescore).resolve():
        raise SystemExit(f"--rescore: --name {name} would replace {args.rescore} itself; give another --name.")
    refuse_existing_outputs(outputs, args.overwrite)
    return name


def check_store_from(args) -> None:
    """`--store-from`, before any work: beside `--store`, and each report and its samples file exist (the runs are
    read where the store is opened, [`_open_store`])."""
    from untied_sc.input_checks import read_benchmark_report

    if args.store_from and not args.store:
        raise SystemExit("--store-from reads reports into a run store: give the store with --store DIR.")
    for path in args.store_from or ():
        read_benchmark_report(path, "--store-from", " Give a report with its samples file beside it.")


def check_sweep_arguments(args) -> str:
    """A sampling `benchmark`, before any work: a pipeline is named and exists, the options fit together, the sweep
    options get their defaults, and the outputs are new (or `--overwrite`). Returns the model name of the files."""
    from .definitions import experiment_name

    if not args.pipeline:
        raise SystemExit("Name a pipeline folder (or Hub id) to benchmark, or score a sampled sweep with --store DIR.")
    check_store_from(args)
    for key, default in SWEEP_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    baselines = args.experiment == "baselines"
    given = [f"--{key.replace('_', '-')}" for key in TUNING_DEFAULTS if getattr(args, key) is not None]
    if given and not baselines:
        raise SystemExit(
            f"{' '.join(given)} tune the comparison samplers' knobs: use them with --experiment baselines."
        )
    refuse_combinations(args, SAMPLING_RULES)
    if args.samplers:
        from .definitions import select_samplers

        try:
            select_samplers(args.experiment, args.samplers)
        except ValueError as error:
            raise SystemExit(f"--samplers: {error}") from None
    for key, default in TUNING_DEFAULTS.items():
        if baselines and getattr(args, key) is None:
            setattr(args, key, default)
    check_source_exists(args.pipeline, "a pipeline folder", "PIPELINE")  # after the options, which say more
    name = (
        args.name
        or experiment_name(args.pipeline, args.experiment, args.coefficients)
        or Path(str(args.pipeline).rstrip("/")).name  # as `sweep.default_name`
    )
    refuse_existing_outputs(benchmark_outputs(args, name), args.overwrite)
    return name
