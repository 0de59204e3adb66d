"""A benchmark report's headline computed again from its samples' scores and checked against the report
(`untied-sc evaluate REPORT.samples.jsonl.gz`).
"""

import argparse
import sys
from dataclasses import replace
from typing import TYPE_CHECKING


# The evaluation and rescoring code is imported where it is used: `evaluate --help` loads nothing heavy.
if TYPE_CHECKING:
    from .control_records import HeadlineRatios
    from .equal_entropy_records import HeadToHead
    from .headline_records import HeadlineCheck


# A ratio and its interval where the report gives none.
NO_RATIO = (None, None)


def _ratio_text(ratio, interval) -> str:
    if ratio is None:
        return "n/a"
    return f"{ratio:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def _reported(row: "HeadlineRatios | HeadToHead | None", raw: bool = False) -> tuple:
    """A reported row's ratio and interval at equal entropy, or a headline row's raw ones ([`NO_RATIO`] where the
    report has no such row)."""
    return NO_RATIO if row is None else row.ratios(raw) if raw else (row.ratio, row.ratio_ci)


def check_report_headline(
    args: argparse.Namespace, samples, runs: list[dict], evaluator, described: str
) -> "HeadlineCheck | None":
    """
    The samples file of a benchmark report: the report's headline (each sampler's GenPPL ratio at equal entropy and
    raw, with intervals, [`headline_ratios`]; untied against the best other method, [`head_to_head_ratios`]) computed
    again from `runs`, the run-by-run scores just made, exactly as `benchmark --rescore` computes it, and checked
    number by number against the report beside the file that this evaluator and dtype scored (`<model>.json`, or one
    of its rescorings): the [`HeadlineCheck`] naming that report, or with `report` and `reproduced` `None` where
    no report beside the file was scored by this evaluator. `None` for a file of no report.
    """
    from ..evaluation.io import group_runs, samples_key
    from .rescore import HEADLINE_TOLERANCE, compare_headlines, reports_of_samples, rescore_report
    from .sweep_settings import ScoringSettings

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
            ScoringSettings(
                evaluator=evaluator,
                eval_batch_size=args.eval_batch_size,
                max_length=args.max_length,
                num_resamples=args.num_resamples,
            ),
            evaluator_name=args.evaluator,
            progress=False,
            scored=scored,
        )
    except ValueError as error:  # a report that records no settings: run by run only
        print(f"{source}: its headline is not computed again ({error})", file=sys.stderr)
        return None
    reference, reported = same_scoring[0] if same_scoring else (None, computed)
    check = compare_headlines(computed, reported)
    print(f"Headline ({check.reading or 'raw ratios only'}), GenPPL ratio to {computed['baseline']}:")
    for sampler, by_nfe in check.by_sampler.items():
        for nfe, row in by_nfe.items():
            line = (
                f"  {sampler}, NFE {nfe}: at equal entropy {_ratio_text(*row.ratios(raw=False))}, "
                f"raw {_ratio_text(*row.ratios(raw=True))}"
            )
            if reference is not None:
                was = check.reported.get(sampler, {}).get(nfe)
                line += f" (report: {_ratio_text(*_reported(was))}, raw "
                line += f"{_ratio_text(*_reported(was, raw=True))})"
            print(line)
    for nfe, by_pair in check.head_to_head.items():
        for pair, row in by_pair.items():
            line = f"  head to head, NFE {nfe}, {pair} at equal entropy: {_ratio_text(*_reported(row))}"
            if reference is not None:
                was = check.reported_head_to_head.get(nfe, {}).get(pair)
                line += f" (report: {_ratio_text(*_reported(was))})"
            print(line)
    if reference is None:
        scored_by = "; ".join(f"{path.name}: {report.get('evaluator_description')}" for path, report in reports)
        print(
            f"No report beside {args.samples} was scored by {described}, so nothing to check these against ({scored_by})."
            " Pass the --evaluator and --dtype of one of them to check its headline."
        )
        return replace(check, reproduced=None)
    verdict = "Reproduces" if check.reproduced else "Does NOT reproduce"
    print(
        f"{verdict} {reference}'s headline: largest relative difference "
        f"{check.max_relative_difference:.1e} (tolerance {HEADLINE_TOLERANCE:g})"
        + (f"; given by one side only: {[list(name) for name in check.unmatched]}" if check.unmatched else "")
    )
    return replace(check, report=str(reference))
