"""Momentum (Wizadwongsa et al., ICLR 2024): heavy-ball momentum on the data prediction, on the official solvers."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .baseline_functions import heavy_ball_velocity
from .comparison_mixin import (
    ComparisonMethod,
    ComparisonSamplerMixin,
    ELFComparisonMixin,
    LangFlowComparisonMixin,
    MethodStep,
    check_routing,
    route,
)
from .compatibility import CompatibleSchedulerMixin
from .scheduling_elf import DEFAULT_SDE_GAMMA, NOISE_SCALE, P_MEAN, P_STD, T_EPS
from .scheduling_langflow import QUANTILE_EPS


MOMENTUM_BETA = 0.9  # the milder of the source's swept values (0.9, 0.8); 1 is no momentum
MOMENTUM_ROUTING = "solver"  # the source changes the solver's update only (docs/algorithm.md §9.2)


class MomentumMethod(ComparisonMethod):
    r"""
    Heavy-ball momentum on the prediction (docs/algorithm.md §9.2): v_0 = p_0, v_k = (1 − β)·v_{k−1} + β·p_k, and
    v_k replaces p_k on the pathways `routing` names. Each family's step is DPM-Solver++(1), so this is the source's
    heavy ball on DPM-Solver++'s data-prediction combination at first order. β = 1 is the official sampler.

    Args:
        beta (`float`): β ∈ (0, 1], the weight of the new prediction (config `momentum_beta`).
        routing (`str`): `"solver"`, `"self_conditioning"` or `"both"` (config `momentum_routing`).
    """

    def __init__(self, beta: float = MOMENTUM_BETA, routing: str = MOMENTUM_ROUTING):
        if not 0.0 < beta <= 1.0:
            raise ValueError(f"momentum_beta (β) must lie in (0, 1] (1: no momentum), got {beta}.")
        check_routing("momentum_routing", routing)
        self.beta, self.routing = beta, routing
        self.reset()

    @classmethod
    def from_config(cls, config) -> "MomentumMethod":
        return cls(config.momentum_beta, config.momentum_routing)

    def reset(self) -> None:
        self.velocity: torch.Tensor | None = None  # v_{k−1}

    def pathways(
        self, step: MethodStep, solver_input: torch.Tensor, self_conditioning: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.beta == 1.0:
            return solver_input, self_conditioning
        self.velocity = velocity = heavy_ball_velocity(self.velocity, step.prediction, self.beta)
        return route(self.routing, solver_input, self_conditioning, lambda _: velocity)


class MomentumELFScheduler(
    ELFComparisonMixin, ComparisonSamplerMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin
):
    r"""
    Momentum ([`MomentumMethod`]) on the official ELF sampler ([`ELFScheduler`], used unchanged as `self.base`:
    with `momentum_beta=1.0` it is the official sampler bit for bit). Swap it in with
    `MomentumELFScheduler.from_config(pipe.scheduler.config, momentum_beta=0.8)`.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        momentum_beta (`float`, defaults to 0.9): β ∈ (0, 1], the weight of the new prediction; 1 is no momentum.
        momentum_routing (`str`, defaults to `"solver"`): where v_k goes: `"solver"`, `"self_conditioning"` or
            `"both"`.
    """

    method_classes = (MomentumMethod,)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        momentum_beta: float = MOMENTUM_BETA,
        momentum_routing: str = MOMENTUM_ROUTING,
    ):
        self._init_comparison()


class MomentumLangFlowScheduler(
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    Momentum ([`MomentumMethod`]) on the official LangFlow sampler ([`LangFlowScheduler`], used unchanged as
    `self.base`: with `momentum_beta=1.0` it is the official sampler bit for bit).

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        momentum_beta, momentum_routing: as for [`MomentumELFScheduler`].
    """

    method_classes = (MomentumMethod,)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        momentum_beta: float = MOMENTUM_BETA,
        momentum_routing: str = MOMENTUM_ROUTING,
    ):
        self._init_comparison()
