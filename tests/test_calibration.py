"""Calibration: the reference recurrence's moments, base scales, determinism, entry points and errors."""

import ast
import copy
import inspect
import math

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler, UntiedSelfConditioningScheduler
from untied_sc.calibration import (
    MomentAccumulator,
    base_scales_from_gram,
    calibrate_pipeline,
    reference_activation,
    trajectory_statistics,
)
from untied_sc.calibration import calibrate as calibrate_module
from untied_sc.calibration.calibrate import bank_seeds, run_updates
from untied_sc.calibration.reference import ReferenceRecurrenceMixin, reference_recurrence
from untied_sc.cli import main as cli_main
from untied_sc.models import LangFlowTransformerModel
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.sampler_statistics import num_update_steps
from untied_sc_lab.ablations.correction_functions import moment_projection

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


@pytest.fixture
def elf_pipe(elf_golden):
    pipe = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture
def langflow_pipe(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_reference_activation_schedule():
    assert [reference_activation(k, 10) for k in (0, 3)] == [0.0, 0.0]  # r ≤ 0.40
    assert reference_activation(4, 10) == pytest.approx(math.sqrt(0.1 / 0.55))  # r = 0.5
    assert reference_activation(8, 10) == pytest.approx(math.sqrt(0.5 / 0.55))  # r = 0.9
    assert reference_activation(9, 10) == 0.0  # r = 1.0 > 0.95


def test_base_scales_from_a_known_gram():
    chi = math.sqrt(2 / (0.25**2 + 0.75**2))
    assert base_scales_from_gram(torch.eye(2)) == pytest.approx((0.75 * chi * 0.25, 0.75 * chi * 0.75))
    # Scaling both responses alike leaves the scales unchanged: only their relative geometry matters.
    gram = torch.tensor([[2.0, 0.5], [0.5, 1.0]])
    assert base_scales_from_gram(10 * gram) == pytest.approx(base_scales_from_gram(gram))
    with pytest.raises(ValueError, match="degenerate"):
        base_scales_from_gram(torch.zeros(2, 2))


def test_moment_accumulator_matches_a_direct_computation_over_stored_corrections(langflow_pipe):
    """Runs the reference recurrence, keeps every Ũ_k and δ̃_k, and recomputes eq. (empirical_carrier_statistics)."""
    stored = []

    class Recording(MomentAccumulator):
        def add(self, step, correction, distance, mask):
            stored.append((step, correction.double().clone(), distance.double().clone()))
            super().add(step, correction, distance, mask)

    scheduler = reference_recurrence("langflow", 1.0, alpha=0.8)
    scheduler.accumulator = Recording(7, 32)
    for seed in (1, 2):
        run_updates(langflow_pipe, scheduler, 8, torch.Generator().manual_seed(seed), batch_size=3)
    active_steps = sorted({step for step, _, _ in stored})
    assert active_steps == [k for k in range(7) if reference_activation(k, 7) > 0]
    for k in range(7):
        corrections = [c for step, c, _ in stored if step == k]
        distances = [d for step, _, d in stored if step == k]
        if not corrections:
            assert scheduler.accumulator.mean()[k].abs().max() == 0 and scheduler.accumulator.rms()[k] == 0
            continue
        u, d = torch.cat(corrections), torch.cat(distances)
        token_mean = u.mean(dim=1)
        assert torch.allclose(scheduler.accumulator.mean()[k], token_mean.mean(dim=0), atol=1e-10)
        assert torch.allclose(scheduler.accumulator.cosine_distance()[k], d.mean(dim=1).mean(), atol=1e-10)
        rms = ((u - token_mean[:, None]) ** 2).sum().div(u.numel()).sqrt()
        assert torch.allclose(scheduler.accumulator.rms()[k], rms, atol=1e-10)


def test_same_seeds_give_bitwise_identical_statistics(elf_pipe):
    first = calibrate_pipeline(elf_pipe, [8], bank_size=4, batch_size=2, base_scale_bank_size=2, progress=False)
    second = calibrate_pipeline(elf_pipe, [8], bank_size=4, batch_size=2, base_scale_bank_size=2, progress=False)
    for name, tensor in first.statistics.state_dict().items():
        assert torch.equal(tensor, second.statistics.state_dict()[name]), name
    assert first.statistics.rms_nfe8.max() > 0


def test_bank_order_does_not_change_the_statistics(elf_pipe):
    bank_mu, bank_sigma = bank_seeds(3, 0, 6, 2), bank_seeds(3, 1, 6, 2)
    forward = trajectory_statistics(elf_pipe, 8, 1.0, 0.8, bank_mu, bank_sigma, progress=False)
    backward = trajectory_statistics(elf_pipe, 8, 1.0, 0.8, bank_mu[::-1], bank_sigma[::-1], progress=False)
    for a, b in zip(forward, backward, strict=True):
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-6)


