"""The scores of an earlier report, taken for the runs whose samples it already scored (`benchmark --reuse-scores`).

Adding a part to a sweep (`--from` with one more NFE) would otherwise score every run again, and on a CPU the
evaluator is the costly half of a benchmark. A report keeps each run's scores and, in its samples file, the samples
themselves: a run whose samples are identical (texts and token ids) takes its record from it. The report must name the
same evaluator, dtype and protocol; what a report does not record (`--max-length`, the evaluator's files) is
checked by scoring one reused run again, which must agree (batch padding and another device move the numbers by
~1e-6, well inside; another --max-length or evaluator files do not).

The tuning bank of `--experiment baselines` is not in a report's samples file; a report scored with `--from` keeps
its scores under each bank run's [`samples_fingerprint`] (`bank_scores`), lent the same way (one bank run checked).
"""

import hashlib
import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from untied_sc.generation import Sample, read_samples
from untied_sc.input_checks import read_benchmark_report

from ..evaluation.io import samples_key
from .aggregation import AGGREGATED_METRICS


# Relative tolerance of the spot check on each sample's NLL sum: another device or batch padding moves it by ~1e-6;
# another --max-length, dtype or evaluator moves it by far more.
SPOT_CHECK_TOLERANCE = 1e-4

# Per-sample records a report's run keeps (the intervals and the equal-entropy control resample them).
PER_SAMPLE_KEYS = ("mean_nll", "nll_sum", "num_tokens", "entropy")


def samples_fingerprint(samples: Sequence[Sample]) -> str:
    """[`samples_key`] as a short sha256 hex digest: names a tuning-bank run in a report without its samples."""
    return hashlib.sha256(json.dumps(samples_key(samples)).encode()).hexdigest()[:32]


@dataclass
class ReusableScores:
    """An earlier report's scores: benchmark runs by [`samples_key`], as [`evaluate_samples`] returns them, and
    tuning-bank runs by [`samples_fingerprint`], as [`score_bank_samples`] returns them."""

    path: str
    evaluator: str
    evaluator_description: str
    protocol: str
    by_samples: dict[tuple, dict] = field(default_factory=dict)
    bank: dict[str, dict] = field(default_factory=dict)


def _scoring_result(record: Mapping) -> dict:
    """A report's run record turned back into the scoring result it was made from (what a run record needs)."""
    per_sample = record["per_sample"]
    count = len(per_sample["nll_sum"])
    return {
        "num_samples": record["num_samples"],
        "num_scored": record["num_scored"],
        "num_tokens": record["num_tokens"],
        **{key: record.get(key) for key in AGGREGATED_METRICS if key != "samples_per_second"},
        "per_sample": [{key: per_sample[key][i] for key in PER_SAMPLE_KEYS} for i in range(count)],
    }


def read_report_runs(path: str | os.PathLike, option: str, remedy: str = "") -> tuple[dict, list[list[Sample]]]:
    """
    A benchmark report (`<model>.json`) and the samples of each of its runs, in the report's order, from its samples
    file. The file may hold runs the report does not: a rescoring of part of a larger report's runs shares that
    report's file (samples are stored once).

    Raises:
        `ValueError`: the file is not a benchmark report, its samples file is missing (`remedy` ends that error), or
        it does not hold each run's samples (`option`, the argument that named the report, begins every error).
    """
    path = Path(path)
    report = read_benchmark_report(path, option, remedy)
    knob = report.get("diversity_knob", "temperature")
    by_run: dict[tuple, list[Sample]] = {}
    for sample in read_samples(path.parent / report["samples_file"]):
        by_run.setdefault((sample.sampler, sample.nfe, sample.seed, sample.extra.get(knob)), []).append(sample)
    runs = []
    for record in report["runs"]:
        wanted = (record["sampler"], record["nfe"], record["seed"], record.get(knob))
        run = by_run.get(wanted, [])
        if len(run) != record["num_samples"]:
            raise ValueError(
                f"{option}: {report['samples_file']} holds {len(run)} samples of {path}'s run {wanted} (sampler, NFE, "
                f"seed, knob), not its {record['num_samples']}: one of the two was edited or replaced."
            )
        runs.append(run)
    return report, runs


