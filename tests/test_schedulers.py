"""The official schedulers: grids, reproducibility, serialization, swapping, and errors."""

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.schedulers.scheduling_langflow import gumbel_gamma_grid, gumbel_gamma_range

from .conftest import assert_official_grid, elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


def _elf_pipe(elf_golden, scheduler=None):
    pipe = ELFPipeline(elf_from_golden(elf_golden), scheduler or ELFScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _langflow_pipe(langflow_golden, scheduler=None):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), scheduler or LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _public(config) -> dict:
    return {key: value for key, value in config.items() if not key.startswith("_")}


def _sample(pipe, seed=0, steps=8):
    return pipe(
        batch_size=2, num_inference_steps=steps, generator=torch.Generator().manual_seed(seed), output_type="seq"
    )


def test_langflow_grid_equals_the_official_proposal_quantiles(langflow_golden):
    loc, scale, cutoff = langflow_from_golden(langflow_golden).gumbel_parameters()
    for n in (8, 64):
        grid = gumbel_gamma_grid(n, loc, scale, cutoff, quantile_eps=1e-5)
        # the logs of the icdf round differently across CPUs (conftest.GRID_ULPS)
        assert_official_grid(grid, langflow_golden.outputs[f"gamma_grid_{n}"], f"the {n}-step grid")
    # γ_min and γ_max are float32 products and differences, correctly rounded on every CPU: bit for bit
    gamma_min, gamma_max = gumbel_gamma_range(loc, scale, cutoff)
    assert gamma_min == langflow_golden.outputs["gamma_min"].item()
    assert gamma_max == langflow_golden.outputs["gamma_max"].item()
    # torch's icdf differs from the closed form loc − scale·log(−log q) at the noisy end (SPEC §3.2).
    closed_form = loc - scale * torch.log(-torch.log(torch.tensor(1 - 1e-5, dtype=torch.float64)))
    assert abs(grid[0].item() - closed_form.item()) > 1e-3


def test_elf_grid_is_sorted_shared_and_does_not_advance_the_generator():
    scheduler = ELFScheduler()
    generator = torch.Generator().manual_seed(3)
    state = generator.get_state()
    scheduler.set_timesteps(8, generator=generator)
    grid = scheduler.solver.grid
    assert grid[0] == 0.0 and grid[-1] == 1.0 and grid == sorted(grid) and len(grid) == 9
    assert torch.equal(generator.get_state(), state)
    # s_k = a_k·t_k with a_k = clip(1 − 2.0·Δt, 0, 1) on SDE steps; the last (ODE) step sees t_{N−1}.
    for k in range(7):
        alpha = max(0.0, min(1.0, 1 - 2.0 * (grid[k + 1] - grid[k])))
        assert scheduler.timesteps[k].item() == pytest.approx(alpha * grid[k], abs=1e-7)
    assert scheduler.timesteps[-1].item() == pytest.approx(grid[-2], abs=1e-7)


def test_elf_base_solver_quantities():
    scheduler = ELFScheduler()
    scheduler.set_timesteps(8, generator=torch.Generator().manual_seed(0))
    solver = scheduler.solver
    assert solver.num_update_steps == 8
    assert sum(solver.delta_u(k) for k in range(8)) == pytest.approx(1.0)
    assert all(0 <= solver.delta_u(k) <= 1 for k in range(8))
    assert solver.beta(7) == 1.0 and solver.kappa(7) == 1.0  # the final ODE step lands on the prediction
    # S_k is affine in q: S(z, q) = S(z, 0) + β_k q.
    z, q = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    for k in range(8):
        affine = solver.update(k, z, torch.zeros_like(q)) + solver.beta(k) * q
        assert torch.allclose(solver.update(k, z, q), affine, atol=1e-5)


def test_langflow_base_solver_quantities(langflow_golden):
    scheduler = LangFlowScheduler()
    scheduler.set_timesteps(8, proposal=langflow_from_golden(langflow_golden).gumbel_parameters())
    solver = scheduler.solver
    assert solver.num_update_steps == 7
    gammas = scheduler.timesteps.double()
    for k in range(7):
        ratio = torch.exp((gammas[k + 1] - gammas[k]) / 2).item()
        assert solver.kappa(k) == pytest.approx(1 - ratio)
        # In O = z/α coordinates the update is O' = r·O + (1 − r)·q.
        z, q = torch.randn(1, 2, 3, dtype=torch.float64), torch.randn(1, 2, 3, dtype=torch.float64)
        alpha = torch.sigmoid(-gammas).sqrt()
        expected = (ratio * z / alpha[k] + (1 - ratio) * q) * alpha[k + 1]
        assert torch.allclose(solver.update(k, z, q), expected, atol=1e-12)
    assert 0 < sum(solver.delta_u(k) for k in range(7)) <= 1


