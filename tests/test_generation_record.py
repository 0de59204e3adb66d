"""A sampled sweep as one record (`experiments/generation_record.py`): what a run store keeps of it is read back as the
same record, key for key in the stored files' order (the runs last, the tuning bank's after the benchmark's), NFE keys
`int` in memory; a stored sweep that lacks a field is refused naming the field and the file."""

import json
from pathlib import Path

import pytest

from untied_sc.generation import SamplerSpec
from untied_sc_lab.experiments.generation_record import GENERATION_FORMAT, BankSample, BaselineCandidates, Generation
from untied_sc_lab.experiments.provenance import SampledPart
from untied_sc_lab.experiments.records import RunRecord
from untied_sc_lab.experiments.tuning_records import KnobTuning, SampledBank, TunedWhenSampled
from untied_sc_lab.record_fields import RecordError
from untied_sc_lab.runs.bank_run import BankRun
from untied_sc_lab.runs.store import StoreRecord


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _knob_tuning() -> KnobTuning:
    """The tuning record of a committed baselines report."""
    return KnobTuning.from_json(json.loads((RESULTS / "langflow-small-baselines.json").read_text())["knob_tuning"])


def _generation(**changes) -> Generation:
    higs = SamplerSpec.of({"scheduler": "higs", "higs_weight": 1.5})
    samplers = {
        "official": SamplerSpec.of({"scheduler": "official"}),
        "untied": SamplerSpec.of({"scheduler": "untied"}),
    }
    settings = {
        "model": "tiny",
        "family": "langflow",
        "pipeline_class": "LangFlowPipeline",
        "generator_tokenizer": "bert-base-uncased (vocab 30522)",
        "nfe": (8, 16),
        "seeds": (0, 1),
        "num_samples": 4,
        "batch_size": 2,
        "batch_seed": "1_000_003 * seed + batch_index",
        "samplers": samplers,
        "coefficients": {"untied": {16: {"eta_r": 0.5, "eta_t": 0.25}, 8: {"eta_r": 0.75, "eta_t": 0.5}}},
        "baseline": "official",
        "diversity_knob": "temperature",
        "diversity_values": (0.8,),
        "diversity_samplers": ("official",),
        "diversity_nfe": (8,),
        "device": "cpu",
        "num_processes": 1,
        "torch": "2.13.0+cpu",
        "command": "untied-sc benchmark tiny",
        "seconds": 12.5,
        "runs": (RunRecord("official", 8, 0, None, 1.0), RunRecord("official", 8, 0, 0.8, 1.5)),
        "bank_runs": (BankSample("tuning bank: higs (higs_weight=1.5)", 8, 10_000, "k8", higs, {}, 4, 0.0),),
        "knob_tuning": _knob_tuning(),
        "store": StoreRecord("store", 2, 1, 0, 0, ["official at NFE 8, seed 0"]),
        "candidates": BaselineCandidates(
            {**samplers, "higs": higs},
            SampledBank(10_000, "tuning", 4, 2, 8, 0.95, None, 0.0),
            {"untied": {8: None}},
            None,
        ),
        "tuned_when_sampled": TunedWhenSampled("tiny-evaluator", "langflow", {8: ["official", "higs"]}),
        "parts": (
            SampledPart((8,), "nfe 8", 5.0, "cpu", "2.13.0+cpu"),
            SampledPart((16,), "nfe 16", 7.5, "cpu", "2.13.0"),
        ),
        "bank_scores": {"abc": BankRun(90.0, 5.1, [1.0, 2.0], [3, 4])},
    }
    return Generation(**{**settings, **changes})


def test_a_stored_generation_reads_back_as_the_same_record_in_the_stored_order():
    generation = _generation()
    data = json.loads(json.dumps(generation.to_json()))  # through a file's text
    assert Generation.from_json(data) == generation
    assert data["format"] == GENERATION_FORMAT and list(data)[-1] == "runs"
    assert list(data)[list(data).index("seconds") + 1 :] == [
        "knob_tuning",
        "store",
        "baseline_candidates",
        "tuned_when_sampled",
        "parts",
        "bank_scores",
        "runs",
    ]
    assert list(data["coefficients"]["untied"]) == ["16", "8"]  # string keys in the file, in the record's order
    assert data["runs"][0] == {"sampler": "official", "nfe": 8, "seed": 0, "temperature": None, "seconds": 1.0}
    assert data["runs"][-1]["bank_key"] == "k8" and data["runs"][-1]["temperature"] is None
    assert [run.sampler for run in generation.sampled_runs] == [
        "official",
        "official",
        "tuning bank: higs (higs_weight=1.5)",
    ]
    assert generation.coefficients_at("untied", 16) == {"eta_r": 0.5, "eta_t": 0.25}
    assert generation.coefficients_at("official", 8) is None


def test_the_optional_parts_are_left_out_of_the_file_and_read_back_as_absent():
    bare = _generation(
        bank_runs=(),
        knob_tuning=None,
        store=None,
        candidates=None,
        tuned_when_sampled=None,
        parts=None,
        bank_scores=None,
    )
    data = bare.to_json()
    assert list(data)[list(data).index("seconds") + 1 :] == ["runs"]
    assert Generation.from_json(data) == bare


def test_a_stored_generation_without_a_field_is_refused_naming_the_field_and_the_file():
    data = _generation().to_json()
    for field in ("nfe", "samplers", "batch_seed", "runs"):
        with pytest.raises(RecordError, match=f"sweeps/a.json: the sampled benchmark sweep lacks the field '{field}'"):
            Generation.from_json({key: value for key, value in data.items() if key != field}, "sweeps/a.json")
    run = {key: value for key, value in data["runs"][0].items() if key != "temperature"}
    with pytest.raises(RecordError, match=r"a.json: runs\[0\]: the sampled run lacks the field 'temperature'"):
        Generation.from_json({**data, "runs": [run]}, "a.json")
    with pytest.raises(ValueError, match="is not a sampled benchmark sweep"):
        Generation.from_json({**data, "format": "something else"})
