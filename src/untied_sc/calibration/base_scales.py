"""Base scales λ_R^(0) (SC-transform exponent) and g_T^(0) (reference correction scale).

Paper App. C.4, eq. (44); docs/algorithm.md §4.2. LangFlow's full-rank geometry gives 1 and 1.
For ELF both come from the 2×2 Gram matrix G of two first-order responses of the frozen model, measured by finite
differences on official trajectories:

- r_1: the change of the model output per unit perturbation of the self-conditioning input along −K m_k, where
  K = Q diag(ρ²) Qᵀ is the overlap operator (the direction the SC transform acts along);
- r_2: the change of the *next* evaluation's output per unit perturbation of the prediction handed to the solver
  along H_k = p_k − E_k (the direction the solver correction acts along).

Then χ = sqrt(1ᵀG1 / vᵀGv), v = (1 − φ, φ), λ_R^(0) = s_0 χ (1 − φ), g_T^(0) = s_0 χ φ with s_0 = φ = 0.75.

Choices made here ([choice] in docs/algorithm.md §4.2), all arguments of [`elf_response_gram`]:
- perturbation size: each perturbation has Frobenius norm `epsilon`·‖m_k‖ per sample (the same absolute size for
  both, so that G compares the two responses per unit of input change); epsilon = 1e-2;
- steps: every update step k = 1..K_u − 2 of an official trajectory (k ≥ 1 so that m_k ≠ 0; k ≤ K_u − 2 so that a
  next evaluation exists), at `num_inference_steps` = 16;
- the perturbed next evaluation re-noises with the same noise as the unperturbed one, so r_2 measures the response
  to the prediction alone; E_k is the EMA of raw predictions with weight `alpha`;
- G is the mean over samples and steps of the per-sample Frobenius inner products ⟨r_a, r_b⟩.
"""

import math

import torch

from ..schedulers import ELFScheduler
from ..schedulers.noise import draw_normal
from .overlap import OverlapBasis


S0 = 0.75
PHI = 0.75


def base_scales_from_gram(gram: torch.Tensor, s0: float = S0, phi: float = PHI) -> tuple[float, float]:
    """(λ_R^(0), g_T^(0)) from the 2×2 response Gram matrix: χ = sqrt(1ᵀG1 / vᵀGv), v = (1 − φ, φ)."""
    gram = gram.double()
    ones, v = torch.ones(2, dtype=torch.float64), torch.tensor([1 - phi, phi], dtype=torch.float64)
    denominator = (v @ gram @ v).item()
    if not denominator > 0:
        raise ValueError(f"The response Gram matrix is degenerate (vᵀGv = {denominator}); the model does not respond.")
    chi = math.sqrt((ones @ gram @ ones).item() / denominator)
    return s0 * chi * (1 - phi), s0 * chi * phi


def _model_input(solver, noises: list[torch.Tensor], k: int, z: torch.Tensor) -> torch.Tensor:
    """The network input of step k with pre-drawn noise (so perturbed and unperturbed runs re-noise alike)."""
    return solver.renoise(k, z, noises[k]) if solver.renoises(k) else z


