"""ACE (Zhang et al., arXiv 2607.00588) and HiGS + ACE: steering the self-conditioning input away from repetition."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .baseline_functions import remove_repetition_direction
from .comparison_mixin import (
    ComparisonSamplerMixin,
    ELFComparisonMixin,
    LangFlowComparisonMixin,
    check_routing,
    route,
)
from .compatibility import CompatibleSchedulerMixin
from .scheduling_elf import NOISE_SCALE, P_MEAN, P_STD, T_EPS
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
    HiGSMixin,
)
from .scheduling_langflow import QUANTILE_EPS


ACE_SCALE = 2.0  # λ of the official code and scripts
ACE_ROUTING = "self_conditioning"  # the official code steers the self-conditioning input only


class ACEMixin:
    r"""
    ACE (docs/algorithm.md §9.4): the pathways `ace_routing` names (by default the next self-conditioning input
    only, as the source) are moved against the model's repetition direction d, x ← x − λ·d at every position. In
    HiGS + ACE it applies after HiGS, to what HiGS routed there. `ace_strength=0` is the official sampler.

    d is the `direction` of an [`~untied_sc.calibration.ace.ACEStatistics`] (not config: a tensor), given to
    `set_timesteps(..., ace_statistics=...)` (pipelines with an `ace_statistics` component pass it) or set as the
    scheduler's `ace_statistics` attribute; it is kept for later runs.
    """

    def _init_ace(self) -> None:
        check_routing("ace_routing", self.config.ace_routing)
        self.ace_statistics = None  # the ACEStatistics in use, kept across runs

    def _set_ace_statistics(self, ace_statistics) -> None:
        if ace_statistics is not None:
            self.ace_statistics = ace_statistics
        if self.config.ace_strength != 0.0 and self.ace_statistics is None:
            raise ValueError(
                f"ACE with ace_strength={self.config.ace_strength} needs the model's repetition direction: pass "
                "`ace_statistics=` to `set_timesteps` (pipelines pass their `ace_statistics` component) or set "
                "`scheduler.ace_statistics`; estimate it with `untied-sc ace PIPELINE_DIR` (or "
                "`untied_sc.calibration.ace.estimate_ace_direction`)."
            )
        if self.ace_statistics is not None:
            self._check_ace_statistics(self.ace_statistics)

    def _check_ace_statistics(self, ace_statistics) -> None:
        if ace_statistics.config.solver != self.family:
            raise ValueError(
                f"The ACE direction is for the {ace_statistics.config.solver!r} family, this scheduler samples "
                f"{self.family!r}: it belongs to another model."
            )

    def _ace_pathways(self, k, prediction, solver_input, self_conditioning):
        scale = self.config.ace_strength
        if scale == 0.0:
            return solver_input, self_conditioning
        direction = self.ace_statistics.direction
        return route(
            self.config.ace_routing,
            solver_input,
            self_conditioning,
            lambda x: remove_repetition_direction(x, direction, scale),
        )


class _ACEELFTimesteps:
    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        ace_statistics=None,
    ) -> None:
        """
        Draws the official ELF grid, takes the ACE direction and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the sampling generator (see [`ELFScheduler.set_timesteps`]).
            ace_statistics ([`ACEStatistics`], *optional*): the repetition direction; the one held is kept when
                `None`. Required (given now or before) unless `ace_strength` is 0.
        """
        self._set_ace_statistics(ace_statistics)
        self._set_timesteps(num_inference_steps, device, generator=generator)


class _ACELangFlowTimesteps:
    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        proposal: tuple[float, float, float] | None = None,
        ace_statistics=None,
    ) -> None:
        """
        Builds the official LangFlow γ grid, takes the ACE direction and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            proposal (`tuple`): the model's (loc, scale, cutoff) (see [`LangFlowScheduler.set_timesteps`]).
            ace_statistics ([`ACEStatistics`], *optional*): the repetition direction; the one held is kept when
                `None`. Required (given now or before) unless `ace_strength` is 0.
        """
        self._set_ace_statistics(ace_statistics)
        self._set_timesteps(num_inference_steps, device, proposal=proposal)


class ACEELFScheduler(
    ACEMixin,
    _ACEELFTimesteps,
    ELFComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    ACE ([`ACEMixin`]) on the official ELF sampler ([`ELFScheduler`], used unchanged as `self.base`: with
    `ace_strength=0` it is the official sampler bit for bit).

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        ace_strength (`float`, defaults to 2.0): λ, how far each routed input moves against d; 0 switches ACE off.
        ace_routing (`str`, defaults to `"self_conditioning"`): which inputs move: `"self_conditioning"`,
            `"solver"` or `"both"`.
    """

    methods = ("ace",)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = None,
        t_eps: float = T_EPS,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()


class ACELangFlowScheduler(
    ACEMixin,
    _ACELangFlowTimesteps,
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    ACE ([`ACEMixin`]) on the official LangFlow sampler ([`LangFlowScheduler`], used unchanged as `self.base`:
    with `ace_strength=0` it is the official sampler bit for bit).

    Args:
        quantile_eps: [`LangFlowScheduler`]'s config.
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    methods = ("ace",)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        ace_strength: float = ACE_SCALE,
        ace_routing: str = ACE_ROUTING,
    ):
        self._init_comparison()


class HiGSACEELFScheduler(
    HiGSMixin,
    ACEMixin,
    _ACEELFTimesteps,
    ELFComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    HiGS then ACE ([`HiGSMixin`], [`ACEMixin`]) on the official ELF sampler: HiGS's guided prediction goes where
    `higs_routing` says, then ACE moves the inputs `ace_routing` names against d. With `higs_weight=0` and
    `ace_strength=0` it is the official sampler bit for bit.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        higs_weight, higs_alpha, higs_eta, higs_t_min, higs_t_max, higs_filter, higs_cutoff, higs_sharpness,
        higs_routing: as for [`HiGSELFScheduler`].
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    methods = ("higs", "ace")

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = None,
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
    HiGSMixin,
    ACEMixin,
    _ACELangFlowTimesteps,
    LangFlowComparisonMixin,
    ComparisonSamplerMixin,
    CompatibleSchedulerMixin,
    SchedulerMixin,
    ConfigMixin,
):
    r"""
    HiGS then ACE ([`HiGSMixin`], [`ACEMixin`]) on the official LangFlow sampler; with `higs_weight=0` and
    `ace_strength=0` it is the official sampler bit for bit.

    Args:
        quantile_eps: [`LangFlowScheduler`]'s config.
        higs_weight, higs_alpha, higs_eta, higs_t_min, higs_t_max, higs_filter, higs_cutoff, higs_sharpness,
        higs_routing: as for [`HiGSELFScheduler`].
        ace_strength, ace_routing: as for [`ACEELFScheduler`].
    """

    methods = ("higs", "ace")

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
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
