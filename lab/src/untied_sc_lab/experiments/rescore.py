"""A benchmark report's samples scored again under a second evaluator (`untied-sc benchmark --rescore`): the control
that a sampler's gain at equal entropy is not one evaluator's taste.

[`rescore_report`] rebuilds the generation a report was scored from (its settings, every run's timing and samples,
from the report and its samples file) and hands it to [`score_sweep`], so every aggregate, the equal-entropy fit and
the headline are computed exactly as for a fresh report; the knobs stay those chosen under the first evaluator
(`knob_tuning` is kept as it was). The samples are stored once: the new report's `samples_file` points to the first
report's. [`evaluator_control`] sets the two reports' headlines side by side, with the rank agreement of the samplers
(Kendall's τ-b, [`kendall_tau`]) and the correlation of the per-sample NLLs under the two evaluators.
"""

import json
import math
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from untied_sc.output_paths import report_paths, rescored_report_name

from ..runs.store import RUN_SETTINGS
from .control_records import ControlRow, EvaluatorControl, HeadlineRatios, NllCorrelation, RankAgreement, ScoredBy
from .generation_record import GENERATION_FORMAT, Generation
from .headline_records import HEAD_TO_HEAD_FIELDS, HeadlineCheck, Headlines, HeadsToHead
from .records import RunRecord
from .report import write_results
from .report_import import read_report_runs
from .report_record import Report
from .sweep import score_sweep
from .sweep_settings import DEFAULT_SCORING, ScoringSettings


# Kept where a report has them (some committed reports lack them).
OPTIONAL_SETTINGS = ("coefficients", "generator_tokenizer", "num_processes", "knob_tuning", "parts")
# What a report must record to be scored again: the sweep's settings, as a sampled sweep holds them (the settings
# that decide a run's samples, [`RUN_SETTINGS`], among them).
GENERATION_SETTINGS = (
    "model",
    *(key for key in RUN_SETTINGS if key not in OPTIONAL_SETTINGS),
    "nfe",
    "seeds",
    "samplers",
    "baseline",
    "diversity_values",
    "diversity_samplers",
    "diversity_nfe",
    "device",
    "torch",
    "command",
)


def report_generation(
    report: dict,
    records: Sequence[RunRecord],
    run_samples: Sequence[Sequence],
    path: str | os.PathLike = "the report",
) -> Generation:
    """The generation a report was scored from, rebuilt from its record, its runs and the samples of each run (in the
    report's order, [`read_report_runs`]): the same runs, knob values, timings and samples, for [`score_sweep`].
    Scores of the first evaluator (the tuning bank's among them) are left behind."""
    missing = [key for key in GENERATION_SETTINGS if key not in report]
    if missing:
        raise ValueError(
            f"--rescore: {path} does not record {', '.join(missing)}: it was written before those were kept, so its "
            "runs cannot be rebuilt. Score its samples with `untied-sc evaluate` instead."
        )
    settings = {
        "format": GENERATION_FORMAT,
        **{key: report[key] for key in GENERATION_SETTINGS},
        **{key: report[key] for key in OPTIONAL_SETTINGS if key in report},
        "seconds": report.get("sampling_seconds", sum(record.seconds for record in records)),
        "runs": [],
    }
    runs = [
        replace(record, samples=samples, scores=None) for record, samples in zip(records, run_samples, strict=True)
    ]
    return replace(Generation.from_json(settings, f"--rescore: {path}"), runs=tuple(runs))


