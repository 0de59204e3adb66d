"""The per-NFE tables' file boundary (`untied_sc.per_nfe`): int keys in memory, the files' string keys and bytes."""

import json
from pathlib import Path

import pytest

from untied_sc.per_nfe import check_steps, read_steps, read_steps_table, steps_key, write_steps_table
from untied_sc.schedulers import (
    ELFScheduler,
    LangFlowScheduler,
    StepCoefficients,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    stored_coefficients,
    stored_tuning,
    tables_config,
)
from untied_sc.schedulers.coefficients import coefficients_table, tuning_table


ROOT = Path(__file__).resolve().parents[1]
BUNDLED = [ROOT / "hub_artifacts" / name for name in ("elf-small", "langflow-small")]
STATISTICS_TABLES = ("bank_sizes", "seeds", "calibration_alpha", "prompt_banks")


def _saved(config: dict) -> str:
    """A config's bytes as diffusers' `to_json_string` writes them (keys sorted as strings)."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


def test_keys_read_as_ints_and_write_back_as_the_same_strings_in_the_same_order():
    table = {"16": 2.0, "8": 1.5, "64": 1.0}
    read = read_steps_table(table, "sde_gamma_by_steps")
    assert read == {16: 2.0, 8: 1.5, 64: 1.0} and list(read) == [16, 8, 64]
    assert list(write_steps_table(read)) == ["16", "8", "64"]
    assert read_steps_table({8: 2.0}, "sde_gamma_by_steps") == {8: 2.0}  # an in-memory table with int keys
    assert read_steps_table(None, "sde_gamma_by_steps") == {}
    assert steps_key(8) == "8" and read_steps("08", "x") == 8


@pytest.mark.parametrize("key", ["x", "0", "-1", "8.0", " 8", "", "８", True, 1.5, None, 0])
def test_a_key_that_is_no_positive_integer_is_refused_naming_the_field_and_the_key(key):
    with pytest.raises(ValueError, match=r"sde_gamma_by_steps: the key .* is not a number of steps") as error:
        read_steps_table({key: 1.0}, "sde_gamma_by_steps")
    assert repr(key) in str(error.value)


@pytest.mark.parametrize("keys", [("8", "08"), (8, "8")])
def test_two_keys_of_one_nfe_are_refused_naming_both(keys):
    first, second = keys
    with pytest.raises(ValueError, match=r"tuning_by_steps: the keys .* both name NFE 8") as error:
        tuning_table({first: {"seed": 1}, second: {"seed": 2}})
    assert repr(first) in str(error.value) and repr(second) in str(error.value)


def test_a_table_that_is_no_mapping_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"coefficients_by_steps must be a mapping of NFE to value"):
        coefficients_table([1.0, 2.0])


def test_a_bad_entry_is_refused_naming_the_field_and_its_key():
    with pytest.raises(ValueError, match=r"coefficients_by_steps\['8'\]\['eta_t'\] must be a number"):
        coefficients_table({"8": {"eta_r": 0.0, "eta_t": "1", "eta_o": 0.0, "alpha": 1.0}})
    with pytest.raises(ValueError, match=r"coefficients_by_steps\['16'\] must give exactly"):
        coefficients_table({"16": {"eta_r": 0.0, "eta_t": 1.0, "eta_o": 0.0}})
    with pytest.raises(ValueError, match=r"tuning_by_steps\['8'\] must be a tuning record"):
        tuning_table({"8": 3})


def test_a_scheduler_refuses_a_bad_key_of_its_tables_when_it_is_built():
    entry = {"eta_r": 0.0, "eta_t": 1.0, "eta_o": 0.0, "alpha": 0.5}
    with pytest.raises(ValueError, match=r"coefficients_by_steps: the keys '8' and '08' both name NFE 8"):
        UntiedLangFlowScheduler(coefficients_by_steps={"8": entry, "08": entry})
    with pytest.raises(ValueError, match=r"coefficients_by_steps: the key 'eight' is not a number of steps"):
        UntiedELFScheduler(coefficients_by_steps={"eight": entry})


def test_an_entry_keeps_its_entropy_matching_knob_through_the_round_trip():
    entry = {"eta_r": 0.5, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.8, "decode_temperature": 0.9}
    read = coefficients_table({"8": entry})
    assert read[8] == StepCoefficients(0.5, 1.0, 1.0, 0.8, knob="decode_temperature", knob_value=0.9)
    assert read[8].setting("decode_temperature") == 0.9 and read[8].setting("temperature") is None
    assert tables_config(read, {}) == {"coefficients_by_steps": {"8": entry}, "tuning_by_steps": None}


@pytest.mark.parametrize("folder", BUNDLED, ids=lambda folder: folder.name)
def test_the_bundled_scheduler_configs_keep_their_bytes_through_the_typed_tables(folder):
    path = folder / "scheduler" / "scheduler_config.json"
    raw = path.read_text()
    config = json.loads(raw)
    coefficients, tuning = stored_coefficients(config), stored_tuning(config)
    assert coefficients and tuning and all(isinstance(n, int) for n in (*coefficients, *tuning))
    assert tuning[8].seed_space in ("benchmark", "tuning")
    written = {**config, **tables_config(coefficients, tuning)}
    if "sde_gamma_by_steps" in config:
        written["sde_gamma_by_steps"] = write_steps_table(read_steps_table(config["sde_gamma_by_steps"], "γ"))
    assert _saved(written) == raw
    # and the untied scheduler built from it saves the same tables
    untied_class = UntiedELFScheduler if "sde_gamma_by_steps" in config else UntiedLangFlowScheduler
    untied = untied_class.from_config(config)
    for key in ("coefficients_by_steps", "tuning_by_steps"):
        assert _saved(untied.config[key]) == _saved(config[key])


@pytest.mark.parametrize("folder", BUNDLED, ids=lambda folder: folder.name)
def test_the_bundled_statistics_configs_keep_their_bytes_through_int_keys(folder):
    path = folder / "sampler_statistics" / "config.json"
    raw = path.read_text()
    config = json.loads(raw)
    tables = {key: read_steps_table(config[key], key) for key in STATISTICS_TABLES if config.get(key) is not None}
    assert tables and all(isinstance(n, int) for table in tables.values() for n in table)
    assert _saved({**config, **{key: write_steps_table(table) for key, table in tables.items()}}) == raw


def test_an_official_scheduler_refuses_a_bad_key_of_its_gamma_table_when_it_is_built():
    with pytest.raises(ValueError, match=r"ELFScheduler config: sde_gamma_by_steps: the key 'eight' is not a number"):
        ELFScheduler(sde_gamma_by_steps={"eight": 2.0})
    assert ELFScheduler(sde_gamma_by_steps={"12": 1.75}).sde_gamma_for(12) == 1.75


@pytest.mark.parametrize("value", [1, 2.0, True, "8", None])
def test_a_number_of_steps_is_checked_in_one_place_with_one_message(value):
    with pytest.raises(ValueError, match=r"num_inference_steps must be an integer ≥ 2, got"):
        check_steps(value)
    with pytest.raises(ValueError, match=r"num_inference_steps must be an integer ≥ 2, got"):
        LangFlowScheduler().set_timesteps(value)
    assert check_steps(8) == 8 and check_steps(1, minimum=1) == 1
