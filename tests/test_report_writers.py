"""The analysis builds records and writes their JSON only into the report (`experiments/aggregation.py`): the
diversity curves built from a committed report's runs, and its equal-entropy rows read off those curves, give the
report's JSON key for key."""

import json
from pathlib import Path

import pytest

from untied_sc_lab.evaluation.aggregates import Aggregates, CurvePoint, curves_to_json
from untied_sc_lab.experiments.aggregation import diversity_curves, equal_entropy_comparison
from untied_sc_lab.experiments.equal_entropy_records import EQUAL_ENTROPY_KEYS, EqualEntropyRow
from untied_sc_lab.experiments.records import report_records


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# Small committed reports with a diversity sweep (LangFlow, and ELF with its decode temperature).
SWEPT = ["langflow-small-cpu-diversity-langflow-lm1b.json", "elf-small-diversity-elf-b.json"]


def _report(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


@pytest.mark.parametrize("name", SWEPT)
def test_the_curves_built_from_a_reports_runs_are_its_diversity_curves(name):
    data = _report(name)
    curves = diversity_curves(report_records(data), data["diversity_default"])
    assert curves and all(isinstance(nfe, int) for by_nfe in curves.values() for nfe in by_nfe)
    assert all(isinstance(p, CurvePoint) for by_nfe in curves.values() for ps in by_nfe.values() for p in ps)
    written = curves_to_json(curves, data["diversity_knob"])
    assert json.dumps(written) == json.dumps(data["diversity_curves"])  # key order included


@pytest.mark.parametrize("name", SWEPT)
def test_equal_entropy_rows_read_a_reports_curves_as_the_report_did(name):
    data = _report(name)
    curves = diversity_curves(report_records(data), data["diversity_default"])
    rows = equal_entropy_comparison(Aggregates.from_json(data["aggregates"]), curves)
    assert rows
    for sampler, by_nfe in data["equal_entropy"].items():
        for nfe, stored in by_nfe.items():
            row = rows[sampler][int(nfe)]
            assert (row.entropy, row.gen_ppl, row.ratio) == (stored["entropy"], stored["gen_ppl"], stored["ratio"])
            assert row.baseline_gen_ppl_at_entropy == stored["baseline_gen_ppl_at_entropy"]
            # read without the run records: no interval
            assert row.ratio_ci is None and row.fraction_outside is None


def test_an_equal_entropy_row_with_its_interval_round_trips_and_a_missing_field_is_named():
    row = EqualEntropyRow(4.0, 90.0, 100.0, 0.9, [0.8, 1.0], 0.0, True)
    assert list(row.to_json()) == list(EQUAL_ENTROPY_KEYS)
    assert EqualEntropyRow.from_json(row.to_json()) == row
    partial = {key: value for key, value in row.to_json().items() if key != "entropy_resampled"}
    with pytest.raises(KeyError, match="entropy_resampled"):
        EqualEntropyRow.from_json(partial)
