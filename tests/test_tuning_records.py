"""The tuning section of a report (`experiments/tuning_records.py`): every committed report's `knob_tuning` reads
into a `KnobTuning` and writes back the same JSON, key for key and in order, in each rule's layout; a record that
lacks a field is refused with an error naming the field and the record."""

import copy
import json
from pathlib import Path

import pytest

from untied_sc_lab.experiments.tuning_records import (
    BankComparison,
    BankScores,
    KnobTuning,
    SampledBank,
    TunedWhenSampled,
    TuningRecord,
)


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _tuned_reports() -> list[Path]:
    paths = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "knob_tuning" in data:
            paths.append(path)
    return paths


REPORTS = _tuned_reports()


def _tuning(path: Path) -> dict:
    return json.loads(path.read_text())["knob_tuning"]


def test_the_tuned_reports_are_found_in_both_layouts():
    layouts = {KnobTuning.from_json(_tuning(path)).is_grid for path in REPORTS}
    assert len(REPORTS) >= 10 and layouts == {True, False}


@pytest.mark.parametrize("path", REPORTS, ids=lambda path: path.stem)
def test_a_committed_tuning_section_round_trips_key_for_key(path):
    data = _tuning(path)
    tuning = KnobTuning.from_json(data)
    assert json.dumps(tuning.to_json()) == json.dumps(data)
    # NFEs are ints in memory, and every record is typed
    for by_nfe in [*tuning.samplers.values(), *tuning.untied.values()]:
        assert all(isinstance(n, int) for n in by_nfe)
    assert all(isinstance(record.chosen_scores, BankScores) for record in tuning.records())


def test_every_record_layout_is_met_in_the_committed_reports():
    layouts = {record.layout for path in REPORTS for record in KnobTuning.from_json(_tuning(path)).records()}
    assert layouts == {"search", "grid", "untied", "untied grid"}


def test_sorted_scores_of_a_saved_scheduler_config_keep_their_order():
    scores = {"entropy": 4.2, "gen_ppl": 915.0}
    assert list(BankScores.from_json(scores).to_json()) == ["entropy", "gen_ppl"]
    assert BankScores.from_json(scores) == BankScores(915.0, 4.2)


def _first_record(layout: str) -> tuple[dict, str]:
    for path in REPORTS:
        data = _tuning(path)
        for sampler, entry in data["samplers"].items():
            for record in entry["by_steps"].values():
                if TuningRecord.from_json(record).layout == layout:
                    return record, sampler
        for by_nfe in data["untied"].values():
            for record in by_nfe.values():
                if record and TuningRecord.from_json(record).layout == layout:
                    return record, "untied"
    raise AssertionError(f"no committed record of layout {layout}")


@pytest.mark.parametrize(
    "layout, field",
    [("search", "chosen_scores"), ("search", "official_curve"), ("grid", "official"), ("untied", "on_edge")],
)
def test_a_record_without_a_field_is_refused_naming_the_field_and_the_record(layout, field):
    record, _ = _first_record(layout)
    broken = {key: value for key, value in record.items() if key != field}
    with pytest.raises(ValueError, match=rf"somewhere: the tuning record lacks the field '{field}'"):
        TuningRecord.from_json(broken, "somewhere")


def test_a_report_without_a_tuning_field_is_refused_naming_where():
    data = _tuning(REPORTS[-1])
    sampler = next(iter(data["samplers"]))
    broken = copy.deepcopy(data)
    del broken["samplers"][sampler]["by_steps"]["8"]["chosen"]
    with pytest.raises(
        ValueError,
        match=rf"knob_tuning.samplers\['{sampler}'\].by_steps\['8'\]: the tuning record lacks the field 'chosen'",
    ):
        KnobTuning.from_json(broken)
    with pytest.raises(ValueError, match="knob_tuning: the tuning record lacks the field 'confidence'"):
        KnobTuning.from_json({key: value for key, value in data.items() if key != "confidence"})
    with pytest.raises(ValueError, match="lacks the field 'entropy'"):
        BankComparison.from_json({"ratio": 0.9, "ratio_ci": [0.8, 1.0]})


def test_what_a_generation_sampled_is_read_by_int_nfe_and_written_back():
    data = {"evaluator": "tiny", "protocol": "langflow", "sampled": {"8": ["official", "HiGS"], "16": ["official"]}}
    tuned = TunedWhenSampled.from_json(data)
    assert tuned.sampled[8] == ["official", "HiGS"] and json.dumps(tuned.to_json()) == json.dumps(data)
    with pytest.raises(ValueError, match="tuned_when_sampled: the tuning record lacks the field 'protocol'"):
        TunedWhenSampled.from_json({"evaluator": "tiny", "sampled": {}})


def test_the_sampled_bank_of_a_generation_round_trips_and_names_what_it_lacks():
    data = {"seed": 10000, "seed_space": "tuning", "num_samples": 4, "batch_size": 2, "budget": 2}
    data.update(confidence=0.95, curve_values=[0.8, 1.2], extrapolate=0.02)
    assert json.dumps(SampledBank.from_json(data).to_json()) == json.dumps(data)
    with pytest.raises(ValueError, match="baseline_candidates.bank: the tuning record lacks the field 'extrapolate'"):
        SampledBank.from_json({k: v for k, v in data.items() if k != "extrapolate"}, "baseline_candidates.bank")
