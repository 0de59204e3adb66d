"""ACE (Zhang et al., arXiv 2607.00588) and HiGS + ACE: steering the self-conditioning input away from repetition."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .baseline_functions import remove_repetition_direction
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
from .run_context import RunContext, run_context
from .scheduling_elf import DEFAULT_SDE_GAMMA, NOISE_SCALE, P_MEAN, P_STD, T_EPS
from .scheduling_higs import (
    HIGS_ALPHA,
    HIGS_CUTOFF,
    HIGS_ETA,
    HIGS_FILTER,
    HIGS_ROUTING,
    HIGS_SHARPNESS,
    HIGS_T_MAX,
    HIGS_T_MIN,
    HIGS_WEIGHT,
    HiGSMethod,
)
from .scheduling_langflow import QUANTILE_EPS


ACE_SCALE = 2.0  # λ of the official code and scripts
ACE_ROUTING = "self_conditioning"  # the official code steers the self-conditioning input only


class ACEMethod(ComparisonMethod):
    r"""
    ACE (docs/algorithm.md §9.4): the pathways `routing` names (by default the next self-conditioning input only, as
    the source) are moved against the model's repetition direction d, x ← x − λ·d at every position. In HiGS + ACE
    it applies after HiGS, to what HiGS routed there. `strength=0` is the official sampler.

    d is the `direction` of an [`~untied_sc.calibration.ace.ACEStatistics`] (not config: a tensor), held in
    `statistics` and kept for later runs (the scheduler's `ace_statistics`).

    Args:
        strength (`float`): λ (config `ace_strength`); 0 switches ACE off.
        routing (`str`): `"self_conditioning"`, `"solver"` or `"both"` (config `ace_routing`).
    """

    def __init__(self, strength: float = ACE_SCALE, routing: str = ACE_ROUTING):
        check_routing("ace_routing", routing)
        self.strength, self.routing = strength, routing
        self.statistics = None  # the ACEStatistics in use, kept across runs

    @classmethod
    def from_config(cls, config) -> "ACEMethod":
        return cls(config.ace_strength, config.ace_routing)

    def use(self, statistics, family: str) -> None:
        """Takes `statistics` (`None` keeps the held ones) for a run of `family`; refuses missing or foreign ones."""
        if statistics is not None:
            self.statistics = statistics
        if self.strength != 0.0 and self.statistics is None:
            raise ValueError(
                f"ACE with ace_strength={self.strength} needs the model's repetition direction: pass "
                "`ace_statistics=` to `set_timesteps` (pipelines pass their `ace_statistics` component) or set "
                "`scheduler.ace_statistics`; estimate it with `untied-sc ace PIPELINE_DIR` (or "
                "`untied_sc.calibration.ace.estimate_ace_direction`)."
            )
        if self.statistics is not None and self.statistics.config.solver != family:
            raise ValueError(
                f"The ACE direction is for the {self.statistics.config.solver!r} family, this scheduler samples "
                f"{family!r}: it belongs to another model."
            )

    def pathways(
        self, step: MethodStep, solver_input: torch.Tensor, self_conditioning: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.strength == 0.0:
            return solver_input, self_conditioning
        direction, scale = self.statistics.direction, self.strength
        return route(
            self.routing, solver_input, self_conditioning, lambda x: remove_repetition_direction(x, direction, scale)
        )


class ACEStatisticsMixin:
    """`ace_statistics`, the repetition direction of a scheduler whose methods include an [`ACEMethod`]."""

    @property
    def _ace(self) -> ACEMethod:
        return next(method for method in self.methods if isinstance(method, ACEMethod))

    @property
    def ace_statistics(self):
        """The [`ACEStatistics`] in use (`set_timesteps(..., ace_statistics=)` or set here), kept across runs."""
        return self._ace.statistics

    @ace_statistics.setter
    def ace_statistics(self, statistics) -> None:
        self._ace.statistics = statistics


class _ACEELFTimesteps(ACEStatisticsMixin):
    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        ace_statistics=None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Draws the official ELF grid, takes the ACE direction and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the sampling generator (see [`ELFScheduler.set_timesteps`]).
            ace_statistics ([`ACEStatistics`], *optional*): the repetition direction; the one held is kept when
                `None`. Required (given now or before) unless `ace_strength` is 0.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(context, generator=generator, ace_statistics=ace_statistics)
        self._ace.use(run.checked_ace_statistics(), self.family)
        self._set_timesteps(
            num_inference_steps,
            device,
            context=RunContext(generator=run.generator, grid_generator=run.grid_generator, random=run.random),
        )


class _ACELangFlowTimesteps(ACEStatisticsMixin):
    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        proposal: tuple[float, float, float] | None = None,
        ace_statistics=None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Builds the official LangFlow γ grid, takes the ACE direction and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            proposal (`tuple`, *optional*): the model's (loc, scale, cutoff); `None` uses the config's `proposal`
                (see [`LangFlowScheduler.set_timesteps`]).
            ace_statistics ([`ACEStatistics`], *optional*): the repetition direction; the one held is kept when
                `None`. Required (given now or before) unless `ace_strength` is 0.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(context, proposal=proposal, ace_statistics=ace_statistics)
        self._ace.use(run.checked_ace_statistics(), self.family)
        self._set_timesteps(num_inference_steps, device, proposal=run.proposal)


class ACEELFScheduler(
    _ACEELFTimesteps,
    ELFComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    ACE ([`ACEMethod`]) on the official ELF sampler ([`ELFScheduler`], used unchanged as `self.base`: with
    `ace_strength=0` it is the official sampler bit for bit).

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        ace_strength (`float`, defaults to 2.0): λ, how far each routed input moves against d; 0 switches ACE off.
        ace_routing (`str`, defaults to `"self_conditioning"`): which inputs move: `"self_conditioning"`,
            `"solver"` or `"both"`.
    """

    method_classes = (ACEMethod,)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()


class ACELangFlowScheduler(
    _ACELangFlowTimesteps,
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    ACE ([`ACEMethod`]) on the official LangFlow sampler ([`LangFlowScheduler`], used unchanged as `self.base`:
    with `ace_strength=0` it is the official sampler bit for bit).

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    method_classes = (ACEMethod,)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()


class HiGSACEELFScheduler(
    _ACEELFTimesteps,
    ELFComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    HiGS then ACE ([`HiGSMethod`], [`ACEMethod`]) on the official ELF sampler: HiGS's guided prediction goes where
    `higs_routing` says, then ACE moves the inputs `ace_routing` names against d. With `higs_weight=0` and
    `ace_strength=0` it is the official sampler bit for bit.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        higs_weight, higs_alpha, higs_eta, higs_t_min, higs_t_max, higs_filter, higs_cutoff, higs_sharpness,
        higs_routing: as for [`HiGSELFScheduler`].
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    method_classes = (HiGSMethod, ACEMethod)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        higs_weight: float = HIGS_WEIGHT,
        higs_alpha: float = HIGS_ALPHA,
        higs_eta: float = HIGS_ETA,
        higs_t_min: float = HIGS_T_MIN,
        higs_t_max: float = HIGS_T_MAX,
        higs_filter: str = HIGS_FILTER,
        higs_cutoff: float = HIGS_CUTOFF,
        higs_sharpness: float = HIGS_SHARPNESS,
        higs_routing: str = HIGS_ROUTING,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()


class HiGSACELangFlowScheduler(
    _ACELangFlowTimesteps,
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    HiGS then ACE ([`HiGSMethod`], [`ACEMethod`]) on the official LangFlow sampler; with `higs_weight=0` and
    `ace_strength=0` it is the official sampler bit for bit.

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        higs_weight, higs_alpha, higs_eta, higs_t_min, higs_t_max, higs_filter, higs_cutoff, higs_sharpness,
        higs_routing: as for [`HiGSELFScheduler`].
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    method_classes = (HiGSMethod, ACEMethod)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        higs_weight: float = HIGS_WEIGHT,
        higs_alpha: float = HIGS_ALPHA,
        higs_eta: float = HIGS_ETA,
        higs_t_min: float = HIGS_T_MIN,
        higs_t_max: float = HIGS_T_MAX,
        higs_filter: str = HIGS_FILTER,
        higs_cutoff: float = HIGS_CUTOFF,
        higs_sharpness: float = HIGS_SHARPNESS,
        higs_routing: str = HIGS_ROUTING,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()
