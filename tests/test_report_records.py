"""A whole report as a record (`experiments/report_record.py`): every committed report reads into a `Report`, and
each part the analysis writes (diversity curves, equal-entropy rows, frontiers, the evaluator control, the
provenance records, the interval settings) written back gives the same JSON, key for key and in order."""

import json
from pathlib import Path

import pytest

from untied_sc_lab.evaluation.aggregates import CurvePoint, curves_from_json, curves_to_json
from untied_sc_lab.experiments.equal_entropy_records import (
    Frontiers,
    equal_entropy_from_json,
    equal_entropy_to_json,
)
from untied_sc_lab.experiments.provenance import (
    Provenance,
    RescoredFrom,
    ReusedSamples,
    ReusedScores,
    SampledPart,
    ScoreParts,
)
from untied_sc_lab.experiments.report_record import Report
from untied_sc_lab.experiments.report_settings import SAMPLE_UNIT, IntervalRule, ResamplingUnit
from untied_sc_lab.runs.store import StoreRecord


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _committed_reports() -> list[Path]:
    paths = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("runs"), list) and "aggregates" in data:
            paths.append(path)
    return paths


REPORTS = _committed_reports()


def _same(a, b) -> None:
    """Equal JSON, key order included."""
    assert json.dumps(a) == json.dumps(b)


def test_the_committed_reports_are_all_found():
    assert len(REPORTS) >= 29


@pytest.mark.parametrize("path", REPORTS, ids=lambda path: path.stem)
def test_a_committed_report_reads_into_a_record_and_its_written_parts_round_trip(path):
    data = json.loads(path.read_text())
    report = Report.from_json(data)
    settings = report.settings
    assert (
        settings.model == data["model"] and list(settings.nfe) == data["nfe"] and len(report.runs) == len(data["runs"])
    )
    assert report.samplers == data["samplers"]  # the specs stay the report's mappings
    knob = data["diversity_knob"]
    _same(curves_to_json(report.diversity_curves, knob), data["diversity_curves"])
    _same(equal_entropy_to_json(report.equal_entropy), data["equal_entropy"])
    _same(settings.resampling_unit.to_json(), data["resampling_unit"])
    if "interval_rule" in data:
        _same(settings.interval_rule.to_json(), data["interval_rule"])
    else:
        assert settings.interval_rule is None
    assert (report.frontiers is None) == ("frontiers" not in data)
    if report.frontiers is not None:
        _same(report.frontiers.to_json(), data["frontiers"])
    assert (report.evaluator_control is None) == ("evaluator_control" not in data)
    if report.evaluator_control is not None:
        _same(report.evaluator_control.to_json(), data["evaluator_control"])
    assert (report.knob_tuning is None) == ("knob_tuning" not in data)
    provenance = report.provenance
    _same([part.to_json() for part in provenance.parts], data.get("parts") or [])
    for key in ("store", "reused_samples", "reused_scores", "bank_scores_reused", "score_parts", "rescored_from"):
        record = getattr(provenance, key)
        assert (record is None) == (key not in data)
        if record is not None:
            _same(record.to_json(), data[key])
    coefficients = data.get("coefficients") or {}
    assert {s: {str(n): c for n, c in by_nfe.items()} for s, by_nfe in report.coefficients.items()} == coefficients


def test_every_part_is_held_by_some_committed_report():
    """The round trip above is not vacuous: each part occurs in the committed reports."""
    parts = [Report.from_json(json.loads(path.read_text())) for path in REPORTS]
    assert any(r.diversity_curves for r in parts) and any(r.equal_entropy for r in parts)
    assert any(r.frontiers and r.frontiers.head_to_head for r in parts) and any(r.evaluator_control for r in parts)
    assert any(r.knob_tuning and r.knob_tuning.is_grid for r in parts)
    assert any(r.knob_tuning and not r.knob_tuning.is_grid for r in parts)
    for key in ("reused_samples", "reused_scores", "score_parts", "rescored_from"):
        assert any(getattr(r.provenance, key) for r in parts), key
    assert any(len(r.provenance.parts) > 1 for r in parts)
    assert any(r.settings.interval_rule for r in parts) and any(r.coefficients for r in parts)


def test_nfe_keys_are_integers_in_memory_and_strings_in_json():
    data = {"untied": {"8": [{"temperature": 0.9, "default": False, **_stats()}]}}
    curves = curves_from_json(data, "temperature")
    (point,) = curves["untied"][8]
    assert point == CurvePoint(0.9, False, *_mean_se())
    _same(curves_to_json(curves, "temperature"), data)
    rows = {"official": {"16": _row()}}
    assert list(equal_entropy_from_json(rows)["official"]) == [16]
    _same(equal_entropy_to_json(equal_entropy_from_json(rows)), rows)


def _stats() -> dict:
    return {"gen_ppl": {"mean": 100.0, "se": 2.0, "n": 3}, "entropy": {"mean": 4.0, "se": None, "n": 1}}


def _mean_se():
    from untied_sc_lab.evaluation.aggregates import MeanSE

    return MeanSE(100.0, 2.0, 3), MeanSE(4.0, None, 1)


def _row() -> dict:
    return {
        "entropy": 4.0,
        "gen_ppl": 90.0,
        "baseline_gen_ppl_at_entropy": None,
        "ratio": None,
        "ratio_ci": None,
        "fraction_outside": 1.0,
        "entropy_resampled": True,
    }


def test_a_store_record_writes_bank_counts_and_imports_only_where_there_are_some():
    plain = {
        "folder": "/runs",
        "samples_read": 2,
        "samples_written": 1,
        "scores_read": 2,
        "scores_written": 1,
        "checked_runs": ["official at NFE 8, seed 0"],
    }
    record = StoreRecord.from_json(plain)
    assert record.banks_read == 0 and record.imported is None
    _same(record.to_json(), plain)
    full = {**plain, "banks_read": 3, "imported": [{"report": "a.json", "runs": 2, "bank_runs": 1}]}
    _same(StoreRecord.from_json(full).to_json(), full)


def test_a_report_without_provenance_or_interval_settings_reads_their_defaults():
    provenance = Provenance.from_json({})
    assert provenance == Provenance() and provenance.devices == set()
    assert SAMPLE_UNIT == ResamplingUnit("sample", "", "seed")
    part = {"nfe": [8], "command": "untied-sc benchmark", "seconds": 1.5, "device": "cpu", "torch": "2.0"}
    assert Provenance.from_json({"parts": [part, {**part, "device": "cuda"}]}).devices == {
        ("cpu", "2.0"),
        ("cuda", "2.0"),
    }
    _same(SampledPart.from_json(part).to_json(), part)
    for record, data in (
        (ReusedScores, {"report": "a.json", "runs": 3, "checked_run": "x", "checked_difference": 1e-9}),
        (ReusedSamples, {"report": "a.json", "runs": 3, "checked_runs": []}),
        (ScoreParts, {"folder": "/p", "read": 0, "written": 4}),
        (RescoredFrom, {"report": "a.json", "evaluator": "smollm2-135m"}),
        (IntervalRule, {"threshold_clusters": 50, "below": "t", "otherwise": "bootstrap", "why": "few"}),
    ):
        _same(record.from_json(data).to_json(), data)
    assert Frontiers.from_json({"by_sampler": {}, "head_to_head": {"8": []}}).head_to_head == {8: []}
