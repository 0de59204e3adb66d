"""The DPM-Solver++(2M) schedulers (schedulers/scheduling_multistep.py) against an independent formulation.

A Gaussian data model x ~ N(μ, s_d²) (per entry) has an exact denoiser and an exact probability-flow solution under
either family's noising z = α x + σ ε: D(z) = μ + α s_d²/(α² s_d² + σ²)·(z − α μ), and the flow keeps
(z − α μ)/sqrt(α² s_d² + σ²) constant. On it, each family's multistep scheduler (driven by the exact denoiser)
must equal DPM-Solver++(2M) written here from the paper (Lu et al., arXiv 2211.01095, Algorithm 2, in the form of
k-diffusion's `sample_dpmpp_2m`), and converge to the exact solution at order 2 (order 1 at strength 0, DDIM).

The grids are uniform in λ (LangFlow's in γ = −2λ, ELF's t = e^λ/(s^{-1} + e^λ)), so that doubling N halves every step
(a uniform t grid would not: its λ steps near t = 0 and 1 stay fixed); ELF runs its ODE (γ_sde = 0) with the
velocity clamp out of the way (t_eps = 1e-6), where its step is DDIM.
"""

import math

import pytest
import torch

from untied_sc.schedulers import MultistepELFScheduler, MultistepLangFlowScheduler, scheduling_elf, scheduling_langflow


MU, DATA_STD = 0.7, 0.5
NOISE_SCALE = 2.0
GAMMA_START, GAMMA_END = 6.0, -2.0  # LangFlow: α² = sigmoid(−γ) from 0.0025 to 0.88
LOG_SNR_START, LOG_SNR_END = -3.0, 3.0  # ELF: t from 0.09 to 0.98


def alpha_sigma(family: str, time: float) -> tuple[float, float]:
    """(α, σ) at a time of the family: LangFlow γ (α² = sigmoid(−γ), σ² = sigmoid(γ)); ELF t (α = t, σ = s(1 − t))."""
    if family == "langflow":
        alpha_sq = 1.0 / (1.0 + math.exp(time))
        return math.sqrt(alpha_sq), math.sqrt(1.0 - alpha_sq)
    return time, NOISE_SCALE * (1.0 - time)


def log_snr(alpha: float, sigma: float) -> float:
    if alpha == 0.0:
        return -math.inf
    return math.inf if sigma == 0.0 else math.log(alpha / sigma)


def exact_denoiser(z: torch.Tensor, alpha: float, sigma: float) -> torch.Tensor:
    return MU + alpha * DATA_STD**2 / (alpha**2 * DATA_STD**2 + sigma**2) * (z - alpha * MU)


def exact_flow(z: torch.Tensor, start: tuple[float, float], end: tuple[float, float]) -> torch.Tensor:
    (a0, s0), (a1, s1) = start, end
    return a1 * MU + math.sqrt(a1**2 * DATA_STD**2 + s1**2) * (z - a0 * MU) / math.sqrt(a0**2 * DATA_STD**2 + s0**2)


def dpm_solver_pp_2m(z: torch.Tensor, family: str, times: list[float]) -> torch.Tensor:
    """
    DPM-Solver++(2M) from the paper: with λ = log(α/σ), h_i = λ_{i+1} − λ_i, r_i = h_{i−1}/h_i,
    D_i = (1 + 1/(2r_i))·x̂_i − 1/(2r_i)·x̂_{i−1} (x̂_i the denoiser at step i; D_0 = x̂_0, and the last step into
    σ = 0 is first order), z_{i+1} = (σ_{i+1}/σ_i)·z_i − α_{i+1}·(e^{−h_i} − 1)·D_i.
    """
    previous, previous_h = None, None
    for time, next_time in zip(times, times[1:], strict=False):
        (alpha, sigma), (next_alpha, next_sigma) = alpha_sigma(family, time), alpha_sigma(family, next_time)
        denoised = exact_denoiser(z, alpha, sigma)
        h = log_snr(next_alpha, next_sigma) - log_snr(alpha, sigma)
        combined = denoised
        if previous is not None and next_sigma > 0:
            r = previous_h / h
            combined = (1 + 1 / (2 * r)) * denoised - 1 / (2 * r) * previous
        z = (next_sigma / sigma) * z - next_alpha * math.expm1(-h) * combined
        previous, previous_h = denoised, h
    return z


