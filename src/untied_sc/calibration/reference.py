"""The fixed reference recurrence whose corrections define the per-step statistics μ_k, σ_k, δ̄_k.

Paper App. B.4, eqs. (40) and (41); docs/algorithm.md §4.3. The recurrence runs on the untied scheduler with the SC
transform off: its update step puts the reference correction Ũ_k in place of A_k and keeps the scheduler's state
handling.
"""

import math

import torch

from ..schedulers.history_directions import (
    history_direction,
    masked_token_mean,
    solver_history_direction,
    token_cosine_distance,
)
from ..schedulers.scheduling_untied_elf import UntiedELFScheduler
from ..schedulers.scheduling_untied_langflow import UntiedLangFlowScheduler
from ..schedulers.untied_step import UntiedState


# λ_k^ref = REFERENCE_GAIN·g_T^(0)·s_k^ref, with s_k^ref active for r_k ∈ (0.40, 0.95] (paper constants).
REFERENCE_GAIN = 3.5
ACTIVATION_START, ACTIVATION_END = 0.40, 0.95


def reference_activation(step: int, num_update_steps: int) -> float:
    """
    s_k^ref = 1[0.40 < r_k ≤ 0.95]·sqrt((r_k − 0.40)/0.55), with progress r_k = (k + 1)/K_u ([choice],
    docs/algorithm.md §4.3).
    """
    progress = (step + 1) / num_update_steps
    if not ACTIVATION_START < progress <= ACTIVATION_END:
        return 0.0
    return math.sqrt((progress - ACTIVATION_START) / (ACTIVATION_END - ACTIVATION_START))


class MomentAccumulator:
    """
    Running sums for eq. (41), per update step, in float64 (no trajectory is stored):
    Σ_ξ M_I(Ũ_k^ξ), Σ_ξ mean_n δ̃_{k,n}^ξ and the count of trajectories with an active position (bank B_μ);
    Σ_ξ ‖C_I Ũ_k^ξ‖²_F and Σ_ξ |I|·D (bank B_σ). Both banks use the same accumulator type.
    """

    def __init__(self, num_update_steps: int, dim: int):
        self.mean_sum = torch.zeros(num_update_steps, dim, dtype=torch.float64)
        self.distance_sum = torch.zeros(num_update_steps, dtype=torch.float64)
        self.trajectories = torch.zeros(num_update_steps, dtype=torch.float64)
        self.centred_square_sum = torch.zeros(num_update_steps, dtype=torch.float64)
        self.centred_count = torch.zeros(num_update_steps, dtype=torch.float64)

    def add(self, step: int, correction: torch.Tensor, distance: torch.Tensor, mask: torch.Tensor | None) -> None:
        """Adds one batch of reference corrections Ũ_k (B, L, D) and per-token distances δ̃_k (B, L)."""
        correction = correction.double()
        active = torch.ones(correction.shape[:2], dtype=torch.bool, device=correction.device) if mask is None else mask
        counts = active.sum(dim=1).double()
        present = counts > 0  # a trajectory with no active position is skipped for this step (docs/algorithm.md §4.3)
        token_mean = masked_token_mean(correction, active)
        centred = (correction - token_mean[:, None]) * active[..., None]
        self.mean_sum[step] += token_mean[present].sum(dim=0).cpu()
        self.distance_sum[step] += (distance.double().sum(dim=1)[present] / counts[present]).sum().cpu()
        self.trajectories[step] += present.sum().cpu()
        self.centred_square_sum[step] += centred.pow(2).sum().cpu()
        self.centred_count[step] += (counts.sum() * correction.shape[-1]).cpu()

    SUMS = ("mean_sum", "distance_sum", "trajectories", "centred_square_sum", "centred_count")

    def sums(self) -> dict[str, torch.Tensor]:
        """The running sums by name: every statistic is a ratio of two, so sums from several processes add."""
        return {name: getattr(self, name) for name in self.SUMS}

    def load_sums(self, sums: dict[str, torch.Tensor]) -> None:
        """Replaces the running sums (e.g. by their totals over processes, `sum_across_processes`)."""
        for name in self.SUMS:
            current = getattr(self, name)
            if sums[name].shape != current.shape:
                raise ValueError(f"Sum {name!r} has shape {tuple(sums[name].shape)}, expected {tuple(current.shape)}.")
            setattr(self, name, sums[name].to(device=current.device, dtype=torch.float64))

    def mean(self) -> torch.Tensor:
        """μ_k (K_u, D): the mean over trajectories of each trajectory's token mean; 0 where nothing was recorded."""
        return self.mean_sum / self.trajectories.clamp(min=1)[:, None]

    def cosine_distance(self) -> torch.Tensor:
        """δ̄_k (K_u,)."""
        return self.distance_sum / self.trajectories.clamp(min=1)

    def rms(self) -> torch.Tensor:
        """σ_k (K_u,) = sqrt(Σ‖C Ũ‖² / Σ|I|·D)."""
        return (self.centred_square_sum / self.centred_count.clamp(min=1)).sqrt()


