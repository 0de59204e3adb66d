"""The run record (`experiments/records.py`): a report's runs read into records and written back give the same JSON,
key for key, for every committed report; a scoring result becomes the record a fresh report holds."""

import json
from pathlib import Path

import pytest

from untied_sc.generation import Sample
from untied_sc_lab.experiments.records import (
    DEFAULT_KNOB,
    PER_SAMPLE_KEYS,
    SCORE_METRICS,
    PerSample,
    RunRecord,
    RunScores,
    report_knob,
    report_records,
)


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _reports() -> list[Path]:
    found = []
    for path in sorted(RESULTS.glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and "aggregates" in report and isinstance(report.get("runs"), list):
            found.append(path)
    return found


@pytest.mark.parametrize("path", _reports(), ids=lambda path: path.stem)
def test_every_committed_reports_runs_round_trip_key_for_key(path):
    report = json.loads(path.read_text())
    knob = report["diversity_knob"]
    for run in report["runs"]:
        record = RunRecord.from_json(run, knob)
        assert record.key == (run["sampler"], run["nfe"], run["seed"], run[knob])
        assert json.dumps(record.to_json(knob)) == json.dumps(run)


def _result(count: int = 2) -> dict:
    rows = [
        {"seed": 0, "index": i, "nll_sum": 4.0 + i, "num_tokens": 2, "mean_nll": 2.0 + i / 2, "entropy": 1.5}
        for i in range(count)
    ]
    metrics = dict.fromkeys(SCORE_METRICS, 0.25) | {"gen_ppl": 9.0, "longest_repeat": None}
    return {"num_samples": count, "num_scored": count, "num_dropped": 0, "num_tokens": 2 * count, **metrics} | {
        "per_sample": rows
    }


def test_a_scored_run_is_recorded_in_the_reports_layout():
    samples = [Sample("a", [1, 2], seed=0, batch=0), Sample("b", [3], seed=0, batch=0)]
    stored = {"sampler": "untied", "nfe": 8, "seed": 0, "temperature": None, "seconds": 0.5}
    sampled = RunRecord.from_stored(stored, "temperature", "a stored run", samples)
    assert sampled.samples is samples and sampled.is_main and sampled.to_stored("temperature") == stored
    with pytest.raises(ValueError, match="not scored"):
        sampled.to_json("temperature")
    record = sampled.scored(_result())
    assert record.samples is None and record.scores.samples_per_second == pytest.approx(4.0)
    written = record.to_json("temperature")
    assert list(written) == [
        "sampler",
        "nfe",
        "seed",
        "temperature",
        "num_samples",
        "num_scored",
        "seconds",
        "samples_per_second",
        *SCORE_METRICS,
        "num_tokens",
        "per_sample",
    ]
    assert written["per_sample"] == {"mean_nll": [2.0, 2.5], "nll_sum": [4.0, 5.0], "num_tokens": [2, 2]} | {
        "entropy": [1.5, 1.5]
    }
    assert written["longest_repeat"] is None and written["gen_ppl"] == 9.0
    assert RunRecord.from_json(written, "temperature") == record


def test_scores_give_back_the_scoring_result_a_store_keeps():
    scores = RunScores.from_result(_result(), 1.0)
    result = scores.to_result()
    assert [list(row) for row in result["per_sample"]] == [list(PER_SAMPLE_KEYS)] * 2
    assert result["per_sample"][1] == {"mean_nll": 2.5, "nll_sum": 5.0, "num_tokens": 2, "entropy": 1.5}
    assert {key: result[key] for key in SCORE_METRICS} == {key: _result()[key] for key in SCORE_METRICS}
    # a report scored before per-sample entropies were kept: none in the rows, none written back
    older = PerSample([1.0], [2.0], [2])
    assert older.rows() == [{"mean_nll": 1.0, "nll_sum": 2.0, "num_tokens": 2, "entropy": None}]
    assert "entropy" not in older.to_json() and len(older) == 1
    assert scores.metric("samples_per_second") == 2.0 and scores.metric("no such score") is None


def test_a_report_that_names_no_knob_reads_its_runs_as_a_temperature_sweep():
    """Reports written before `diversity_knob` was recorded swept temperature: their runs' values are read under it,
    by the one reader every user of a report's runs goes through (the store import and the rescoring among them)."""
    reports = (json.loads(path.read_text()) for path in _reports())
    report = next(r for r in reports if r["diversity_knob"] == "temperature" and r["diversity_values"])
    unnamed = {key: value for key, value in report.items() if key != "diversity_knob"}
    assert report_knob(unnamed) == DEFAULT_KNOB == "temperature" and report_knob(report) == "temperature"
    records = report_records(unnamed)
    assert records == report_records(report)
    assert any(record.value is not None for record in records)  # the sweep's values, not main runs alone
    decoded = {**report, "diversity_knob": "decode_temperature"}
    assert all(record.value is None for record in report_records(decoded))  # the knob decides what is read
