"""The options of `untied-sc benchmark`, declared in groups, and the explicit command line a report records."""

import shlex

from untied_sc.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_NFE,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEEDS,
    EVALUATOR_DTYPE_NAMES,
    EXPERIMENTS,
    SMOLLM2_NAME,
)
from untied_sc.input_checks import (
    PROTOCOLS,
)

from .cli_help import EVAL_BATCH_HELP, EVALUATOR_DTYPE_HELP, EVALUATOR_HELP
from .sweep_settings import DEFAULT_SCORING, DEFAULT_TUNING


# Options that define the sweep (what is sampled): a stored sweep fixes them, so scoring one refuses them.
SWEEP_DEFAULTS = {
    "nfe": list(DEFAULT_NFE),
    "seeds": list(DEFAULT_SEEDS),
    "num_samples": DEFAULT_NUM_SAMPLES,
    "batch_size": DEFAULT_BATCH_SIZE,
    "experiment": "main",
    "temperatures": None,
    "diversity_nfe": None,
    "coefficients": None,
}


# Options of the scoring half alone: a --generate-only command line leaves them out (with `--experiment baselines`
# the knobs are chosen in the scoring half too, from the tuning bank the generation stores).
SCORING_OPTIONS = (
    "evaluator",
    "protocol",
    "eval_batch_size",
    "max_length",
    "num_resamples",
    "dtype",
    "cache_dir",
    "store_from",
)

# The knob tuning of `--experiment baselines` (refused with any other experiment and when scoring a stored sweep).
TUNING_DEFAULTS = {
    "tune_seed": DEFAULT_TUNING.seed,
    "tune_num_samples": DEFAULT_TUNING.num_samples,
    "tune_budget": DEFAULT_TUNING.budget,
    "confidence": DEFAULT_TUNING.confidence,
}


