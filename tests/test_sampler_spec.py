"""The sampler spec record: read once from its JSON object, written back byte for byte, with typed fields in between."""

import json
from pathlib import Path

import pytest

from untied_sc.generation import SamplerSpec
from untied_sc_lab.experiments.definitions import (
    EXPERIMENTS,
    experiment_samplers,
    normalise_samplers,
    with_preset,
)


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _dumped(entries) -> str:
    return json.dumps(entries)  # key order included


def test_a_spec_reads_into_typed_fields_with_int_nfe_keys():
    spec = SamplerSpec.from_json(
        {
            "scheduler": "momentum",
            "knobs_by_steps": {"8": {"momentum_beta": 0.8}, "16": {"momentum_beta": 0.9}},
            "temperature": 0.9,
            "eta_t_scale": 0.5,
            "coefficients": "paper",
            "sc_cfg_scale": 1.5,
        }
    )
    assert spec.scheduler == "momentum"
    assert spec.call == {"temperature": 0.9, "sc_cfg_scale": 1.5}  # a call key, not a coefficient scale
    assert spec.scales == {"eta_t": 0.5}
    assert spec.overrides == {"coefficients": "paper"}
    assert spec.knobs_by_steps == {8: {"momentum_beta": 0.8}, 16: {"momentum_beta": 0.9}}
    assert SamplerSpec.from_json({}) == SamplerSpec() and SamplerSpec().scheduler is None


@pytest.mark.parametrize(
    "entries",
    [
        {},
        {"scheduler": "untied", "eta_r": 0.5},
        {"eta_t_scale": 0.5},
        {"scheduler": "momentum", "knobs_by_steps": {"8": {"momentum_beta": 0.8}}, "temperature": 0.9},
        {"temperature": 0.7, "eta_r": 1.0, "scheduler": "untied", "alpha_scale": 2.0, "correction_routing": "both"},
    ],
)
def test_to_json_writes_back_the_object_read_keys_order_and_values(entries):
    assert _dumped(SamplerSpec.from_json(entries).to_json()) == _dumped(entries)


def test_every_committed_reports_samplers_and_every_experiment_round_trip():
    specs = []
    for path in sorted(RESULTS.glob("*.json")):
        report = json.loads(path.read_text())
        if isinstance(report, dict) and "samplers" in report:
            specs += [(f"{path.name}: {name}", spec) for name, spec in report["samplers"].items()]
    assert len(specs) > 100  # the committed benchmark reports are read
    for name in EXPERIMENTS:
        for label, spec in experiment_samplers(name).items():
            specs.append((f"{name}: {label}", spec.to_json()))
    for where, entries in specs:
        assert _dumped(SamplerSpec.from_json(entries, where).to_json()) == _dumped(entries), where


def test_normalising_states_the_scheduler_first_as_the_reports_write_it():
    samplers = normalise_samplers(
        with_preset(
            {"official": SamplerSpec(), "untied (x)": SamplerSpec.from_json({"eta_t_scale": 0.5})}, "langflow-lm1b"
        )
    )
    assert _dumped({name: spec.to_json() for name, spec in samplers.items()}) == _dumped(
        {
            "official": {"scheduler": "official"},
            "untied (x)": {"scheduler": "untied", "coefficients": "langflow-lm1b", "eta_t_scale": 0.5},
        }
    )
    # a JSON object is read as it is given; a spec naming its own scheduler keeps it
    read = normalise_samplers({"official": {}, "m": {"eta_r": 0.5, "scheduler": "momentum"}})
    assert list(read["m"].to_json()) == ["scheduler", "eta_r"] and read["m"].scheduler == "momentum"


def test_the_scheduler_a_spec_names_or_its_default():
    assert SamplerSpec().scheduler_for("official") == "official"
    assert SamplerSpec().scheduler_for("untied (both)") == "untied"
    assert SamplerSpec(scheduler="higs").scheduler_for("official") == "higs"


def test_knobs_at_a_tuned_nfe_and_at_a_missing_one():
    spec = SamplerSpec.from_json({"scheduler": "momentum", "knobs_by_steps": {"8": {"momentum_beta": 0.8}}})
    assert spec.knobs_at(8) == {"momentum_beta": 0.8}
    assert spec.knobs_at(16, missing_ok=True) is None
    with pytest.raises(ValueError, match=r"knobs for NFE \[8\] only, not 16: tune"):
        spec.knobs_at(16)
    with pytest.raises(ValueError, match=r"knobs for NFE \[\] only"):
        SamplerSpec(scheduler="momentum").knobs_at(8)
    # the knobs there join the overrides; a knob `<coefficient>_scale` is a scale
    tuned = spec.with_knobs({8: {"momentum_beta": 0.5, "eta_t_scale": 2.0}})
    assert tuned.settings_at(8) == ({"momentum_beta": 0.5}, {"eta_t": 2.0})
    assert tuned.to_json()["knobs_by_steps"] == {"8": {"momentum_beta": 0.5, "eta_t_scale": 2.0}}
    assert spec.without_knobs() == SamplerSpec(scheduler="momentum")


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ("untied", r"must be a mapping of its settings"),
        ({"scheduler": 3}, r"'scheduler' must be a scheduler's name"),
        ({"temperature": "hot"}, r"'temperature' must be a number"),
        ({"eta_t_scale": True}, r"'eta_t_scale' must be a number"),
        ({"knobs_by_steps": [1, 2]}, r"knobs_by_steps must be a mapping of NFE to value"),
        ({"knobs_by_steps": {"eight": {}}}, r"knobs_by_steps: the key 'eight' is not a number of steps"),
        ({"knobs_by_steps": {"8": 0.8}}, r"knobs_by_steps\['8'\] must map config keys to values"),
        ({"knobs_by_steps": {"8": {}, "08": {}}}, r"both name NFE 8"),
    ],
)
def test_a_malformed_spec_is_refused_naming_the_field(entries, message):
    with pytest.raises(ValueError, match=message) as error:
        SamplerSpec.from_json(entries, "samplers['untied']")
    assert "samplers['untied']" in str(error.value)
