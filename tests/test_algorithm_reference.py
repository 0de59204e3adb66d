"""Algorithm 1 written out as a plain loop, compared with the untied schedulers (ELF, LangFlow) in float64.

The reference below is the paper's Algorithm 1 (docs/algorithm.md §3) spelled out step by step over the pure
functions of `untied_functions` and the official solvers' step functions (`ELFSolver`, `LangFlowSolver`). It does
not use the scheduler or any of its state handling: the grid, the re-noising draws, E_k, O_k, m_k, κ_{k−1} and
δ̄_{k−1} are all kept here. The scheduler is then driven over the same deterministic toy denoiser, and every tensor
the network sees or the solver receives must agree in float64.

These tests catch mistakes that "finite and different from the official sampler" cannot, e.g. κ_k in place of κ_{k−1}
in â_k, the EMA E fed with p + A, or the solver average O fed with the raw p.
"""

import pytest
import torch

from untied_sc import SamplerStatistics, UntiedELFScheduler, UntiedLangFlowScheduler
from untied_sc.schedulers.scheduling_elf import copy_generator, elf_time_grid
from untied_sc.schedulers.scheduling_langflow import gumbel_gamma_grid, gumbel_gamma_range
from untied_sc.schedulers.solvers import ELFSolver, LangFlowSolver
from untied_sc.schedulers.untied_functions import (
    combined_direction,
    history_direction,
    moment_projection,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)


DTYPE = torch.float64
BATCH, LENGTH, WIDTH, RANK = 3, 7, 12, 8
STEPS = 8
PROPOSAL = (4.723, 0.852, 1e-5)  # LangFlow's (loc, scale, cutoff): the model defaults
BASE_SCALES = (0.8, 0.9)  # λ_R^(0), g_T^(0)
COEFFICIENTS = {"eta_r": 2.0, "eta_t": 1.5, "eta_o": 1.2, "alpha": 0.7}
EPS_FP, DEGENERACY_EPS = 0.01, 1e-12


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: a deterministic toy denoiser and statistics with a non-trivial overlap spectrum.
# ----------------------------------------------------------------------------------------------------------------