class ReferenceRecurrenceMixin:
    r"""
    The reference recurrence (paper eq. (40)) on a family's untied scheduler: no SC transform; at update step k

        H̃_k = λ_k^ref (p_k − E_k),   G̃_k = ‖H̃_k‖ (p_k − O_k)/‖p_k − O_k‖,
        δ̃_{k,n} = min(1, 1 − cos(H̃_{k,n}, G̃_{k,n})),   Ũ_k = H̃_k + Δu_k δ̃_k ⊙ (H̃_k − G̃_k),

    the solver gets p_k + Ũ_k, the next self-conditioning input is the raw p_k, and E uses the configuration's α.
    Every Ũ_k and δ̃_k is added to `accumulator` as it is computed.

    Args:
        base_correction_scale (`float`): g_T^(0).
        accumulator ([`MomentAccumulator`]): where the moments go (replace it between banks).
        config: the family's untied scheduler config and `alpha` (η_R = η_T = 0 internally).
    """

    def __init__(self, base_correction_scale: float, accumulator: MomentAccumulator | None = None, **config):
        super().__init__(**{**config, "eta_r": 0.0, "eta_t": 0.0, "eta_o": 0.0, "coefficients": None})
        self.base_correction_scale = base_correction_scale
        self.accumulator = accumulator

    def update_step(
        self, k: int, prediction: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Update step k of eq. (40): the solver and O get q_k = p_k + Ũ_k, m_{k+1} = p_k (no transform), E with α.
        """
        if k >= self.solver.num_update_steps:
            return super().update_step(k, prediction, timestep, sample)
        if self.ema is None:
            self.ema = torch.zeros_like(prediction)
            self.solver_average = torch.zeros_like(prediction)
        correction = self._reference_correction(k, prediction)
        solver_input = prediction if correction is None else prediction + correction
        prev_sample = self.base_step(solver_input, prediction, timestep, sample)
        kappa, alpha = self.solver.kappa(k), self.coefficients.alpha
        state = UntiedState(
            ema=(1 - alpha) * self.ema + alpha * prediction,
            solver_average=(1 - kappa) * self.solver_average + kappa * solver_input,
        )
        self.advance(k, prediction, prediction, state, None)
        return solver_input, prev_sample

    def _reference_correction(self, k: int, prediction: torch.Tensor) -> torch.Tensor | None:
        """Ũ_k of update step k (`None` on an inactive step), added to the accumulator."""
        num_updates = self.solver.num_update_steps
        gain = REFERENCE_GAIN * self.base_correction_scale * reference_activation(k, num_updates)
        if gain == 0:
            return None  # inactive step: μ = σ = δ̄ = 0 exactly
        history = gain * history_direction(prediction, self.ema)
        solver_direction = solver_history_direction(
            prediction, history, self.solver_average, self.mask, self.config.degeneracy_eps
        )
        distance = token_cosine_distance(history, solver_direction, self.mask)
        correction = history + self.solver.delta_u(k) * distance[..., None] * (history - solver_direction)
        if self.mask is not None:
            correction = correction * self.mask[..., None]
        self.accumulator.add(k, correction, distance, self.mask)
        return correction


class ReferenceRecurrenceELFScheduler(ReferenceRecurrenceMixin, UntiedELFScheduler):
    """The reference recurrence on the official ELF sampler."""


class ReferenceRecurrenceLangFlowScheduler(ReferenceRecurrenceMixin, UntiedLangFlowScheduler):
    """The reference recurrence on the official LangFlow sampler."""


def reference_recurrence(
    family: str, base_correction_scale: float, accumulator: MomentAccumulator | None = None, **config
) -> ReferenceRecurrenceMixin:
    """The reference recurrence on `family`'s ("elf" / "langflow") official sampler, with that family's config."""
    classes = {"elf": ReferenceRecurrenceELFScheduler, "langflow": ReferenceRecurrenceLangFlowScheduler}
    if family not in classes:
        raise ValueError(f"family must be 'elf' or 'langflow', got {family!r}.")
    return classes[family](base_correction_scale, accumulator, **config)
