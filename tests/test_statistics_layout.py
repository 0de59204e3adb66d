"""SamplerStatistics' layout (format 2): only model-derived tensors, the coefficients in the scheduler config; a folder
of another format version is refused on load, naming the file, the field and the fix."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from untied_sc import LangFlowPipeline, LangFlowScheduler, SamplerStatistics
from untied_sc.cli import main
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.sampler_statistics import COEFFICIENT_NAMES, FORMAT_VERSION

from .conftest import langflow_from_golden
from .tiny import random_statistics, tiny_tokenizer


TUNING = {"8": {"seed": 10000, "calibrated": {"eta_r": 2.5, "eta_t": 2.5, "eta_o": 1.0, "alpha": 0.8}}}


def write_format_1(folder) -> None:
    """Rewrites the saved statistics in `folder` as format 1 held them: coefficient buffers and `tuning` inside."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("calibration_alpha", None)
    config.update(format_version=1, tuning=TUNING)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    weights_path = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights_path)
    for n in config["calibrated_steps"]:
        tensors[f"coefficients_nfe{n}"] = torch.ones(len(COEFFICIENT_NAMES))
    save_file(tensors, weights_path, metadata={"format": "pt"})


@pytest.fixture
def format_1_folder(langflow_golden, tmp_path):
    """A LangFlow pipeline folder whose sampler statistics have format version 1."""
    model = langflow_from_golden(langflow_golden)
    pipe = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer())
    pipe.register_modules(sampler_statistics=random_statistics(model, "langflow", steps=(8, 32)))
    pipe.save_pretrained(tmp_path / "pipe")
    write_format_1(tmp_path / "pipe" / "sampler_statistics")
    return tmp_path / "pipe"


def test_current_layout_holds_no_coefficients_and_saves_its_config_keys(langflow_golden, tmp_path):
    statistics = random_statistics(langflow_from_golden(langflow_golden), "langflow", steps=(8,))
    assert statistics.config.format_version == FORMAT_VERSION == 2
    assert not any(name.startswith("coefficients") for name in statistics.state_dict())
    statistics.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["format_version"] == 2 and config["tuning"] is None  # the keys the released folders hold
    with pytest.raises(ValueError, match="holds no tuning record"):
        SamplerStatistics(solver="langflow", tuning=TUNING)


def _refusal_parts(folder) -> tuple[str, ...]:
    path = folder / "sampler_statistics" / "config.json"
    return (str(path), "`format_version: 1`", "`untied-sc calibrate PIPELINE_DIR --nfe 8 32 --overwrite`", "convert")


def test_a_format_1_folder_is_refused_on_load_naming_the_file_the_field_and_the_fix(format_1_folder):
    for load in (
        lambda: load_pipeline(format_1_folder),
        lambda: LangFlowPipeline.from_pretrained(format_1_folder),
        lambda: SamplerStatistics.from_pretrained(format_1_folder / "sampler_statistics"),
    ):
        with pytest.raises(ValueError) as error:
            load()
        for part in _refusal_parts(format_1_folder):
            assert part in str(error.value), part
    with pytest.raises(ValueError, match="has `format_version: 1`; this untied-sc reads sampler statistics of format"):
        SamplerStatistics(solver="langflow", format_version=1)


def test_the_cli_refuses_a_format_1_folder_in_one_message_and_calibrate_overwrite_replaces_it(
    format_1_folder, tmp_path, capsys
):
    assert main(["generate", str(format_1_folder), "--nfe", "8", "--out", str(tmp_path / "samples.jsonl")]) == 2
    error = capsys.readouterr().err
    assert "Traceback" not in error and not (tmp_path / "samples.jsonl").exists()
    for part in _refusal_parts(format_1_folder):
        assert part in error, part
    # the fix the message names works: the statistics are computed afresh, in format 2
    argv = ["calibrate", str(format_1_folder), "--nfe", "8", "--overwrite", "--bank-size", "2", "--batch-size", "2"]
    assert main([*argv, "--no-progress"]) == 0
    statistics = load_pipeline(format_1_folder).sampler_statistics
    assert statistics.config.format_version == 2 and statistics.config.calibrated_steps == [8]
    assert not any(name.startswith("coefficients") for name in statistics.state_dict())


def test_calibration_writes_its_coefficients_into_the_scheduler_config_and_keeps_tuned_ones(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    tuned = {"eta_r": 0.5, "eta_t": 0.0, "eta_o": 1.0, "alpha": 0.9}
    pipe.scheduler.register_to_config(coefficients_by_steps={"8": tuned})
    result = pipe.calibrate(nfe=[8, 16], bank_size=2, batch_size=2, progress=False)
    coefficients = pipe.scheduler.config.coefficients_by_steps
    assert coefficients["8"] == tuned  # kept
    assert coefficients["16"] == result.coefficients_by_steps[16]  # the preset's, written
    # the moments were measured with the α that runs
    assert pipe.sampler_statistics.config.calibration_alpha == {"8": 0.9, "16": coefficients["16"]["alpha"]}


def test_recalibrating_one_nfe_leaves_the_other_nfes_coefficients_and_tuning_records_alone(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=2, batch_size=2, progress=False)
    tuned = {"eta_r": 0.5, "eta_t": 0.0, "eta_o": 1.0, "alpha": 0.9}
    pipe.scheduler.register_to_config(coefficients_by_steps={"8": tuned}, tuning_by_steps={"8": TUNING["8"]})
    first = pipe.sampler_statistics.rms_nfe8.clone()
    pipe.calibrate(nfe=[16], bank_size=2, batch_size=2, progress=False)
    assert pipe.scheduler.config.coefficients_by_steps["8"] == tuned
    assert pipe.scheduler.config.tuning_by_steps == {"8": TUNING["8"]}
    assert torch.equal(pipe.sampler_statistics.rms_nfe8, first)
    assert sorted(pipe.scheduler.config.coefficients_by_steps) == ["16", "8"]
