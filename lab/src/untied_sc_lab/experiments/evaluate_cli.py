"""`untied-sc evaluate`: scores a samples file (GenPPL, entropy, Rep-4, distinct-n), optionally paired with a
baseline; a benchmark report's samples run by run, with the report's headline checked ([`check_report_headline`]).
"""

import argparse
import json
import sys
from pathlib import Path

from untied_sc.defaults import (
    EVALUATOR_DTYPE_NAMES,
    SMOLLM2_NAME,
)
from untied_sc.input_checks import (
    PROTOCOLS,
    check_samples_file,
    recorded_protocol,
    resolve_protocol,
)

from .cli_help import EVAL_BATCH_HELP, EVALUATOR_DTYPE_HELP, EVALUATOR_HELP
from .headline_check import check_report_headline


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads.


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
        "samples file records (<stem>.json beside it); required for any other JSONL.",
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
    ([`check_report_headline`]); with it, each file is scored whole and the two are paired sample by sample. Started as
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
        headline = check_report_headline(args, samples, runs, evaluator, described)
        if headline is not None:
            result["headline"] = headline.to_json()
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