def read_report_scores(path: str | os.PathLike) -> ReusableScores:
    """
    Reads a benchmark report (`<model>.json`) and its samples file for [`score_sweep`]'s `reuse_scores`
    ([`read_report_runs`]: a report written without its samples cannot lend scores, nothing shows which samples they
    belong to).
    """
    report, runs = read_report_runs(path, "--reuse-scores", " Score without --reuse-scores.")
    reusable = ReusableScores(str(path), report["evaluator"], report.get("evaluator_description"), report["protocol"])
    for record, run in zip(report["runs"], runs, strict=True):
        reusable.by_samples[samples_key(run)] = _scoring_result(record)
    for fingerprint, scores in report.get("bank_scores", {}).items():
        # a bank run's per-sample records (the equal-entropy search); reports of the fixed-grid rule keep mean NLLs
        # alone, which the search cannot read: those are scored again
        if isinstance(scores, dict):
            reusable.bank[fingerprint] = dict(scores)
    return reusable


def reusable_scores(
    reuse_scores: str | os.PathLike | ReusableScores, evaluator: str, evaluator_description: str, protocol: str
) -> ReusableScores:
    """`reuse_scores` read ([`read_report_scores`]) unless it already was, and checked ([`check_reusable`])."""
    reusable = reuse_scores if isinstance(reuse_scores, ReusableScores) else read_report_scores(reuse_scores)
    check_reusable(reusable, evaluator, evaluator_description, protocol)
    return reusable


def check_reusable(reusable: ReusableScores, evaluator: str, evaluator_description: str, protocol: str) -> None:
    """Refuses scores made by another evaluator, dtype or protocol than this scoring's."""
    mine = {"evaluator": evaluator, "evaluator_description": evaluator_description, "protocol": protocol}
    differ = [key for key, value in mine.items() if getattr(reusable, key) != value]
    if differ:
        theirs = ", ".join(f"{key} {getattr(reusable, key)!r} (here {mine[key]!r})" for key in differ)
        raise ValueError(
            f"--reuse-scores: {reusable.path} was scored with {theirs}: its scores are not this scoring's. Score "
            "with its evaluator, --dtype and --protocol, or without --reuse-scores."
        )


def spot_check(reused: Sequence[float], fresh: Sequence[float], path: str, run: str) -> float:
    """The largest relative difference between a reused run's per-sample NLLs and the same run's scored here (NaN
    where both left a sample unscored); raises when it exceeds [`SPOT_CHECK_TOLERANCE`] (other scoring options)."""
    worst = 0.0
    for old, new in zip(reused, fresh, strict=True):
        if math.isnan(old) and math.isnan(new):
            continue
        if math.isnan(old) or math.isnan(new):  # scored on one side only
            worst = math.inf
            break
        worst = max(worst, abs(old - new) / max(abs(old), abs(new), 1e-12))
    if worst > SPOT_CHECK_TOLERANCE:
        raise ValueError(
            f"--reuse-scores: run {run} scored here differs from {path} by {worst:.2g} (relative NLL): the report was "
            "scored with other options (--max-length, the evaluator's files). Score without --reuse-scores."
        )
    return worst


def lend_or_score(
    earlier,
    lent: dict | None,
    score: Callable[[], object],
    nlls: Callable[[object], Sequence[float]],
    path: str,
    run: str,
) -> tuple[object, dict | None]:
    """
    One run's scores under `--reuse-scores`: the `earlier` report's (`None` when it does not hold the run) once a run
    has been checked, else `score()`; the first run the report holds is scored and [`spot_check`]ed on `nlls`.

    Returns `(scores, lent)`: `lent` is `None` until the check, then the record of what was lent (`report`, `runs`
    taken, `checked_run`, `checked_difference`), counted up here.
    """
    if earlier is not None and lent is not None:
        lent["runs"] += 1
        return earlier, lent
    result = score()
    if earlier is not None:
        difference = spot_check(nlls(earlier), nlls(result), path, run)
        lent = {"report": path, "runs": 0, "checked_run": run, "checked_difference": difference}
    return result, lent