def add_benchmark_arguments(parser):
    """Adds the `benchmark` arguments to an `argparse` parser and returns it."""
    parser.add_argument(
        "pipeline",
        nargs="?",
        help="Pipeline folder (or Hub repo id), calibrated at every --nfe (none with --store DIR to score the sweep "
        "sampled into DIR).",
    )
    parser.add_argument("--nfe", type=int, nargs="+", help="NFEs (default 8 16 32 64).")
    parser.add_argument("--seeds", type=int, nargs="+", help="Seeds (default 0 1 2).")
    parser.add_argument("--num-samples", type=int, help="Samples per (sampler, NFE, seed) (default 256).")
    parser.add_argument("--batch-size", type=int, help="Samples per pipeline call, part of the seeding (default 32).")
    parser.add_argument("--evaluator", default=SMOLLM2_NAME, help=EVALUATOR_HELP)
    parser.add_argument("--protocol", choices=PROTOCOLS, help="GenPPL protocol (default: the pipeline's family).")
    parser.add_argument(
        "--temperatures",
        type=float,
        nargs="+",
        help="Diversity sweep of the official sampler (with --experiment baselines: of every sampler, default LangFlow "
        "0.9 1.1, ELF 0.25 0.5): LangFlow x̂ temperatures, or ELF decode temperatures (0: argmax).",
    )
    parser.add_argument("--diversity-nfe", type=int, nargs="+", help="NFEs of the diversity sweep (default: --nfe).")
    parser.add_argument(
        "--experiment",
        choices=EXPERIMENTS,
        help="Sampler set: official vs untied (main, the default), one of the paper's controlled experiments "
        "(placement, components, sensitivity, directions: the solver correction's direction controls), or "
        "baselines: official, untied, Momentum, ACE, HiGS, HiGS + ACE and DPM-Solver++(2M), each comparison "
        "sampler's knob first chosen per NFE on the tuning bank (needs the evaluator, and ACE's direction: "
        "`untied-sc ace`).",
    )
    parser.add_argument(
        "--samplers",
        nargs="+",
        metavar="NAME",
        help="Only these samplers of the experiment, by their report names (e.g. untied HiGS); official, the pairs' "
        "first side, always runs (default: all of them).",
    )
    tuning = parser.add_argument_group("knob tuning of --experiment baselines (as `untied-sc tune`)")
    tuning.add_argument(
        "--tune-seed",
        type=int,
        help="Seed of the tuning bank, in the tuning seed space (default "
        f"{TUNING_DEFAULTS['tune_seed']}, `untied-sc tune`'s).",
    )
    tuning.add_argument(
        "--tune-num-samples",
        type=int,
        help=f"Samples in the tuning bank (default {TUNING_DEFAULTS['tune_num_samples']}).",
    )
    tuning.add_argument(
        "--tune-budget",
        type=int,
        help="Scored candidates per method and NFE in the search, the same for every method (default "
        f"{TUNING_DEFAULTS['tune_budget']}).",
    )
    tuning.add_argument(
        "--confidence",
        type=float,
        help="Level of the equal-entropy GenPPL ratio's interval vs official on the bank that must lie below 1 for a "
        f"method's pick to be kept (default {TUNING_DEFAULTS['confidence']}).",
    )
    tuning.add_argument(
        "--tune-here",
        action="store_true",
        help="With --generate-only (needed there): tune on the bank here, with the evaluator, and sample only the "
        "chosen knob values; `benchmark --store DIR` scores the part as any other (the store gets the bank's samples, "
        "scored there, and no scored bank run).",
    )
    parser.add_argument(
        "--coefficients",
        help="Paper coefficient preset for every untied sampler (e.g. langflow-lm1b) instead of the statistics' own.",
    )
    split = parser.add_mutually_exclusive_group()
    split.add_argument(
        "--generate-only",
        action="store_true",
        help="Only sample, into the run store of --store DIR (needed: the sweep's settings beside its samples), to "
        "score elsewhere with `benchmark --store DIR`.",
    )
    parser.add_argument(
        "--main-only",
        action="store_true",
        help="With --store DIR alone: score the main runs only, not the diversity sweep.",
    )
    parser.add_argument(
        "--store-from",
        metavar="REPORT_JSON",
        nargs="+",
        help="With --store: first read earlier reports (<model>.json, its samples file beside it) into the store: "
        "each run's samples and sampling time under its settings, its scores under its samples and the report's "
        "evaluator, dtype and protocol (with this command's --eval-batch-size and --max-length, which a report does "
        "not record: the first imported score read is scored again as a check). Adding a temperature, a sampler or "
        "an NFE part to a report then samples and scores only the new runs.",
    )
    parser.add_argument(
        "--store",
        metavar="DIR",
        help="A run store: every run sampled or scored here is kept in DIR as soon as it is done, under the hash of "
        "what decides it (a run's samples: the pipeline's family, class and tokenizer, the sampler spec and "
        "coefficients, NFE, seed, temperature, --num-samples, --batch-size; its scores: the samples, the evaluator "
        "and dtype, the protocol, --eval-batch-size and --max-length; with --experiment baselines, each scored "
        "tuning-bank run, as `untied-sc tune --store`, under the pipeline as named here, the bank, the evaluator, "
        "its dtype and the protocol). A later command with the same store reads "
        "what it holds and does only the missing work: a stopped sweep, tuning, scoring or --rescore resumes, a "
        "--generate-only run's sweep is there for the scoring command (`benchmark --store DIR` with no pipeline scores "
        "it, merging the parts sampled into DIR), and the first batch of each sampler read from it is sampled again "
        "and must be identical.",
    )
    split.add_argument(
        "--rescore",
        metavar="REPORT_JSON",
        help="Score the samples of an earlier report (<model>.json, its samples file beside it) again under "
        "--evaluator (or --dtype), as a control of its comparison: the same runs and knobs, every statistic "
        "recomputed, the two evaluators' headlines side by side. Writes <model>-<evaluator>.json/.md/.png, whose "
        "samples are the first report's (not copied).",
    )
    parser.add_argument("--output-dir", default="benchmarks/results", help="Where <model>.json/.md/.png go.")
    parser.add_argument(
        "--name",
        help="Model name of the output files (default: the pipeline folder's name; with --rescore, the report's model "
        "and the evaluator's short name, <model>-<evaluator>).",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace output files that exist (refused by default, before any work).",
    )
    parser.add_argument("--eval-batch-size", type=int, help=EVAL_BATCH_HELP)
    parser.add_argument("--max-length", type=int, help="Evaluator truncation length (default: its context).")
    parser.add_argument(
        "--num-resamples", type=int, default=DEFAULT_SCORING.num_resamples, help="Bootstrap resamples."
    )
    parser.add_argument(
        "--device",
        help="Device of the pipeline and the evaluator (default: the process's own for sampling, i.e. its GPU under "
        "`accelerate launch`, else cuda when there is one, else cpu; cpu for the evaluator). 'cuda' still gives each "
        "process its own GPU.",
    )
    parser.add_argument("--dtype", choices=EVALUATOR_DTYPE_NAMES, default="auto", help=EVALUATOR_DTYPE_HELP)
    parser.add_argument("--cache-dir", help="Evaluator cache folder (default ~/.cache/untied-sc/evaluators).")
    parser.add_argument(
        "--no-progress",
        action="store_true",
        help="No progress bars; the tuning bank's scored runs are logged instead, a timestamped line each.",
    )
    return parser


def benchmark_command_line(args) -> str:
    """The fully explicit `untied-sc benchmark` command of parsed `args` (every option spelled out, defaults included)."""
    words = ["untied-sc", "benchmark"] + ([args.pipeline] if args.pipeline else [])
    skipped = ("pipeline", "command", "handler", "overwrite") + (SCORING_OPTIONS if args.generate_only else ())
    for name, value in vars(args).items():
        if name in skipped or value is None or value is False:
            continue
        option = "--" + name.replace("_", "-")
        if value is True:
            words.append(option)
        elif isinstance(value, list):
            words += [option, *(f"{v:g}" if isinstance(v, float) else str(v) for v in value)]
        else:
            words += [option, str(value)]
    return shlex.join(words)
