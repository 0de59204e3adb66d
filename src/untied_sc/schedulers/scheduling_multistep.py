"""A second-order multistep solver: DPM-Solver++(2M) (Lu et al., 2022) on the official solvers' grids and steps."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .baseline_functions import multistep_coefficient, multistep_prediction
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


MULTISTEP_STRENGTH = 1.0  # 1: DPM-Solver++(2M); 0: the official first-order step
MULTISTEP_ROUTING = "solver"  # a solver: the network's self-conditioning input stays the raw prediction


class MultistepMethod(ComparisonMethod):
    r"""
    DPM-Solver++(2M) on the family's first-order step (docs/algorithm.md §9.5). Both families' steps are DDIM, i.e.
    DPM-Solver++(1) in the data prediction, so the 2M update is that same step given

        D_k = p_k + strength·(h_k/(2h_{k−1}))·(p_k − p_{k−1}),   h_k = λ(target_k) − λ(eval_k),
                                                                  h_{k−1} = λ(eval_k) − λ(eval_{k−1}),

    with λ the log-SNR of the family and eval_k the time step k's network saw (ELF: s_k after re-noising). Steps with
    no usable backward difference are first order ([`multistep_coefficient`]). `strength=0` is the official sampler.

    Args:
        strength (`float`): the weight of the second-order term, ≥ 0 (config `multistep_strength`).
        routing (`str`): `"solver"`, `"self_conditioning"` or `"both"` (config `multistep_routing`).
    """

    def __init__(self, strength: float = MULTISTEP_STRENGTH, routing: str = MULTISTEP_ROUTING):
        if strength < 0:
            raise ValueError(f"multistep_strength must be ≥ 0 (1: DPM-Solver++(2M)), got {strength}.")
        check_routing("multistep_routing", routing)
        self.strength, self.routing = strength, routing
        self.reset()

    @classmethod
    def from_config(cls, config) -> "MultistepMethod":
        return cls(config.multistep_strength, config.multistep_routing)

    def reset(self) -> None:
        self.previous_prediction: torch.Tensor | None = None  # p_{k−1}
        self.previous_log_snr: float | None = None  # λ(eval_{k−1})

    def pathways(
        self, step: MethodStep, solver_input: torch.Tensor, self_conditioning: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.strength == 0.0:
            return solver_input, self_conditioning
        log_snr, next_log_snr = step.log_snrs()
        coefficient = 0.0
        if self.previous_prediction is not None:
            coefficient = multistep_coefficient(self.previous_log_snr, log_snr, next_log_snr)
        combined = multistep_prediction(step.prediction, self.previous_prediction, coefficient, self.strength)
        self.previous_prediction, self.previous_log_snr = step.prediction, log_snr
        return route(self.routing, solver_input, self_conditioning, lambda _: combined)


class MultistepELFScheduler(
    ELFComparisonMixin, ComparisonSamplerMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin
):
    r"""
    DPM-Solver++(2M) ([`MultistepMethod`]) on the official ELF sampler ([`ELFScheduler`], used unchanged as
    `self.base`, re-noising included: with `multistep_strength=0` it is the official sampler bit for bit). Each SDE
    step is the 2M step from the re-noised time s_k to t_{k+1}, its backward difference taken between the two
    evaluation times s_{k−1} and s_k; the final ODE step (to t = 1) is first order.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        multistep_strength (`float`, defaults to 1.0): the weight of the second-order term (1: DPM-Solver++(2M)).
        multistep_routing (`str`, defaults to `"solver"`): where D_k goes: `"solver"`, `"self_conditioning"` or
            `"both"`.
    """

    method_classes = (MultistepMethod,)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        multistep_strength: float = MULTISTEP_STRENGTH,
        multistep_routing: str = MULTISTEP_ROUTING,
    ):
        self._init_comparison()


class MultistepLangFlowScheduler(
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    DPM-Solver++(2M) ([`MultistepMethod`]) on the official LangFlow sampler ([`LangFlowScheduler`], used unchanged
    as `self.base`: with `multistep_strength=0` it is the official sampler bit for bit), in λ = −γ/2.

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        multistep_strength, multistep_routing: as for [`MultistepELFScheduler`].
    """

    method_classes = (MultistepMethod,)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        multistep_strength: float = MULTISTEP_STRENGTH,
        multistep_routing: str = MULTISTEP_ROUTING,
    ):
        self._init_comparison()
