"""Re-analyse committed benchmark reports from their run records, and re-render them (JSON, Markdown, plot).

A report's statistics are a function of its per-sample records (`untied_sc_lab.experiments.aggregation.analyse`):
when the way intervals or the equal-entropy control are computed changes, the committed reports are brought up to
date with

    python benchmarks/rerender_reports.py benchmarks/results/*.json --overwrite

Reports analysed without the few-cluster intervals keep their bootstrap-only tables (they re-render byte for
byte); `--small-sample-intervals` adds the t-interval and bootstrap-t beside the cluster bootstrap and the headline
rule (`untied_sc_lab.experiments.aggregation.INTERVAL_RULE`), as every new report has them.

A report rescored under a second evaluator (`untied-sc benchmark --rescore`) has its evaluator control recomputed
from the report it rescored, re-rendered first when both are given.

Files that are not benchmark reports (quality, per-noise, overhead tables) are skipped. The scores themselves
(per-sample NLLs, entropies, repetition) are not recomputed: that needs the samples. Reports rewritten in place need
`--overwrite` (they are somebody's results).
"""

import argparse
import json
import shlex
from pathlib import Path

import torch

from untied_sc_lab.evaluation.evaluator import describe_evaluator
from untied_sc_lab.experiments.aggregation import analyse
from untied_sc_lab.experiments.report import write_results
from untied_sc_lab.experiments.rescore import evaluator_control


def _option(command: str | None, name: str) -> str | None:
    """The value of `--name VALUE` in a recorded command line (`None` when absent)."""
    words = shlex.split(command or "")
    return words[words.index(name) + 1] if name in words[:-1] else None


def _generator_tokenizer(results: dict) -> str | None:
    """The generating model's tokenizer, described from the pipeline folder its command names (if still here)."""
    from untied_sc.generation.sampling import tokenizer_description

    words = shlex.split(results.get("command") or "")
    folder = next((Path(w) for w in words[2:3] if not w.startswith("-")), None)
    if folder is None or not (folder / "tokenizer").is_dir():
        return None
    from transformers import AutoTokenizer

    return tokenizer_description(AutoTokenizer.from_pretrained(folder / "tokenizer"))


def rerender(path: Path, overwrite: bool, small_sample: bool = False) -> bool:
    results = json.loads(path.read_text())
    if not isinstance(results.get("runs"), list) or "aggregates" not in results:
        return False
    if not overwrite:
        raise SystemExit(f"{path} is a committed report; pass --overwrite to rewrite it in place.")
    scoring = results.get("scoring_command") or results["command"]
    dtype = _option(scoring, "--dtype") or "float32"
    results["evaluator_description"] = describe_evaluator(results["evaluator"], getattr(torch, dtype))
    if results["protocol"] == "langflow" and not results.get("generator_tokenizer"):
        results["generator_tokenizer"] = _generator_tokenizer(results)
    resamples = int(_option(scoring, "--num-resamples") or 1000)
    analyse(results, num_resamples=resamples, small_sample=True if small_sample else None)
    if "rescored_from" in results:  # `benchmark --rescore`: the control reads the first report as it now stands
        first = json.loads((path.parent / results["rescored_from"]["report"]).read_text())
        results["evaluator_control"] = evaluator_control(first, results)
    write_results(results, path.parent, stem=path.stem)  # a report's file name can differ from its model's
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reports", nargs="+", type=Path, help="Report JSON files (others are skipped).")
    parser.add_argument("--overwrite", action="store_true", help="Rewrite the reports in place.")
    parser.add_argument(
        "--small-sample-intervals",
        action="store_true",
        help="Add the t-interval and bootstrap-t and the headline rule to reports analysed before they existed.",
    )
    args = parser.parse_args()
    # a rescored report after the report it rescored (its control reads that one's new numbers)
    for path in sorted(args.reports, key=lambda path: b'"rescored_from"' in path.read_bytes()):
        done = rerender(path, args.overwrite, args.small_sample_intervals)
        print(f"{'re-rendered' if done else 'skipped (not a benchmark report)'}: {path}")


if __name__ == "__main__":
    main()