def _per_sample_norm(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(1).norm(dim=1)


def elf_response_gram(
    pipe,
    overlap: OverlapBasis,
    generators: list[torch.Generator],
    batch_size: int | list[int],
    num_inference_steps: int = 16,
    epsilon: float = 1e-2,
    alpha: float = 0.8,
    progress=None,
) -> torch.Tensor:
    """
    The mean response Gram matrix over official ELF trajectories, one batch per generator (see module docstring);
    `batch_size`: one size for every batch, or each batch's size.

    Uses the pipeline's own network call and the official scheduler's solver (grid, re-noising, update S_k).
    """
    gram_sum, count = elf_response_gram_sums(
        pipe, overlap, generators, batch_size, num_inference_steps, epsilon, alpha, progress
    )
    return response_gram(gram_sum, count)


def response_gram(gram_sum: torch.Tensor, count: float) -> torch.Tensor:
    """G = Σ⟨r_a, r_b⟩ / count: the mean Gram from its float64 sum (over batches, possibly over processes)."""
    if count == 0:
        raise ValueError("No response was measured: use at least 4 steps so that steps 1..K_u−2 exist.")
    return gram_sum / count


@torch.no_grad()
def elf_response_gram_sums(
    pipe,
    overlap: OverlapBasis,
    generators: list[torch.Generator],
    batch_size: int | list[int],
    num_inference_steps: int = 16,
    epsilon: float = 1e-2,
    alpha: float = 0.8,
    progress=None,
    conditionings: list | None = None,
    guidance_scale: float = 1.0,
) -> tuple[torch.Tensor, int]:
    """
    (Σ over samples and steps of the per-sample 2×2 Grams ⟨r_a, r_b⟩ in float64, number of terms) over the batches
    of `generators`; [`response_gram`] divides. Sums from disjoint sets of batches (several processes) add.
    `batch_size`: one size for every batch, or each batch's size.

    A conditional pipeline's batches hold a source each (`conditionings`, one `SourceConditioning` per batch): the
    trajectories are the official conditional ones (the source held in z, in the self-conditioning input and in the
    prediction; with `guidance_scale` ≠ 1 the guided prediction x̂_u + g·(x̂_c − x̂_u)), and the perturbations' sizes
    and directions are taken over the generated positions only, where the responses then lie.
    """
    model, device = pipe.transformer, pipe._execution_device
    basis = overlap.basis.to(device=device, dtype=torch.float32)
    rho_sq = overlap.rho_sq.to(device=device, dtype=torch.float32)
    scale = pipe.sc_cfg_scale
    gram, count = torch.zeros(2, 2, dtype=torch.float64), 0
    source = None  # the batch's SourceConditioning, or None (unconditional)

    def hold(x):
        return x if source is None else source.hold(x)

    def generated(x):
        return x if source is None else x * (~source.mask)[..., None].to(x.dtype)

    def predict(z, t, m):
        if source is None:
            return model(z, t, m, scale).sample.float()
        previous = torch.zeros_like(z) if m is None else m
        conditional = model(source.hold(z), t, source.hold(previous), scale).sample.float()
        if guidance_scale == 1:
            return source.hold(conditional)
        unconditional = model(source.drop(z), t, source.drop(previous), scale).sample.float()
        return source.hold(unconditional + guidance_scale * (conditional - unconditional))

    sizes = [batch_size] * len(generators) if isinstance(batch_size, int) else list(batch_size)
    if len(sizes) != len(generators):
        raise ValueError(f"Got {len(generators)} generators but {len(sizes)} batch sizes; give one per generator.")
    if conditionings is not None and len(conditionings) != len(generators):
        raise ValueError(f"Got {len(generators)} generators but {len(conditionings)} conditionings; one per batch.")
    for index, (generator, rows) in enumerate(zip(generators, sizes, strict=True)):
        source = None if conditionings is None else conditionings[index]
        scheduler = ELFScheduler.from_config(pipe.scheduler.config)
        scheduler.set_timesteps(num_inference_steps, generator=generator)
        solver = scheduler.solver
        shape = (rows, *pipe.latent_shape)
        # Drawn on the generator's device (a CUDA generator: the device stream), in the official order.
        z = draw_normal(shape, generator, device) * solver.noise_scale
        noises = [draw_normal(shape, generator, device) for _ in range(solver.num_update_steps - 1)]

        m = None
        z = hold(z)
        z_b = _model_input(solver, noises, 0, z)
        p = predict(z_b, solver.eval_time(0), None)
        ema = torch.zeros_like(p)  # E_0 = 0
        for k in range(solver.num_update_steps - 1):
            z_next = hold(solver.update(k, z_b, p))
            z_b_next = _model_input(solver, noises, k + 1, z_next)
            p_next = predict(z_b_next, solver.eval_time(k + 1), p)
            if m is not None:
                size = epsilon * _per_sample_norm(generated(m))[:, None, None]
                overlap_m = generated((m @ basis) * rho_sq @ basis.T)  # K m per (generated) token
                direction_m = -overlap_m / _per_sample_norm(overlap_m).clamp(min=1e-30)[:, None, None]
                r1 = (predict(z_b, solver.eval_time(k), m + size * direction_m) - p) / epsilon
                history = generated(p - ema)
                direction_q = history / _per_sample_norm(history).clamp(min=1e-30)[:, None, None]
                update = hold(solver.update(k, z_b, p + size * direction_q))
                z_perturbed = _model_input(solver, noises, k + 1, update)
                r2 = (predict(z_perturbed, solver.eval_time(k + 1), p) - p_next) / epsilon
                responses = torch.stack([r1.flatten(1), r2.flatten(1)], dim=1).double()  # (B, 2, L·D)
                gram += torch.einsum("bin,bjn->ij", responses, responses).cpu()
                count += responses.shape[0]
            ema = (1 - alpha) * ema + alpha * p  # E_{k+1}
            m, z_b, p = p, z_b_next, p_next
        if progress is not None:
            progress.update()
    return gram, count