def test_calibrated_moments_carry_over_to_a_held_out_bank(langflow_pipe):
    """Π_k with calibrated μ_k, σ_k has exactly those moments; a held-out bank's own moments agree within noise."""
    mean, rms, _ = trajectory_statistics(
        langflow_pipe, 8, 1.0, 0.8, bank_seeds(0, 0, 24, 8), bank_seeds(0, 1, 24, 8), progress=False
    )
    held_mean, held_rms, _ = trajectory_statistics(
        langflow_pipe, 8, 1.0, 0.8, bank_seeds(5, 0, 24, 8), bank_seeds(5, 1, 24, 8), progress=False
    )
    active = rms > 0
    assert active.sum() >= 3
    relative_rms_error = ((held_rms - rms).abs() / rms)[active]
    assert relative_rms_error.max() < 0.25
    direction = torch.randn(4, 12, 32, generator=torch.Generator().manual_seed(0))
    for k in torch.nonzero(active).flatten().tolist():
        projected = moment_projection(direction, mean[k], rms[k].item())
        assert torch.allclose(projected.mean(dim=1), mean[k].expand(4, -1), atol=1e-5)
        centred = projected - projected.mean(dim=1, keepdim=True)
        assert torch.allclose(centred.pow(2).mean(dim=(1, 2)).sqrt(), rms[k].expand(4), rtol=1e-4)


def test_calibrate_extends_existing_statistics_and_enables_untied_sampling(langflow_pipe):
    langflow_pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    first = langflow_pipe.sampler_statistics.rms_nfe8.clone()
    langflow_pipe.calibrate(nfe=[16], bank_size=4, batch_size=4, progress=False)
    statistics = langflow_pipe.sampler_statistics
    assert statistics.config.calibrated_steps == [8, 16] and torch.equal(statistics.rms_nfe8, first)
    assert statistics.config.bank_sizes == {"8": [4, 4], "16": [4, 4]}
    langflow_pipe.scheduler = UntiedSelfConditioningScheduler.from_config(langflow_pipe.scheduler.config)
    output = langflow_pipe(batch_size=2, num_inference_steps=16, generator=torch.Generator().manual_seed(0))
    assert len(output.texts) == 2
    with pytest.raises(ValueError, match=r"\[8, 16\]"):  # the error names the calibrated NFEs
        langflow_pipe(batch_size=2, num_inference_steps=32)


def test_cli_calibrate_writes_statistics_into_the_folder(tmp_path, capsys, langflow_pipe):
    copy.deepcopy(langflow_pipe.transformer).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    langflow_pipe.save_pretrained(tmp_path)
    # a bf16 weight file stays as it is: only the statistics component is written in place
    weights = tmp_path / "transformer" / "diffusion_pytorch_model.safetensors"
    weights.write_bytes((tmp_path / "bf16" / "diffusion_pytorch_model.safetensors").read_bytes())
    before = {p: p.read_bytes() for p in (tmp_path / "transformer").iterdir()}
    before.update({p: p.read_bytes() for p in (tmp_path / "tokenizer").iterdir()})
    code = cli_main(["calibrate", str(tmp_path), "--nfe", "8", "--bank-size", "4", "--batch-size", "4"])
    assert code == 0
    out = capsys.readouterr().out
    assert "| NFE | active steps |" in out and "calibrated NFEs [8]" in out
    reloaded = load_pipeline(tmp_path)
    assert reloaded.sampler_statistics.config.calibrated_steps == [8]
    # default seed 2000: streams 2·2000 and 2·2000 + 1 of the calibration seed space
    assert reloaded.sampler_statistics.config.seeds == {"8": {"space": "calibration", "streams": [4000, 4001]}}
    assert all(path.read_bytes() == data for path, data in before.items())
    assert cli_main(["calibrate", "someone/model", "--nfe", "8"]) == 2
    assert "give --output FOLDER" in capsys.readouterr().err


def test_bad_calibration_input_gives_clear_errors(elf_pipe, langflow_golden):
    with pytest.raises(ValueError, match="bank_size must be ≥ 2"):
        calibrate_pipeline(elf_pipe, [8], bank_size=1, progress=False)
    with pytest.raises(ValueError, match="integer ≥ 2"):
        calibrate_pipeline(elf_pipe, [1], progress=False)
    with pytest.raises(ValueError, match="banks overlap"):
        trajectory_statistics(elf_pipe, 8, 1.0, 0.8, bank_seeds(0, 0, 4, 2), bank_seeds(0, 0, 4, 2), progress=False)
    with pytest.raises(ValueError, match="Unknown coefficient preset 'nope'"):
        calibrate_pipeline(elf_pipe, [12], coefficients="nope", progress=False)
    with pytest.raises(ValueError, match="alpha at 12 steps must lie in"):
        calibrate_pipeline(elf_pipe, [12], coefficients={12: {"eta_r": 1, "eta_t": 1, "eta_o": 1, "alpha": 2}})
    config = dict(langflow_from_golden(langflow_golden).config)
    no_sc = LangFlowTransformerModel(**{**config, "self_conditioning": False})
    pipe = LangFlowPipeline(no_sc, LangFlowScheduler(), tiny_tokenizer())
    with pytest.raises(ValueError, match="no self-conditioning input"):
        calibrate_pipeline(pipe, [8], progress=False)


