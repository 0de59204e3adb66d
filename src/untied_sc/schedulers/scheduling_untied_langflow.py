"""UntiedLangFlowScheduler: untied self-conditioning on the official LangFlow sampler."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .comparison_names import LANGFLOW_COMPARISON_SCHEDULERS
from .compatibility import CompatibleSchedulerMixin
from .run_context import RunContext, run_context
from .sampler_statistics import SamplerStatistics
from .scheduling_langflow import LANGFLOW_CONFIG_RANGES, QUANTILE_EPS, LangFlowScheduler
from .untied_mixin import ABLATION_DEFAULTS, DEGENERACY_EPS, EPS_FP, UNTIED_CONFIG_RANGES, UntiedSelfConditioningMixin


class UntiedLangFlowScheduler(UntiedSelfConditioningMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin):
    r"""
    Untied self-conditioning (paper Algorithm 1, [`UntiedSelfConditioningMixin`]) on the official LangFlow sampler
    ([`LangFlowScheduler`], used unchanged as `self.base`: with η_R = η_T = 0 it is the official sampler bit for bit).
    LangFlow's final evaluation only reads out tokens: it is transformed but not corrected.

    Swap it into a LangFlow pipeline with `UntiedLangFlowScheduler.from_config(pipe.scheduler.config,
    coefficients="langflow-owt")` and back with `LangFlowScheduler.from_config(pipe.scheduler.config)`.

    Coefficients for N steps, first match wins: the explicit `eta_r`/`eta_t`/`eta_o`/`alpha`; the preset named by
    `coefficients` (if it covers N); N's `coefficients_by_steps` entry; the preset's entry at its nearest listed NFE;
    else an error naming these options.

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        eta_r, eta_t, eta_o, alpha, coefficients, coefficients_by_steps, tuning_by_steps, eps_fp, degeneracy_eps:
            the untied keys, as for [`UntiedELFScheduler`] (presets `"langflow-owt"`, `"langflow-lm1b"`).

    The paper's ablation switches are the lab's [`AblationUntiedLangFlowScheduler`], as for ELF.
    """

    family = "langflow"
    base_scheduler_class = LangFlowScheduler
    _compatibles = ["LangFlowScheduler", *LANGFLOW_COMPARISON_SCHEDULERS]
    _kept_config_keys = tuple(ABLATION_DEFAULTS)
    _config_ranges = {**LANGFLOW_CONFIG_RANGES, **UNTIED_CONFIG_RANGES}

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
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
        proposal: tuple[float, float, float] | None = None,
        statistics: SamplerStatistics | None = None,
        mask: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Builds the LangFlow γ grid, selects the statistics for this NFE and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` and the statistics live.
            proposal (`tuple`, *optional*): the model's (loc, scale, cutoff); `None` uses the config's `proposal`
                (see [`LangFlowScheduler.set_timesteps`]).
            statistics ([`SamplerStatistics`], *optional*): required unless η_R = η_T = 0.
            mask (`torch.Tensor` of shape `(batch, length)`, *optional*): active positions of the correction.
            generator (`torch.Generator`, *optional*): the sampling generator; nothing is drawn from it (LangFlow's
                grid is fixed; the lab's direction controls seed their draws from its state).
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(context, proposal=proposal, statistics=statistics, mask=mask, generator=generator)
        statistics = run.checked_statistics()
        self._set_timesteps(
            num_inference_steps, device, statistics, run.mask, run_generator=run.generator, proposal=run.proposal
        )
