"""The base solvers of ELF and LangFlow, written once and shared by every scheduler.

A base solver is fixed by its grid. For each *update step* k = 0..K_u−1 it exposes (docs/algorithm.md §2.3):

- `eval_time(k)`: the time the network sees (ELF: s_k after re-noising; LangFlow: γ_k);
- `kappa(k)`: κ_k, the update share of the prediction inside the normalised prediction average;
- `delta_u(k)`: Δu_k ∈ [0, 1], the normalised step width;
- `update(k, z, q)`: S_k(z, q), the solver update, affine in the prediction q. `z` is the network input of step k.

ELF also re-noises before each network call (`renoise`). The arithmetic of `renoise` and `update` follows the official
code operation for operation (Python-float scalars, float32 tensors for ELF; float64 for LangFlow), so that the
official samplers are reproduced bit for bit.
"""

import math

import torch


class ELFSolver:
    r"""
    ELF's sampler on a grid 0 = t_0 < … < t_N = 1 (docs/algorithm.md §2.1): N−1 SDE steps with churn, then one ODE
    step.

    SDE step k: a_k = clip(1 − γ_sde·(t_{k+1} − t_k), 0, 1), s_k = a_k·t_k, z_b = a_k·z_k + (1 − a_k)·ε_k
    (ε_k ~ noise_scale·N(0, I)), then z_{k+1} = z_b + (t_{k+1} − s_k)·(q − z_b)/max(1 − s_k, t_eps).
    ODE step (k = N−1): the same update with a = 1 and no noise. So K_u = N update steps.

    Args:
        grid (`list[float]`): t_0..t_N as Python floats (the official code reads them with `.item()`).
        sde_gamma (`float`): churn strength γ_sde.
        noise_scale (`float`): std of the re-noising noise (2.0, the interpolant's noise scale).
        t_eps (`float`): the velocity clamp, max(1 − s, t_eps).
    """

    def __init__(self, grid: list[float], sde_gamma: float, noise_scale: float, t_eps: float = 0.05):
        self.grid, self.sde_gamma, self.noise_scale, self.t_eps = grid, sde_gamma, noise_scale, t_eps
        self.num_update_steps = len(grid) - 1
        self.alphas, self.eval_times = [], []
        for k in range(self.num_update_steps):
            t, t_next = grid[k], grid[k + 1]
            alpha = max(0.0, min(1.0, 1.0 - sde_gamma * float(t_next - t))) if self.renoises(k) else 1.0
            self.alphas.append(alpha)
            self.eval_times.append(alpha * t if self.renoises(k) else t)

    def renoises(self, k: int) -> bool:
        """Every step but the last (ODE) one re-noises, and draws its noise even when a_k is 0 or 1."""
        return k < self.num_update_steps - 1

    def eval_time(self, k: int) -> float:
        return self.eval_times[k]

    def renoise(self, k: int, z: torch.Tensor, unit_noise: torch.Tensor) -> torch.Tensor:
        """z_b = a_k·z + (1 − a_k)·noise_scale·ε, with ε ~ N(0, I) given."""
        alpha = self.alphas[k]
        return alpha * z + (1.0 - alpha) * (unit_noise * self.noise_scale)

    def update(self, k: int, z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """S_k(z_b, q) = z_b + (t_{k+1} − s_k)·(q − z_b)/max(1 − s_k, t_eps)."""
        s, t_next = self.eval_times[k], self.grid[k + 1]
        # The official code clamps a float32 (B, 1, 1) tensor of s; do the same so the division rounds alike.
        s_batch = torch.full((z.shape[0], 1, 1), s, dtype=z.dtype, device=z.device)
        velocity = (q - z) / torch.clamp(1.0 - s_batch, min=self.t_eps)
        return z + (t_next - s) * velocity

    def guided_update(
        self, k: int, z: torch.Tensor, conditional: torch.Tensor, unconditional: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """
        S_k with classifier-free guidance as the official code combines it: in velocities, v = v_u + w·(v_c − v_u)
        with v_c, v_u the velocities (x̂ − z_b)/max(1 − s_k, t_eps) of the conditional and unconditional
        predictions (official `utils/sampling_utils.py` `_forward_sample`), then z_b + (t_{k+1} − s_k)·v. Equal to
        `update` on the combined x̂ in exact arithmetic, not in float32: the official rounding is this one.
        """
        s, t_next = self.eval_times[k], self.grid[k + 1]
        s_batch = torch.full((z.shape[0], 1, 1), s, dtype=z.dtype, device=z.device)
        denominator = torch.clamp(1.0 - s_batch, min=self.t_eps)
        v_cond, v_uncond = (conditional - z) / denominator, (unconditional - z) / denominator
        return z + (t_next - s) * (v_uncond + scale * (v_cond - v_uncond))

    def beta(self, k: int) -> float:
        """β_k = (t_{k+1} − s_k)/max(1 − s_k, t_eps): the weight of q in S_k."""
        s = self.eval_times[k]
        return (self.grid[k + 1] - s) / max(1.0 - s, self.t_eps)

    def kappa(self, k: int) -> float:
        """κ_k = β_k/t_{k+1} (eq. (18), docs/algorithm.md §2.3); the clamp makes the final β = 1 when s ≤ 1 − t_eps."""
        return self.beta(k) / self.grid[k + 1]

    def delta_u(self, k: int) -> float:
        """Δu_k = c̃(t_{k+1}) − c̃(t_k), c(t) = −log(1 − t) linearly continued above 1 − t_eps, c̃ = c/c(1)."""
        return self._normalised_log_time(self.grid[k + 1]) - self._normalised_log_time(self.grid[k])

    def _normalised_log_time(self, t: float) -> float:
        eps = self.t_eps

        def c(x: float) -> float:
            return -math.log(1.0 - x) if x <= 1.0 - eps else -math.log(eps) + (x - (1.0 - eps)) / eps

        return c(t) / c(1.0)


class LangFlowSolver:
    r"""
    LangFlow's DDIM sampler on a γ grid γ_0 > … > γ_{N−1} (docs/algorithm.md §2.2): N−1 updates, then one final
    evaluation.

    With O = z/α and r_k = exp((γ_{k+1} − γ_k)/2): O_{k+1} = r_k·O_k + (1 − r_k)·q, computed in float64 as
    z_{k+1} = lerp(α_{k+1}·q, z·α_{k+1}/α_k, r_k). So K_u = N − 1 update steps.

    Args:
        gammas (`torch.Tensor` of shape `(N,)`): the γ grid (float32, as the official proposal returns it).
        gamma_min (`float`), gamma_max (`float`): the proposal's clamp range, which normalises Δu.
    """

    def __init__(self, gammas: torch.Tensor, gamma_min: float, gamma_max: float):
        self.gammas, self.gamma_min, self.gamma_max = gammas, gamma_min, gamma_max
        self.num_update_steps = len(gammas) - 1

    def eval_time(self, k: int) -> float:
        return self.gammas[k].item()

    def update(self, k: int, z: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        """S_k(z, q): the float64 DDIM step from γ_k to γ_{k+1}."""
        t, s = self.gammas[k].double(), self.gammas[k + 1].double()
        current = z.double() * ((torch.nn.functional.softplus(t) - torch.nn.functional.softplus(s)) / 2).exp()
        end = torch.sigmoid(-s).sqrt() * q.double()
        return end.lerp(current, ((s - t) / 2).exp()).to(z.dtype)

    def kappa(self, k: int) -> float:
        """κ_k = 1 − exp((γ_{k+1} − γ_k)/2)."""
        return 1.0 - math.exp((self.gammas[k + 1].item() - self.gammas[k].item()) / 2)

    def delta_u(self, k: int) -> float:
        """Δu_k = (γ_k − γ_{k+1})/(γ_max − γ_min)."""
        return (self.gammas[k].item() - self.gammas[k + 1].item()) / (self.gamma_max - self.gamma_min)