@pytest.mark.parametrize("scheduler_cls", [ELFScheduler, LangFlowScheduler])
def test_from_config_to_a_stock_diffusers_scheduler_and_back(scheduler_cls):
    ours = scheduler_cls.from_config(
        scheduler_cls().config, **({"sde_gamma": 1.25} if scheduler_cls is ELFScheduler else {})
    )
    stock = FlowMatchEulerDiscreteScheduler.from_config(ours.config)
    back = scheduler_cls.from_config(stock.config)
    assert _public(back.config) == _public(ours.config)


def test_stock_scheduler_runs_in_the_pipelines_without_self_conditioning(elf_golden, langflow_golden):
    """
    A stock diffusers scheduler (no `self_conditioning`, no `scale_model_input`) drives the loop: the network gets
    no self-conditioning input, is called once per stock timestep in order, and the latents are the stock
    scheduler's steps on the network's predictions, written out here by hand.
    """
    for pipe in (_elf_pipe(elf_golden), _langflow_pipe(langflow_golden)):
        pipe.scheduler = FlowMatchEulerDiscreteScheduler()
        calls = []
        predict = pipe._predict

        def recording(model_input, timestep, self_conditioning, *args, predict=predict, calls=calls, **kwargs):
            calls.append((timestep, self_conditioning))
            return predict(model_input, timestep, self_conditioning, *args, **kwargs)

        pipe._predict = recording
        output = _sample(pipe, steps=3)
        assert [sc for _, sc in calls] == [None] * 3
        stock = FlowMatchEulerDiscreteScheduler()
        stock.set_timesteps(3)
        assert torch.equal(torch.stack([t for t, _ in calls]), stock.timesteps)
        generator = torch.Generator().manual_seed(0)
        latents = torch.randn((2, *pipe.latent_shape), generator=generator)  # init_noise_sigma = 1
        for t in stock.timesteps:
            prediction, _ = predict(latents, t, None)
            latents = stock.step(prediction, t, latents, generator=generator).prev_sample
        assert torch.equal(output.latents, latents)
        assert output.sequences.shape == (2, 12)


def test_scheduler_errors_are_clear(langflow_golden):
    elf = ELFScheduler()
    with pytest.raises(ValueError, match="≥ 2"):
        elf.set_timesteps(1, generator=torch.Generator())
    with pytest.raises(ValueError, match="single torch.Generator"):
        elf.set_timesteps(8, generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(RuntimeError, match="set_timesteps"):
        ELFScheduler().step(torch.zeros(1, 2, 3), 0.0, torch.zeros(1, 2, 3))
    elf.set_timesteps(8, generator=torch.Generator())
    with pytest.raises(RuntimeError, match="scale_model_input"):
        elf.step(torch.zeros(1, 2, 3), elf.timesteps[0], torch.zeros(1, 2, 3))
    with pytest.raises(ValueError, match=r"got timestep 0.5, but the current step \(0\) is at timesteps\[0\] = 0"):
        elf.step(torch.zeros(1, 2, 3), 0.5, torch.zeros(1, 2, 3))
    ELFScheduler.from_config(elf.config, sde_gamma=0.5).set_timesteps(12, generator=torch.Generator())
    with pytest.raises(ValueError, match="proposal"):
        LangFlowScheduler().set_timesteps(8)
    langflow = LangFlowScheduler()
    langflow.set_timesteps(2, proposal=langflow_from_golden(langflow_golden).gumbel_parameters())
    for t in langflow.timesteps:
        langflow.step(torch.zeros(1, 2, 3), t, torch.zeros(1, 2, 3))
    with pytest.raises(RuntimeError, match="All 2 evaluations are done"):
        langflow.step(torch.zeros(1, 2, 3), langflow.timesteps[-1], torch.zeros(1, 2, 3))
