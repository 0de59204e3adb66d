"""The pipelines against the official generation code, token for token and latent for latent.

The fixtures `tests/fixtures/{elf,langflow}_sample_nfe*.safetensors` were produced by
`tests/fixtures/make_sampler_fixtures.py`: it runs the official samplers on CPU in float32 with tiny random weights
(ELF: `generation.test_generation_uncond` of the official PyTorch port, seeded like `eval.py`, i.e. the global RNG
and a `torch.Generator` both with seed 42; LangFlow: `LangFlow.generate_samples` after `torch.manual_seed(42)` as in
`gen_ppl.py`) and records the weights, every intermediate latent and prediction, the final latents and the tokens.
Regenerate with `python tests/fixtures/make_sampler_fixtures.py --elf-src <ELF repo>/src --langflow-src <LangFlow repo>`.
"""

import json

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler

from .conftest import Golden, elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


def _run_recording(pipe, golden):
    """Runs the pipeline with the fixture's seed, recording the latent after every step."""
    sampler = json.loads(golden.metadata["sampler"])
    trajectory = []

    def record(pipe, step, timestep, tensors):
        trajectory.append(tensors["latents"].clone())
        return {}

    pipe.set_progress_bar_config(disable=True)
    output = pipe(
        batch_size=sampler["batch_size"],
        num_inference_steps=sampler["num_steps"],
        generator=torch.Generator().manual_seed(sampler["seed"]),
        output_type="seq",
        callback_on_step_end=record,
    )
    return output, torch.stack(trajectory)


@pytest.mark.parametrize("nfe", [8, 32])
def test_elf_pipeline_reproduces_official_generation_bit_for_bit(nfe):
    golden = Golden(f"elf_sample_nfe{nfe}.safetensors")
    pipe = ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer())
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    assert pipe.scheduler.solver.grid == expected["grid"].tolist()
    assert torch.equal(pipe.scheduler.timesteps, expected["eval_times"])
    assert torch.equal(trajectory, expected["trajectory"])
    assert torch.equal(output.latents, expected["latents"])
    assert torch.equal(output.sequences, expected["tokens"])
    assert not torch.equal(expected["tokens"], expected["tokens_raw"])  # the EOS cut is exercised


@pytest.mark.parametrize("nfe", [8, 64])
def test_langflow_pipeline_reproduces_official_generation_bit_for_bit(nfe):
    golden = Golden(f"langflow_sample_nfe{nfe}.safetensors")
    pipe = LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer())
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    rows = expected["trajectory_rows"]
    assert torch.equal(pipe.scheduler.timesteps, expected["grid"])
    # The last step is the final evaluation, which leaves the latent unchanged.
    assert torch.equal(trajectory[:-1, rows], expected["trajectory"])
    assert torch.equal(output.latents, expected["latents"])
    assert torch.equal(output.sequences, expected["tokens"])
