"""The pipelines against the official generation code, token for token and latent for latent.

The fixtures `tests/fixtures/{elf,langflow}_sample_nfe*.safetensors` were produced by
`tests/fixtures/make_sampler_fixtures.py`: it runs the official samplers on CPU in float32 with tiny random weights
(ELF: `generation.test_generation_uncond` of the official PyTorch port, seeded like `eval.py`, i.e. the global RNG
and a `torch.Generator` both with seed 42; LangFlow: `LangFlow.generate_samples` after `torch.manual_seed(42)` as in
`gen_ppl.py`) and records the weights, every intermediate latent and prediction, the final latents and the tokens.
Regenerate with `python tests/fixtures/make_sampler_fixtures.py --elf-src <ELF repo>/src --langflow-src <LangFlow repo>`.

Three tests per fixture, each as strict as what it compares allows on any x86 CPU (the bounds and what was measured
are in conftest.py):
- the sampler alone, bit for bit: with the official network outputs replayed (and the official rounding of the
  normal draws and the time grid, after checking ours to `DRAW_TOLERANCE` and `GRID_ULPS`), it must reproduce every
  latent, the final latents and the tokens;
- each network call alone: our network on the very inputs the official one got, within `NETWORK_TOLERANCE`;
- the whole pipeline with our network, one step at a time from the official state (on the official draws): every
  latent within `STEP_TOLERANCE` of the official one, at any number of steps;
- the whole pipeline free-running with our network (on the official draws): the official tokens, and every latent
  within the loose `TRAJECTORY_BOUNDS` of the official one. float32 matmuls sum in a CPU-dependent order, so network
  outputs are equal to the bit only on the machine (and code) that wrote the fixtures, and their differences travel
  down a free-running trajectory, growing with its number of steps.
"""

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler

from .conftest import (
    NETWORK_TOLERANCE,
    STEP_TOLERANCE,
    TRAJECTORY_BOUNDS,
    Golden,
    assert_within,
    elf_from_golden,
    golden_call,
    langflow_from_golden,
    replay_official_draws,
    replay_official_network,
    run_from_official_latents,
)
from .tiny import tiny_tokenizer


def _run_recording(pipe, golden):
    """Runs the pipeline as the fixture's official run, recording the latent after every step."""
    trajectory = []

    def record(pipe, step, timestep, tensors):
        trajectory.append(tensors["latents"].clone())
        return {}

    pipe.set_progress_bar_config(disable=True)
    output = pipe(**golden_call(golden), output_type="seq", callback_on_step_end=record)
    return output, torch.stack(trajectory)


def _elf(nfe):
    golden = Golden(f"elf_sample_nfe{nfe}.safetensors")
    return ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer()), golden


def _langflow(nfe):
    golden = Golden(f"langflow_sample_nfe{nfe}.safetensors")
    return LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer()), golden


@pytest.mark.parametrize("nfe", [8, 32])
def test_elf_sampler_reproduces_official_generation_bit_for_bit(nfe, monkeypatch):
    pipe, golden = _elf(nfe)
    calls = replay_official_network(pipe, golden, monkeypatch)
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    assert len(calls) == nfe
    assert pipe.scheduler.solver.grid == expected["grid"].tolist()
    assert torch.equal(pipe.scheduler.timesteps, expected["eval_times"])
    assert torch.equal(trajectory, expected["trajectory"])
    assert torch.equal(output.latents, expected["latents"])
    assert torch.equal(output.sequences, expected["tokens"])
    assert not torch.equal(expected["tokens"], expected["tokens_raw"])  # the EOS cut is exercised


@pytest.mark.parametrize("nfe", [8, 32])
def test_elf_pipeline_matches_official_generation(nfe, monkeypatch):
    pipe, golden = _elf(nfe)
    replay_official_draws(golden, monkeypatch)
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    error = (trajectory - expected["trajectory"]).abs().max().item()
    assert_within(error, TRAJECTORY_BOUNDS["elf", nfe], f"ELF, {nfe} steps free-running")
    assert torch.equal(output.sequences, expected["tokens"])


@pytest.mark.parametrize("nfe", [8, 64])
def test_langflow_sampler_reproduces_official_generation_bit_for_bit(nfe, monkeypatch):
    pipe, golden = _langflow(nfe)
    calls = replay_official_network(pipe, golden, monkeypatch)
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    rows = expected["trajectory_rows"]
    assert len(calls) == nfe
    assert torch.equal(pipe.scheduler.timesteps, expected["grid"])
    # The last step is the final evaluation, which leaves the latent unchanged.
    assert torch.equal(trajectory[:-1], expected["trajectory"])
    assert torch.equal(output.latents, expected["latents"][rows])
    assert torch.equal(output.sequences, expected["tokens"][rows])


@pytest.mark.parametrize("nfe", [8, 64])
def test_langflow_pipeline_matches_official_generation(nfe, monkeypatch):
    pipe, golden = _langflow(nfe)
    replay_official_draws(golden, monkeypatch)
    output, trajectory = _run_recording(pipe, golden)
    expected = golden.outputs
    rows = expected["trajectory_rows"]
    error = (trajectory[:-1] - expected["trajectory"]).abs().max().item()
    assert_within(error, TRAJECTORY_BOUNDS["langflow", nfe], f"LangFlow, {nfe} steps free-running")
    assert torch.equal(output.sequences, expected["tokens"][rows])


@pytest.mark.parametrize("family,nfe", [("elf", 8), ("elf", 32), ("langflow", 8), ("langflow", 64)])
def test_each_step_from_the_official_state_is_within_one_calls_error(family, nfe, monkeypatch):
    pipe, golden = _elf(nfe) if family == "elf" else _langflow(nfe)
    errors = run_from_official_latents(pipe, golden, monkeypatch)
    worst = max(range(len(errors)), key=errors.__getitem__)
    assert_within(errors[worst], STEP_TOLERANCE, f"{family}, {nfe} steps, step {worst} from the official latent")


@pytest.mark.parametrize("family,nfe", [("elf", 8), ("elf", 32), ("langflow", 8), ("langflow", 64)])
def test_each_network_call_on_the_official_inputs_is_within_the_network_tolerance(family, nfe, monkeypatch):
    pipe, golden = _elf(nfe) if family == "elf" else _langflow(nfe)
    errors = []
    replay_official_network(pipe, golden, monkeypatch, network_errors=errors)
    _run_recording(pipe, golden)
    assert len(errors) == nfe + (family == "elf")  # ELF's decode pass too
    assert max(errors) <= NETWORK_TOLERANCE, [f"{error:.1e}" for error in errors]
