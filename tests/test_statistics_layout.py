"""SamplerStatistics' layouts: the current one holds only model-derived tensors; the old one (format 1, with the
coefficients and tuning record inside) still loads, samples as before, and migrates."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from untied_sc import LangFlowPipeline, LangFlowScheduler, SamplerStatistics, UntiedSelfConditioningScheduler
from untied_sc.calibration.migrate import migrate_pipeline
from untied_sc.cli import main
from untied_sc.pipelines import load_pipeline
from untied_sc.pipelines.migration import migrate_folder
from untied_sc.pipelines.remote_code import is_package_component, is_package_module, package_components
from untied_sc.schedulers.sampler_statistics import COEFFICIENT_NAMES, FORMAT_VERSION, shortest_float

from .conftest import langflow_from_golden
from .tiny import random_statistics, tiny_tokenizer


# What a format-1 folder held per NFE: float32 coefficients (0.3 is stored as 0.30000001192…) and a tuning record.
LEGACY = {
    "8": {"eta_r": 0.3, "eta_t": 1.7, "eta_o": 1.0, "alpha": 0.7},
    "32": {"eta_r": 2.5, "eta_t": 0.0, "eta_o": 1.0, "alpha": 1.0},
}
TUNING = {"8": {"seed": 10000, "calibrated": {"eta_r": 2.5, "eta_t": 2.5, "eta_o": 1.0, "alpha": 0.8}}}


def write_legacy_layout(statistics: SamplerStatistics, folder) -> None:
    """Saves `statistics` as untied-sc wrote them before format 2: coefficient buffers and `tuning` inside."""
    statistics.save_pretrained(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("calibration_alpha", None)
    config.update(format_version=1, tuning=TUNING)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    weights_path = folder / "diffusion_pytorch_model.safetensors"
    tensors = load_file(weights_path)
    for n, values in LEGACY.items():
        tensors[f"coefficients_nfe{n}"] = torch.tensor([values[name] for name in COEFFICIENT_NAMES])
    save_file(tensors, weights_path, metadata={"format": "pt"})


@pytest.fixture
def legacy_folder(langflow_golden, tmp_path):
    """A LangFlow pipeline folder whose sampler statistics have the old layout."""
    model = langflow_from_golden(langflow_golden)
    pipe = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer())
    pipe.register_modules(sampler_statistics=random_statistics(model, "langflow", steps=(8, 32)))
    pipe.save_pretrained(tmp_path / "pipe")
    write_legacy_layout(pipe.sampler_statistics, tmp_path / "pipe" / "sampler_statistics")
    return tmp_path / "pipe"


def _untied_sample(pipe, seed=0):
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    output = pipe(
        batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(seed), output_type="seq"
    )
    return output.latents


def test_shortest_float_undoes_float32_storage():
    assert shortest_float(torch.tensor(0.3).item()) == 0.3
    assert shortest_float(torch.tensor(1.7).item()) == 1.7
    assert shortest_float(0.25) == 0.25


def test_current_layout_holds_no_coefficients(langflow_golden):
    statistics = random_statistics(langflow_from_golden(langflow_golden), "langflow", steps=(8,))
    assert statistics.config.format_version == FORMAT_VERSION == 2
    assert not any(name.startswith("coefficients") for name in statistics.state_dict())
    assert statistics.legacy_coefficients(8) is None
    with pytest.raises(ValueError, match="already have the current layout"):
        statistics.migrate()


def test_old_layout_loads_and_reads_its_coefficients_exactly(legacy_folder):
    statistics = SamplerStatistics.from_pretrained(legacy_folder / "sampler_statistics")
    assert statistics.is_legacy
    assert statistics.legacy_coefficients(8) == LEGACY["8"]  # 0.3, not 0.30000001192092896
    assert statistics.legacy_coefficients(16) is None  # not calibrated
    migrated, coefficients, tuning = statistics.migrate()
    assert coefficients == LEGACY and tuning == TUNING
    assert migrated.config.format_version == FORMAT_VERSION and not migrated.is_legacy
    # α of the reference recurrence: the calibration's (tuning record) where tuned, else the stored one
    assert migrated.config.calibration_alpha == {"8": 0.8, "32": 1.0}
    for name, tensor in migrated.state_dict().items():
        assert torch.equal(tensor, statistics.state_dict()[name]), name


def test_old_layout_samples_as_before_and_after_migration(legacy_folder):
    pipe = load_pipeline(legacy_folder)
    with pytest.warns(FutureWarning, match="migrate"):
        before = _untied_sample(pipe)
    pipe = load_pipeline(legacy_folder)
    assert migrate_pipeline(pipe)
    assert pipe.scheduler.config.coefficients_by_steps == LEGACY
    assert pipe.scheduler.config.tuning_by_steps == TUNING
    assert not migrate_pipeline(pipe)  # nothing left to move
    assert torch.equal(_untied_sample(pipe), before)
    # the same coefficients given explicitly (scalars win over the config's per-NFE values): the same samples
    explicit = load_pipeline(legacy_folder)
    migrate_pipeline(explicit)
    explicit.set_progress_bar_config(disable=True)
    explicit.scheduler = UntiedSelfConditioningScheduler.from_config(explicit.scheduler.config, **LEGACY["8"])
    generator = torch.Generator().manual_seed(0)
    assert torch.equal(
        explicit(batch_size=2, num_inference_steps=8, generator=generator, output_type="seq").latents, before
    )


def test_migrate_command_refuses_to_overwrite_and_rewrites_only_statistics_and_scheduler(legacy_folder, tmp_path):
    weights = (legacy_folder / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()
    assert main(["migrate", str(legacy_folder)]) == 2  # in place needs --overwrite
    assert SamplerStatistics.from_pretrained(legacy_folder / "sampler_statistics").is_legacy
    assert main(["migrate", str(legacy_folder), "--output", str(tmp_path / "copy")]) == 0
    assert main(["migrate", str(legacy_folder), "--output", str(tmp_path / "copy")]) == 2  # exists: refused
    assert main(["migrate", str(legacy_folder), "--overwrite"]) == 0
    for folder in (legacy_folder, tmp_path / "copy"):
        pipe = load_pipeline(folder)
        assert not pipe.sampler_statistics.is_legacy
        assert pipe.scheduler.config.coefficients_by_steps == LEGACY
        # the module files diffusers' generic loader needs by repo id, in place as in a saved copy
        index = json.loads((folder / "model_index.json").read_text())
        assert is_package_module(folder)
        for component, (module, name) in package_components(index).items():
            assert is_package_component(folder, component, module, name), component
    assert (legacy_folder / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes() == weights
    assert main(["migrate", str(legacy_folder), "--overwrite"]) == 2  # nothing to migrate
    with pytest.raises(ValueError, match="already has the current layout; nothing to migrate"):
        migrate_folder(legacy_folder, overwrite=True)


def test_calibration_writes_its_coefficients_into_the_scheduler_config_and_keeps_tuned_ones(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    tuned = {"eta_r": 0.5, "eta_t": 0.0, "eta_o": 1.0, "alpha": 0.9}
    pipe.scheduler.register_to_config(coefficients_by_steps={"8": tuned})
    result = pipe.calibrate(nfe=[8, 16], bank_size=2, batch_size=2, progress=False)
    coefficients = pipe.scheduler.config.coefficients_by_steps
    assert coefficients["8"] == tuned  # kept
    assert coefficients["16"] == result.coefficients_by_steps["16"]  # the preset's, written
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
