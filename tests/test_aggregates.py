"""A report's aggregates as records (`evaluation/aggregates.py`): every committed report's aggregates read into
records and written back give the same JSON, key for key and in order; the records keep NFEs as integers and write
the small-sample fields only where a report was analysed with them."""

import json
import math
from pathlib import Path

import pytest

from untied_sc_lab.evaluation.aggregates import SMALL_SAMPLE_KEYS, Aggregates, MeanSE, PairedSummary


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _reports() -> list[Path]:
    found = []
    for path in sorted(RESULTS.glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and "aggregates" in report:
            found.append(path)
    return found


@pytest.mark.parametrize("path", _reports(), ids=lambda path: path.stem)
def test_every_committed_reports_aggregates_round_trip_key_for_key(path):
    written = json.loads(path.read_text())["aggregates"]
    aggregates = Aggregates.from_json(written)
    assert json.dumps(aggregates.to_json()) == json.dumps(written)
    assert all(isinstance(nfe, int) for by_nfe in aggregates.by_sampler.values() for nfe in by_nfe)


def test_the_committed_reports_hold_both_layouts_of_a_paired_cell():
    # reports analysed before the small-sample intervals lack their keys; later ones hold all of them
    layouts = {
        "num_clusters" in cell
        for path in _reports()
        for by_nfe in json.loads(path.read_text())["aggregates"]["paired"].values()
        for cell in by_nfe.values()
    }
    assert layouts == {True, False}


def test_mean_se_leaves_out_missing_values():
    stat = MeanSE.of([1.0, None, 3.0, math.nan])
    assert (stat.mean, stat.n) == (2.0, 2) and stat.se == pytest.approx(1.0)
    assert MeanSE.of([5.0]) == MeanSE(5.0, None, 1)
    assert MeanSE.of([None]) == MeanSE(None, None, 0)
    assert MeanSE.from_json(stat.to_json()) == stat and list(stat.to_json()) == ["mean", "se", "n"]


def _cell(**small) -> PairedSummary:
    return PairedSummary(
        baseline="official",
        seeds=[0, 1],
        gen_ppl_ratio=0.8,
        gen_ppl_ratio_ci=(0.7, 0.9),
        gen_ppl_ratio_per_seed=MeanSE(0.8, 0.05, 2),
        num_pairs=8,
        fraction_b_worse=0.25,
        fraction_tied=0.0,
        mean_delta=-0.1,
        mean_delta_ci=(-0.2, 0.0),
        fraction_b_worse_ci=(0.0, 0.5),
        num_dropped=0,
        retained_throughput=MeanSE(0.95, None, 2),
        **small,
    )


def test_a_paired_cell_writes_the_small_sample_fields_only_where_it_holds_them():
    plain = _cell()
    written = plain.to_json()
    assert not plain.has_small_sample and "num_clusters" not in written
    assert list(written)[-1] == "retained_throughput" and written["gen_ppl_ratio_ci"] == [0.7, 0.9]
    assert PairedSummary.from_json(written).to_json() == written
    # one cluster: the cell counts it and has no interval
    single = _cell(num_clusters=1).to_json()
    assert list(single)[-len(SMALL_SAMPLE_KEYS) :] == list(SMALL_SAMPLE_KEYS)
    assert single["num_clusters"] == 1 and all(single[key] is None for key in SMALL_SAMPLE_KEYS[1:])
    several = _cell(num_clusters=12, interval_method="t", gen_ppl_ratio_t_ci=(0.6, 1.0)).to_json()
    assert several["gen_ppl_ratio_t_ci"] == [0.6, 1.0] and PairedSummary.from_json(several).interval_method == "t"


def test_aggregates_key_nfes_as_integers_in_memory_and_strings_in_json():
    aggregates = Aggregates({"official": {8: {"gen_ppl": MeanSE(40.0, 1.0, 2)}}}, {"untied": {8: _cell()}})
    written = aggregates.to_json()
    assert list(written["by_sampler"]["official"]) == ["8"] and list(written["paired"]["untied"]) == ["8"]
    again = Aggregates.from_json(written)
    assert again.metric("official", 8, "gen_ppl") == MeanSE(40.0, 1.0, 2)
    assert again.metric("official", 16, "gen_ppl") is None and again.metric("untied", 8, "gen_ppl") is None
    assert again.paired["untied"][8].to_json() == _cell().to_json()
