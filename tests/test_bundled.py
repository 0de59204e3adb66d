"""The bundled pipelines in `hub_artifacts/` load with their family's `from_pretrained`, are complete and generate."""

import json
import math
from pathlib import Path

import pytest
import torch

from untied_sc import ELFPipeline, LangFlowPipeline, UntiedSelfConditioningScheduler


ARTIFACTS = Path(__file__).resolve().parents[1] / "hub_artifacts"
BUNDLED = {"elf-small": ELFPipeline, "langflow-small": LangFlowPipeline}
COMPONENTS = {"transformer", "scheduler", "tokenizer", "sampler_statistics"}


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_pipeline_loads_and_generates(name):
    folder = ARTIFACTS / name
    assert COMPONENTS <= set(json.loads((folder / "model_index.json").read_text()))
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    assert size < 40e6, f"{name} is {size / 1e6:.1f} MB; the bundled folders must stay under 40 MB"
    assert (folder / "README.md").exists() and (folder / "loss_curve.png").exists()

    pipe = BUNDLED[name].from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    statistics = pipe.sampler_statistics
    assert statistics.config.calibrated_steps == [8, 16, 32, 64]
    assert statistics.config.format_version == 2  # the coefficients live in the scheduler config
    scheduler_config = json.loads((folder / "scheduler" / "scheduler_config.json").read_text())
    for nfe in (8, 16, 32, 64):
        coefficients = scheduler_config["coefficients_by_steps"][str(nfe)]
        knob = "temperature" if pipe.family == "langflow" else "decode_temperature"
        assert {"eta_r", "eta_t", "eta_o", "alpha"} <= set(coefficients) <= {"eta_r", "eta_t", "eta_o", "alpha", knob}
        assert all(math.isfinite(value) for value in coefficients.values())
        if knob in coefficients:  # an entropy-matching value is the one the tuning found on its bank
            matching = scheduler_config["tuning_by_steps"][str(nfe)]["entropy_matching"]
            assert coefficients[knob] == matching["value"] and matching["knob"] == knob

    official = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    assert len(official.texts) == 2 and all(isinstance(text, str) and text.strip() for text in official.texts)
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    untied = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    assert untied.sequences.shape == (2, pipe.latent_shape[0])