# ---- calibration runs the pipeline's public denoising loop --------------------------------------------------------


def test_calibration_module_touches_no_private_pipeline_member():
    tree = ast.parse(inspect.getsource(calibrate_module))
    private = sorted(
        {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "pipe"
            and node.attr.startswith("_")
        }
    )
    assert private == [], f"calibration uses private pipeline members {private}; use `pipe.denoise`"


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_calibration_calls_the_network_only_inside_pipe_denoise(request, monkeypatch, family):
    """Every network call of the trajectory banks happens inside `pipe.denoise`: one call per bank batch."""
    pipe = request.getfixturevalue(f"{family}_pipe")
    depth, denoise_calls, predict_calls = [0], [], []
    denoise, predict = pipe.denoise, pipe._predict

    def counted_denoise(*args, **kwargs):
        denoise_calls.append(kwargs.get("scheduler"))
        depth[0] += 1
        try:
            return denoise(*args, **kwargs)
        finally:
            depth[0] -= 1

    def guarded_predict(*args, **kwargs):
        assert depth[0] == 1, "the network was called outside pipe.denoise"
        predict_calls.append(1)
        return predict(*args, **kwargs)

    monkeypatch.setattr(pipe, "denoise", counted_denoise)
    monkeypatch.setattr(pipe, "_predict", guarded_predict)
    bank_mu, bank_sigma = bank_seeds(0, 0, 5, 2), bank_seeds(0, 1, 5, 2)
    trajectory_statistics(pipe, 8, 1.0, 0.8, bank_mu, bank_sigma, progress=False)
    assert len(denoise_calls) == len(bank_mu) + len(bank_sigma) == 6
    assert all(isinstance(scheduler, ReferenceRecurrenceMixin) for scheduler in denoise_calls)
    update_steps = 8 if family == "elf" else 7  # LangFlow's final evaluation is skipped
    assert len(predict_calls) == 6 * update_steps


def _hand_written_update_steps(pipe, scheduler, num_inference_steps, generator, batch_size):
    """The reference recurrence's update steps written out with the scheduler and the network (no pipeline loop)."""
    if pipe.family == "elf":
        scheduler.set_timesteps(num_inference_steps, generator=generator)
    else:
        scheduler.set_timesteps(num_inference_steps, proposal=pipe.transformer.gumbel_parameters())
    latents = torch.randn((batch_size, *pipe.latent_shape), generator=generator) * scheduler.init_noise_sigma
    for t in scheduler.timesteps[: num_update_steps(pipe.family, num_inference_steps)]:
        model_input = scheduler.scale_model_input(latents, t)
        if pipe.family == "elf":
            prediction = pipe.transformer(model_input, t, scheduler.self_conditioning, pipe.sc_cfg_scale).sample
        else:
            logits = pipe.transformer(model_input, t, scheduler.self_conditioning).logits
            prediction = pipe.transformer.clean_prediction(logits)
        latents = scheduler.step(prediction.float(), t, latents).prev_sample


@pytest.mark.parametrize("family", ["elf", "langflow"])
@torch.no_grad()
def test_run_updates_through_the_pipeline_loop_equals_the_hand_written_recurrence_bit_for_bit(request, family):
    pipe = request.getfixturevalue(f"{family}_pipe")
    moments = []
    for run in (run_updates, _hand_written_update_steps):
        scheduler = reference_recurrence(family, 1.0, alpha=0.8)
        scheduler.accumulator = MomentAccumulator(num_update_steps(family, 8), pipe.latent_shape[1])
        for seed in (1, 2):
            run(pipe, scheduler, 8, torch.Generator().manual_seed(seed), 3)
        moments.append(
            (scheduler.accumulator.mean(), scheduler.accumulator.rms(), scheduler.accumulator.cosine_distance())
        )
    assert moments[0][1].max() > 0
    for through_pipeline, by_hand in zip(*moments, strict=True):
        assert torch.equal(through_pipeline, by_hand)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_generator_calibrates_on_the_device_stream_reproducibly(elf_pipe):
    # The base-scale runs once drew from a CUDA generator on the CPU and failed (found on an H200).
    pipe = elf_pipe.to("cuda")
    options = {"bank_size": 4, "batch_size": 2, "base_scale_bank_size": 2, "progress": False}
    runs = [calibrate_pipeline(pipe, [8], generator_device="cuda", **options) for _ in range(2)]
    for name, tensor in runs[0].statistics.state_dict().items():
        assert torch.equal(tensor, runs[1].statistics.state_dict()[name]), name
    cpu_stream = calibrate_pipeline(pipe, [8], **options)
    assert not torch.equal(runs[0].statistics.base_scales, cpu_stream.statistics.base_scales)