class ToyDenoiser:
    """p = tanh(W_z z + W_m m̃ + t·c + ½·mean over positions): smooth, nonlinear, mixes positions, float64."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.w_z = torch.randn(WIDTH, WIDTH, generator=g, dtype=DTYPE) / WIDTH**0.5
        self.w_m = torch.randn(WIDTH, WIDTH, generator=g, dtype=DTYPE) / WIDTH**0.5
        self.time = torch.randn(WIDTH, generator=g, dtype=DTYPE)

    def __call__(self, z: torch.Tensor, m: torch.Tensor | None, t: float) -> torch.Tensor:
        t = torch.tensor(t, dtype=torch.float32).item()  # the network's time input is float32, as `timesteps`
        h = z @ self.w_z + t * 0.3 * self.time
        if m is not None:  # the network's "no self-conditioning yet" is m = 0
            h = h + m @ self.w_m
        return torch.tanh(h + 0.5 * h.mean(dim=1, keepdim=True))


def make_statistics(solver: str, seed: int = 1) -> SamplerStatistics:
    """Q (D×r, orthonormal), ρ² spread over [0, 1), base scales and random μ, σ, δ̄ for STEPS, all float64."""
    g = torch.Generator().manual_seed(seed)
    updates = STEPS if solver == "elf" else STEPS - 1
    basis = torch.linalg.qr(torch.randn(WIDTH, RANK, generator=g, dtype=DTYPE)).Q
    rho_sq = torch.sort(torch.rand(RANK, generator=g, dtype=DTYPE) * 0.98, descending=True).values
    rms = 0.1 + torch.rand(updates, generator=g, dtype=DTYPE)
    rms[0] = 0.0  # an inactive step (H_0 = 0), as the reference schedule gives early on
    mean = 0.05 * torch.randn(updates, WIDTH, generator=g, dtype=DTYPE)
    mean[0] = 0.0
    cosine_distance = 0.1 + 0.8 * torch.rand(updates, generator=g, dtype=DTYPE)  # nonzero: â depends on it
    statistics = SamplerStatistics(
        solver=solver, latent_dim=WIDTH, rank=RANK, calibrated_steps=[STEPS], model_fingerprint="toy"
    )
    # Assigning a tensor to a buffer's name replaces the buffer: the statistics are float64 throughout.
    statistics.basis, statistics.rho_sq = basis, rho_sq
    statistics.base_scales = torch.tensor(BASE_SCALES, dtype=DTYPE)
    setattr(statistics, f"mean_nfe{STEPS}", mean)
    setattr(statistics, f"rms_nfe{STEPS}", rms)
    setattr(statistics, f"cosine_distance_nfe{STEPS}", cosine_distance)
    assert all(buffer.dtype == DTYPE for name, buffer in statistics.named_buffers() if "coefficients" not in name)
    return statistics


def make_mask() -> torch.Tensor:
    """Active positions: sample 0 all, sample 1 a padded tail, sample 2 a clamped prefix and a gap."""
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, :2] = False
    mask[2, 5] = False
    return mask


def initial_latent(solver: str, generator: torch.Generator) -> torch.Tensor:
    """z_0: ELF 2.0·ε (from the sampling generator, after the grid's copy), LangFlow ε."""
    noise = torch.randn(BATCH, LENGTH, WIDTH, generator=generator, dtype=DTYPE)
    return noise * 2.0 if solver == "elf" else noise


# ----------------------------------------------------------------------------------------------------------------
# The reference: Algorithm 1 as a plain loop.
# ----------------------------------------------------------------------------------------------------------------


def reference_algorithm(
    solver_name: str,
    model,
    statistics: SamplerStatistics,
    seed: int,
    coefficients: dict,
    routing: str = "solver",
    global_scaling: bool = True,
    mask: torch.Tensor | None = None,
    online: bool = False,
    assignment: str = "overlap",
) -> list[dict]:
    """
    Algorithm 1 (docs/algorithm.md §3.4) with the official solver S_k; returns one record per network evaluation:
    the network's inputs (z_in, m̃_k), its prediction p_k and, on update steps, the solver input q_k and z_{k+1}.
    """
    eta_r, eta_t, eta_o, alpha = (coefficients[name] for name in ("eta_r", "eta_t", "eta_o", "alpha"))
    generator = torch.Generator().manual_seed(seed)

    # The official base solver, built from its grid (docs/algorithm.md §2).
    if solver_name == "elf":
        grid = elf_time_grid(STEPS, copy_generator(generator), p_mean=-1.5, p_std=0.8).tolist()
        solver = ELFSolver(grid, sde_gamma=2.0, noise_scale=2.0, t_eps=0.05)
        num_updates = STEPS  # K_u = N: the last (ODE) step updates too
    else:
        gammas = gumbel_gamma_grid(STEPS, *PROPOSAL, quantile_eps=1e-5)
        solver = LangFlowSolver(gammas, *gumbel_gamma_range(*PROPOSAL))
        num_updates = STEPS - 1  # K_u = N − 1: then one final evaluation
    z = initial_latent(solver_name, generator)

    # Precomputed: Q, ρ² (permuted by the assignment ablation), λ_R = λ_R^(0)·η_R, μ_k, σ_k, δ̄_k.
    basis, rho_sq = statistics.basis, statistics.rho_sq
    if assignment == "reversed":
        rho_sq = rho_sq.flip(0)
    strength = statistics.base_scales[0].item() * eta_r
    step_statistics = statistics.for_steps(STEPS)

    # Initialise: m_0 = E_0 = O_0 = 0, κ_{−1} = 0, δ̄_{−1} = 0.
    m = torch.zeros_like(z)
    ema = torch.zeros_like(z)
    solver_average = torch.zeros_like(z)
    previous_kappa = 0.0
    previous_distance = torch.zeros(BATCH, dtype=DTYPE)  # δ̄_{k−1}, one per sample (equal unless online)

    records = []
    for k in range(STEPS):
        # 1. Self-conditioning transform m̃_k = F_k m_k, â_k = κ_{k−1}(1 − δ̄_{k−1}) (eqs. 13, 34, 7).
        m_tilde = torch.empty_like(m)
        for b in range(BATCH):
            a_hat = previous_kappa * (1.0 - previous_distance[b].item())
            ell = retention(rho_sq, a_hat, strength, EPS_FP, global_scaling)
            m_tilde[b] = overlap_transform(m[b : b + 1], basis, ell)[0]

        # 2. One model evaluation (ELF re-noises z_k to z_b at s_k first, except on its final ODE step).
        if solver_name == "elf" and solver.renoises(k):
            z_in = solver.renoise(k, z, torch.randn(z.shape, generator=generator, dtype=DTYPE))
        else:
            z_in = z
        prediction = model(z_in, m_tilde, solver.eval_time(k))
        record = {"model_input": z_in, "self_conditioning": m_tilde, "prediction": prediction}
        records.append(record)
        if k == num_updates:
            break  # LangFlow's final evaluation: no correction, no update

        # 3. H_k = 1[σ_k > 0](p_k − E_k); G_k from O_k; U_k = H_k + η_O Δu_k (H_k − G_k) (eqs. 36, 37, 38).
        sigma = step_statistics.rms[k].item()
        mu = step_statistics.mean[k]
        history = history_direction(prediction, ema, active=sigma > 0)
        solver_direction = solver_history_direction(prediction, history, solver_average, mask, DEGENERACY_EPS)
        direction = combined_direction(history, solver_direction, eta_o, solver.delta_u(k))

        # 4. A_k = η_T Π_k(U_k) (eq. 11).
        correction = eta_t * moment_projection(direction, mu, sigma, mask)

        # δ̄_k for the next transform: precomputed, or this trajectory's token mean of δ̃_k (per sample).
        if online:
            distance = token_cosine_distance(history, solver_direction, mask)
            active = mask if mask is not None else torch.ones(BATCH, LENGTH, dtype=torch.bool)
            distance_k = distance.sum(dim=1) / active.sum(dim=1).clamp(min=1)
        else:
            distance_k = torch.full((BATCH,), step_statistics.cosine_distance[k].item(), dtype=DTYPE)

        # Routing (eq. 12; the ablations of Table 3(a)): q_k to the solver and O, m_{k+1} to self-conditioning.
        corrected = prediction + correction
        q = corrected if routing in ("solver", "both") else prediction
        next_m = corrected if routing in ("self_conditioning", "both") else prediction

        # 5. z_{k+1} = S_k(z_k, q_k); O_{k+1} = (1 − κ_k)O_k + κ_k q_k (eq. 8).
        kappa = solver.kappa(k)
        z = solver.update(k, z_in, q)
        solver_average = (1 - kappa) * solver_average + kappa * q

        # 6. m_{k+1}; E_{k+1} = (1 − α)E_k + α p_k (eq. 6), always the raw prediction.
        m = next_m
        ema = (1 - alpha) * ema + alpha * prediction

        previous_kappa, previous_distance = kappa, distance_k
        record.update(solver_input=q, next_sample=z)
    return records


# ----------------------------------------------------------------------------------------------------------------
# The scheduler under test, driven as a pipeline drives it.
# ----------------------------------------------------------------------------------------------------------------


def scheduler_trajectory(
    solver_name: str, model, statistics: SamplerStatistics, seed: int, coefficients: dict, mask=None, **options
) -> list[dict]:
    scheduler_cls = UntiedELFScheduler if solver_name == "elf" else UntiedLangFlowScheduler
    scheduler = scheduler_cls(**coefficients, **options)
    generator = torch.Generator().manual_seed(seed)
    if solver_name == "elf":
        scheduler.set_timesteps(STEPS, generator=generator, statistics=statistics, mask=mask)
    else:
        scheduler.set_timesteps(STEPS, proposal=PROPOSAL, statistics=statistics, mask=mask)
    latents = initial_latent(solver_name, generator)
    updates = STEPS if solver_name == "elf" else STEPS - 1
    records = []
    for k, t in enumerate(scheduler.timesteps):
        model_input = scheduler.scale_model_input(latents, t)
        self_conditioning = scheduler.self_conditioning
        prediction = model(model_input, self_conditioning, t.item())
        out = scheduler.step(prediction, t, latents)
        if self_conditioning is None:  # before the first step the network gets no SC input: m̃_0 = 0
            self_conditioning = torch.zeros_like(prediction)
        record = {"model_input": model_input, "self_conditioning": self_conditioning, "prediction": prediction}
        if k < updates:
            record.update(solver_input=out.pred_original_sample, next_sample=out.prev_sample)
        records.append(record)
        latents = out.prev_sample
    return records


CASES = {
    "solver_routing": {},
    "self_conditioning_routing": {"correction_routing": "self_conditioning"},
    "both_routing": {"correction_routing": "both"},
    "no_global_scaling": {"global_scaling": False},
    "reversed_assignment": {"transform_assignment": "reversed"},
    "mask": {"mask": True},
    "online_distance": {"cosine_distance": "online"},
    "online_distance_mask_both_routing": {"cosine_distance": "online", "mask": True, "correction_routing": "both"},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("solver_name", ["elf", "langflow"])
def test_scheduler_matches_algorithm_1(solver_name, case):
    options = dict(CASES[case])
    mask = make_mask() if options.pop("mask", False) else None
    model, statistics, seed = ToyDenoiser(), make_statistics(solver_name), 123

    expected = reference_algorithm(
        solver_name,
        model,
        statistics,
        seed,
        COEFFICIENTS,
        routing=options.get("correction_routing", "solver"),
        global_scaling=options.get("global_scaling", True),
        mask=mask,
        online=options.get("cosine_distance") == "online",
        assignment=options.get("transform_assignment", "overlap"),
    )
    got = scheduler_trajectory(solver_name, model, statistics, seed, COEFFICIENTS, mask=mask, **options)

    assert len(got) == len(expected) == STEPS
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.keys() == e.keys(), f"step {k}"
        for name in e:
            assert g[name].dtype == DTYPE, f"{name} at step {k}"
            # Observed agreement is ≈ 1e-14 (summation order); any algorithmic slip is many orders larger.
            torch.testing.assert_close(
                g[name], e[name], rtol=1e-10, atol=1e-12, msg=lambda m, name=name, k=k: f"{name} at k = {k}: {m}"
            )


@pytest.mark.parametrize("solver_name", ["elf", "langflow"])
def test_reference_is_not_trivially_satisfied(solver_name):
    """The compared cases exercise the method: the corrections are nonzero, the transform acts, and the options matter."""
    model, statistics, seed = ToyDenoiser(), make_statistics(solver_name), 123
    default = reference_algorithm(solver_name, model, statistics, seed, COEFFICIENTS)
    official = reference_algorithm(solver_name, model, statistics, seed, {**COEFFICIENTS, "eta_r": 0.0, "eta_t": 0.0})
    updates = STEPS if solver_name == "elf" else STEPS - 1
    for k in range(1, updates):
        # A_k ≠ 0 on active steps (σ_0 = 0 only), and m̃_k ≠ m_k from k = 1 on (â_k > 0).
        assert not torch.allclose(default[k]["solver_input"], default[k]["prediction"])
        assert not torch.allclose(default[k]["self_conditioning"], default[k - 1]["prediction"])
    # Step 0 has no history and F_0 = I: it is the official step.
    torch.testing.assert_close(default[0]["next_sample"], official[0]["next_sample"], rtol=0, atol=0)
    variants = [
        {"routing": "self_conditioning"},
        {"routing": "both"},
        {"global_scaling": False},
        {"mask": make_mask()},
        {"online": True},
    ]
    for variant in variants:
        other = reference_algorithm(solver_name, model, statistics, seed, COEFFICIENTS, **variant)
        assert not torch.allclose(other[-1]["prediction"], default[-1]["prediction"]), variant
