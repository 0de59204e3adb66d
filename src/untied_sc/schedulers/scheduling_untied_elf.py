"""UntiedELFScheduler: untied self-conditioning on the official ELF sampler."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .comparison_names import ELF_COMPARISON_SCHEDULERS
from .compatibility import CompatibleSchedulerMixin
from .run_context import RunContext, run_context
from .sampler_statistics import SamplerStatistics
from .scheduling_elf import DEFAULT_SDE_GAMMA, ELF_CONFIG_RANGES, NOISE_SCALE, P_MEAN, P_STD, T_EPS, ELFScheduler
from .untied_mixin import ABLATION_DEFAULTS, DEGENERACY_EPS, EPS_FP, UNTIED_CONFIG_RANGES, UntiedSelfConditioningMixin


class UntiedELFScheduler(UntiedSelfConditioningMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin):
    r"""
    Untied self-conditioning (paper Algorithm 1, [`UntiedSelfConditioningMixin`]) on the official ELF sampler
    ([`ELFScheduler`], used unchanged as `self.base`: with η_R = η_T = 0 it is the official sampler bit for bit).

    Swap it into an ELF pipeline with `UntiedELFScheduler.from_config(pipe.scheduler.config, coefficients="elf-b")`
    and back with `ELFScheduler.from_config(pipe.scheduler.config)`; the untied keys stay in the official config.

    Coefficients for N steps, first match wins: the explicit `eta_r`/`eta_t`/`eta_o`/`alpha`; the preset named by
    `coefficients` (if it covers N); N's `coefficients_by_steps` entry; the preset's entry at its nearest listed NFE;
    else an error naming these options.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        eta_r (`float`, *optional*): η_R ≥ 0, strength of the SC transform (λ_R = λ_R^(0)·η_R).
        eta_t (`float`, *optional*): η_T ≥ 0, strength of the solver correction.
        eta_o (`float`, *optional*): η_O ≥ 0, weight of the disagreement term in U_k.
        alpha (`float`, *optional*): α ∈ (0, 1], EMA weight of the current prediction in E.
        coefficients (`str`, *optional*): a paper preset (`"elf-b"`, `"elf-m"`, `"elf-l"`, …).
        coefficients_by_steps (`dict[str, dict[str, float]]`, *optional*): per NFE (a string), the four
            coefficients as plain floats (`untied-sc tune` writes them).
        tuning_by_steps (`dict[str, dict]`, *optional*): per NFE, the record of how `untied-sc tune` chose them.
        eps_fp (`float`, defaults to 0.01): floor of b_{k,i} in the retention.
        degeneracy_eps (`float`, defaults to 1e-12): G_k = 0 unless ‖H‖, ‖p − O‖ > eps·‖p‖.

    The paper's ablation switches (`correction_routing`, `transform_assignment`, `transform_seed`,
    `global_scaling`, `cosine_distance`, `correction_direction`, `direction_seed`) are the lab's
    [`AblationUntiedELFScheduler`] (`untied_sc_lab.ablations`); a saved config that carries them at the paper's values loads here.
    """

    family = "elf"
    base_scheduler_class = ELFScheduler
    _compatibles = ["ELFScheduler", *ELF_COMPARISON_SCHEDULERS]
    _kept_config_keys = tuple(ABLATION_DEFAULTS)
    _config_ranges = {**ELF_CONFIG_RANGES, **UNTIED_CONFIG_RANGES}

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        eta_r: float | None = None,
        eta_t: float | None = None,
        eta_o: float | None = None,
        alpha: float | None = None,
        coefficients: str | None = None,
        coefficients_by_steps: dict[str, dict[str, float]] | None = None,
        tuning_by_steps: dict[str, dict] | None = None,
        eps_fp: float = EPS_FP,
        degeneracy_eps: float = DEGENERACY_EPS,
    ):
        self.init_untied()

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        statistics: SamplerStatistics | None = None,
        mask: torch.Tensor | None = None,
        grid_generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Draws the ELF grid, selects the statistics for this NFE and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` and the statistics live.
            generator (`torch.Generator`, *optional*): the sampling generator (see [`ELFScheduler.set_timesteps`]).
            statistics ([`SamplerStatistics`], *optional*): required unless η_R = η_T = 0.
            mask (`torch.Tensor` of shape `(batch, length)`, *optional*): active positions of the correction.
            grid_generator (`torch.Generator`, *optional*): the grid's own generator ([`ELFScheduler.set_timesteps`]).
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(
            context, generator=generator, statistics=statistics, mask=mask, grid_generator=grid_generator
        )
        base = RunContext(generator=run.generator, grid_generator=run.grid_generator, random=run.random)
        self._set_timesteps(
            num_inference_steps, device, run.checked_statistics(), run.mask, run_generator=run.generator, context=base
        )