def uniform_grid(family: str, steps: int) -> torch.Tensor:
    """The grid the scheduler is made to use, uniform in λ: LangFlow's `steps + 1` γ (the last one only evaluated),
    ELF's t_0..t_N (λ = log(t/(s(1 − t))))."""
    if family == "langflow":
        return torch.linspace(GAMMA_START, GAMMA_END, steps + 1)
    ratio = NOISE_SCALE * torch.linspace(LOG_SNR_START, LOG_SNR_END, steps + 1, dtype=torch.float64).exp()
    return (ratio / (1 + ratio)).float()


def multistep_run(family: str, steps: int, strength: float, monkeypatch) -> tuple[torch.Tensor, torch.Tensor, list]:
    """
    (z_0, the scheduler's final latent, the times it passed: every evaluation time, then ELF's final target t_N)
    with the exact denoiser as the network.
    """
    grid = uniform_grid(family, steps)
    if family == "langflow":
        monkeypatch.setattr(scheduling_langflow, "gumbel_gamma_grid", lambda *args: grid.clone())
        scheduler = MultistepLangFlowScheduler(multistep_strength=strength, proposal=[4.5, 0.9, 1e-5])
        scheduler.set_timesteps(steps + 1)
    else:
        monkeypatch.setattr(scheduling_elf, "elf_time_grid", lambda *args: grid.clone())
        scheduler = MultistepELFScheduler(multistep_strength=strength, sde_gamma=0.0, t_eps=1e-6)
        scheduler.set_timesteps(steps, generator=torch.Generator().manual_seed(0))
    z0 = torch.linspace(-2.0, 2.0, 24, dtype=torch.float64).reshape(2, 3, 4)
    latents, times = z0, []
    for t in scheduler.timesteps:
        time = scheduler.solver.eval_time(scheduler.step_index)  # exact (float64), not the float32 timestep
        times.append(time)
        model_input = scheduler.scale_model_input(latents, t)  # ELF at γ_sde = 0: z itself
        prediction = exact_denoiser(model_input, *alpha_sigma(family, time))
        latents = scheduler.step(prediction, t, latents).prev_sample
    if family == "elf":
        times.append(scheduler.solver.grid[-1])  # LangFlow's last time is its final evaluation's, which moves nothing
    return z0, latents, times


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_multistep_scheduler_is_dpm_solver_pp_2m_from_the_paper(family, monkeypatch):
    z0, latents, times = multistep_run(family, 16, 1.0, monkeypatch)
    expected = dpm_solver_pp_2m(z0, family, times)
    torch.testing.assert_close(latents, expected, rtol=1e-10, atol=1e-10)
    _, official, _ = multistep_run(family, 16, 0.0, monkeypatch)
    assert (official - expected).abs().max() > 1e-4  # the second-order term does act


def _order(errors: list[float]) -> list[float]:
    return [math.log2(coarse / fine) for coarse, fine in zip(errors, errors[1:], strict=False)]


@pytest.mark.parametrize("family", ["langflow", "elf"])
@pytest.mark.parametrize("strength,order", [(1.0, 2.0), (0.0, 1.0)])
def test_multistep_scheduler_converges_to_the_exact_flow_at_its_order(family, strength, order, monkeypatch):
    """Error to the exact probability-flow solution as N doubles: ×1/4 for DPM-Solver++(2M), ×1/2 for DDIM."""
    errors = []
    for steps in (16, 32, 64, 128):
        z0, latents, times = multistep_run(family, steps, strength, monkeypatch)
        exact = exact_flow(z0, alpha_sigma(family, times[0]), alpha_sigma(family, times[-1]))
        errors.append((latents - exact).abs().max().item())
    orders = _order(errors)
    assert all(abs(measured - order) < 0.3 for measured in orders), (errors, orders)
    assert errors[-1] < (2e-4 if strength else 2e-2)