def rescore_report(
    report_path: str | os.PathLike,
    scoring: ScoringSettings = DEFAULT_SCORING,
    *,
    name: str | None = None,
    output_dir: str | os.PathLike | None = None,
    command: str | None = None,
    progress: bool = True,
    evaluator_name: str | None = None,
    scored: dict[tuple, dict] | None = None,
    store=None,
    **evaluator_kwargs,
) -> dict:
    """
    Scores every run of a benchmark report again under `scoring`'s evaluator and analyses them as [`score_sweep`]
    does, with the [`evaluator_control`] against the first report.

    Args:
        report_path: the first report, `<model>.json`, its samples file beside it.
        scoring ([`ScoringSettings`]): the second evaluator, scoring batch size, maximum length and bootstrap; the
            protocol is the first report's (a scoring that names another is refused).
        evaluator_name, progress, **evaluator_kwargs: as in [`score_sweep`].
        name (`str`, *optional*): the new report's file stem and model name (default `<model>-<evaluator's short
            name>`, [`rescored_report_name`]).
        output_dir (`str` or `os.PathLike`, *optional*): where `<name>.json`, `.md` and `.png` go (no samples file:
            `samples_file` names the first report's, relative to `output_dir`); nothing is written when `None`.
        command (`str`, *optional*): the command that rescored (default: this process's argv).
        scored (`dict`, *optional*): runs already scored with the evaluator, as [`score_sweep`] takes them.
        store (`str`, `os.PathLike` or [`RunStore`], *optional*): a store folder that keeps every run scored here,
            so that a stopped rescoring resumes ([`score_sweep`]).

    Returns:
        The results dict of [`score_sweep`], with `rescored_from` (the first report, its evaluator) and
        `evaluator_control`.
    """
    report_path = Path(report_path)
    first, records, run_samples = read_report_runs(report_path, "--rescore")
    # checked before the settings are: a report of another protocol is refused first, whatever else it lacks
    protocol = first["protocol"]
    if scoring.protocol not in (None, protocol):
        raise ValueError(
            f"--rescore: {report_path} was scored under the {protocol} protocol, not {scoring.protocol}: a "
            "rescoring keeps the first report's protocol."
        )
    generation = report_generation(first, records, run_samples, report_path)
    first_report = Report.from_json(first)  # it records the sweep's settings ([`report_generation`] checked)
    settings = first_report.settings
    if isinstance(scoring.evaluator, (str, os.PathLike)):
        evaluator_name = str(scoring.evaluator)
    generation = replace(generation, model=name or rescored_report_name(settings.model, evaluator_name or "evaluator"))
    if output_dir is not None and report_paths(output_dir, generation.model)["json"].resolve() == (
        report_path.resolve()
    ):
        raise ValueError(f"--rescore: {report_path} would be replaced by its own rescoring; give another --name.")
    results = score_sweep(
        generation,
        replace(scoring, protocol=settings.protocol),
        command=command if command is not None else shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        progress=progress,
        main_only=settings.main_only,
        evaluator_name=evaluator_name,
        scored=scored,
        store=store,
        **evaluator_kwargs,
    )
    where = Path(output_dir) if output_dir is not None else report_path.parent
    results["rescored_from"] = {
        "report": os.path.relpath(report_path, where),
        "evaluator": settings.evaluator,
        "evaluator_description": settings.evaluator_description,
    }
    results["evaluator_control"] = control_of_reports(first_report, Report.from_json(results)).to_json()
    results["samples_file"] = os.path.relpath(report_path.parent / settings.samples_file, where)
    if output_dir is not None:
        results["files"] = {key: str(path) for key, path in write_results(results, output_dir).items()}
    return results


def kendall_tau(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Kendall's τ-b of two rankings of the same items: (concordant - discordant pairs) over the square root of the
    pairs untied in a times those untied in b; `None` when either ranking ties everything (or with one item)."""
    concordant = discordant = untied_a = untied_b = 0
    for i in range(len(a)):
        for j in range(i + 1, len(a)):
            sign = (a[i] > a[j]) - (a[i] < a[j]), (b[i] > b[j]) - (b[i] < b[j])
            untied_a += sign[0] != 0
            untied_b += sign[1] != 0
            concordant += sign[0] * sign[1] > 0
            discordant += sign[0] * sign[1] < 0
    return (concordant - discordant) / math.sqrt(untied_a * untied_b) if untied_a and untied_b else None


def pearson(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Pearson's correlation of paired values; `None` when either side does not vary (or is empty)."""
    if not a:
        return None
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    covariance = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    spread = math.sqrt(sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b))
    return covariance / spread if spread else None


def _ranks(values: Sequence[float]) -> list[float]:
    """Ranks from 1, ties given their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for position in order[start : end + 1]:
            ranks[position] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def headline_ratios(report: Report) -> tuple[str | None, Headlines]:
    """Each sampler's headline per NFE: the GenPPL ratio to the baseline at equal entropy with its interval, beside
    the raw paired ratio with its headline interval. The equal-entropy reading is the report's headline: each sampler
    on its own frontier at the baseline's entropy where every sampler was swept (`"frontier"`), else, and where no
    frontier reaches the baseline's entropy (ELF-small at 8 NFE: every sampler raises entropy), the baseline's curve
    at the sampler's entropy (`"baseline curve"`), else none (`None`; raw ratios only). A method its tuning switched
    off runs the baseline's samples, so its frontier is the baseline's own and reaches the baseline's entropy
    trivially: it does not count as a frontier that reaches it."""
    frontiers = report.frontiers.by_sampler if report.frontiers is not None else {}
    reached = any(
        row.ratio is not None and not row.switched_off for by_nfe in frontiers.values() for row in by_nfe.values()
    )
    reading = "frontier" if reached else "baseline curve" if report.equal_entropy else None
    rows = frontiers if reading == "frontier" else report.equal_entropy
    out: dict[str, dict[int, HeadlineRatios]] = {}
    for sampler, by_nfe in report.aggregates.paired.items():
        for nfe, cell in by_nfe.items():
            row = rows.get(sampler, {}).get(nfe)
            out.setdefault(sampler, {})[nfe] = HeadlineRatios(
                None if row is None else row.ratio,
                None if row is None else row.ratio_ci,
                cell.gen_ppl_ratio,
                cell.gen_ppl_ratio_headline_ci or cell.gen_ppl_ratio_ci,
            )
    return reading, out


def _rank_agreement(first: Headlines, second: Headlines, raw: bool) -> dict[int, RankAgreement]:
    """Per NFE, Kendall's τ-b of the samplers' ratios (raw or at equal entropy) under the two evaluators, over those
    with both."""

    def ratio(headlines: Headlines, sampler: str, nfe: int) -> float | None:
        row = headlines.get(sampler, {}).get(nfe)
        return None if row is None else row.ratios(raw)[0]

    agreement = {}
    for nfe in sorted({nfe for by_nfe in first.values() for nfe in by_nfe}):
        ranked = [
            sampler
            for sampler in first
            if ratio(first, sampler, nfe) is not None and ratio(second, sampler, nfe) is not None
        ]
        tau = kendall_tau([ratio(first, s, nfe) for s in ranked], [ratio(second, s, nfe) for s in ranked])
        agreement[nfe] = RankAgreement(tau, len(ranked), ranked)
    return agreement


def _nll_correlation(first: Report, second: Report) -> NllCorrelation:
    """Per-sample NLL per token under the two evaluators, over the samples both scored. A run holding the very
    samples of another (a comparison sampler at its neutral knob runs as official) has the same scores under both
    evaluators as that one: it is counted once."""
    seen, a, b = set(), [], []
    for mine, theirs in zip(first.runs, second.runs, strict=True):
        x, y = mine.scores.per_sample.mean_nll, theirs.scores.per_sample.mean_nll
        key = json.dumps([x, y])
        if key in seen:
            continue
        seen.add(key)
        for u, v in zip(x, y, strict=True):
            if u is not None and v is not None and math.isfinite(u) and math.isfinite(v):
                a.append(u)
                b.append(v)
    measure = "per-sample NLL per token (each evaluator's own tokens)"
    return NllCorrelation(measure, len(a), pearson(a, b), pearson(_ranks(a), _ranks(b)))


def _scored_by(report: Report) -> ScoredBy:
    return ScoredBy(report.settings.evaluator, report.settings.evaluator_description)


def control_of_reports(first: Report, second: Report) -> EvaluatorControl:
    """[`evaluator_control`] of two reports read into records."""
    reading, mine = headline_ratios(first)
    _, theirs = headline_ratios(second)
    by_sampler = {
        sampler: {nfe: ControlRow(row, theirs.get(sampler, {}).get(nfe)) for nfe, row in by_nfe.items()}
        for sampler, by_nfe in mine.items()
    }
    return EvaluatorControl(
        _scored_by(first),
        _scored_by(second),
        reading,
        by_sampler,
        _rank_agreement(mine, theirs, raw=False),
        _rank_agreement(mine, theirs, raw=True),
        _nll_correlation(first, second),
    )


def evaluator_control(first: Mapping, second: Mapping) -> dict:
    """
    Two reports of the same runs under two evaluators, side by side: each sampler's headline ([`headline_ratios`])
    under both, the rank agreement of the samplers per NFE (Kendall's τ-b, over the samplers each report can rank) at
    equal entropy and raw, and the correlation of the per-sample NLLs.

    Returns:
        `dict`, the report's `evaluator_control` ([`EvaluatorControl.to_json`]): `first` and `second` (evaluator and
        its description), `reading` (the equal-entropy reading), `by_sampler` (`{sampler: {nfe: {"first": ratios,
        "second": ratios}}}`), `rank_agreement` (`{"equal_entropy" | "raw": {nfe: {"kendall_tau", "num_ranked",
        "ranked"}}}`) and `nll_correlation`.
    """
    return control_of_reports(Report.from_json(first), Report.from_json(second)).to_json()


# `untied-sc evaluate` on a report's samples reproduces its headline when every number agrees to this (relative): the
# NLLs agree to ~1e-7 across evaluator batchings, the bootstrap draws are seeded alike.
HEADLINE_TOLERANCE = 1e-4
SAMPLES_SUFFIX = ".samples.jsonl.gz"


def reports_of_samples(samples_path: str | os.PathLike) -> list[tuple[Path, dict]]:
    """The benchmark reports beside a samples file that score it, each with its contents, read once: `<model>.json`
    for `<model>.samples.jsonl.gz` first, then the rescorings (`--rescore`) whose `samples_file` names it; none for
    another kind of file, or beside another kind of record (`benchmarks/model_quality.py`'s has rows, not runs)."""
    samples_path = Path(samples_path)
    if not samples_path.name.endswith(SAMPLES_SUFFIX):
        return []
    own = samples_path.with_name(samples_path.name[: -len(SAMPLES_SUFFIX)] + ".json")
    found = []
    for candidate in [own, *sorted(path for path in samples_path.parent.glob("*.json") if path != own)]:
        try:
            report = json.loads(candidate.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if not isinstance(report, dict):
            continue
        names = report.get("samples_file")
        if (candidate == own and "runs" in report) or (
            report.get("rescored_from") and names and (candidate.parent / names).resolve() == samples_path.resolve()
        ):
            found.append((candidate, report))
    return found


def head_to_head_ratios(report: Report) -> HeadsToHead:
    """The report's head to head at equal entropy (each untied sampler against the best other method, both on their
    own frontiers): `{nfe: {"<sampler> vs <against>": HeadToHead}}`; empty where there is none."""
    heads = report.frontiers.head_to_head if report.frontiers is not None else {}
    return {nfe: {f"{row.sampler} vs {row.against}": row for row in rows} for nfe, rows in heads.items() if rows}


# The numbers a headline row gives ([`compare_headlines`] checks each, and a head to head's `HEAD_TO_HEAD_FIELDS`).
HEADLINE_FIELDS = ("ratio", "raw_ratio", "ratio_ci", "raw_ratio_ci")


def _flat_numbers(
    table: Mapping[object, Mapping[object, object]], fields: tuple[str, ...]
) -> dict[tuple, float | None]:
    """Every number of a two-level table of records (a [`headline_ratios`] or [`head_to_head_ratios`] one) by
    (first key, second key, field, position), the keys as the report's JSON spells them."""
    numbers = {}
    for outer, by_inner in table.items():
        for inner, row in by_inner.items():
            for field_name in fields:
                value = getattr(row, field_name)
                values = list(value) if isinstance(value, (list, tuple)) else [value]
                for position, number in enumerate(values):
                    numbers[(str(outer), str(inner), field_name, position)] = number
    return numbers


def compare_headlines(computed: Mapping, report: Mapping) -> HeadlineCheck:
    """[`headline_ratios`] and [`head_to_head_ratios`] of freshly scored runs against a report's: the largest relative
    difference over every number both give, the numbers only one gives, and whether the report is reproduced
    ([`HEADLINE_TOLERANCE`]). The report checked against is left for the caller to name (`report=None`)."""
    computed_report, reported_report = Report.from_json(computed), Report.from_json(report)
    reading, ours = headline_ratios(computed_report)
    report_reading, theirs = headline_ratios(reported_report)
    heads, reported_heads = head_to_head_ratios(computed_report), head_to_head_ratios(reported_report)
    mine, reported = _flat_numbers(ours, HEADLINE_FIELDS), _flat_numbers(theirs, HEADLINE_FIELDS)
    # keyed apart from the samplers' rows: ("head to head", NFE, pair, field, position)
    mine.update({("head to head", *key): value for key, value in _flat_numbers(heads, HEAD_TO_HEAD_FIELDS).items()})
    reported.update(
        {("head to head", *key): value for key, value in _flat_numbers(reported_heads, HEAD_TO_HEAD_FIELDS).items()}
    )
    largest, unmatched = 0.0, []
    for key in sorted(set(mine) | set(reported), key=str):
        a, b = mine.get(key), reported.get(key)
        if a is None or b is None:
            if (a is None) != (b is None):
                unmatched.append(tuple(map(str, key)))
            continue
        largest = max(largest, abs(a - b) / max(abs(b), 1e-300))
    return HeadlineCheck(
        reading,
        ours,
        theirs,
        heads,
        reported_heads,
        largest,
        unmatched,
        reading == report_reading and not unmatched and largest <= HEADLINE_TOLERANCE,
    )
