from .coefficients import (
    StepCoefficients,
    TuningRecord,
    entropy_matched_setting,
    paper_coefficients,
    preset_entry,
    resolve_coefficients,
    stored_coefficients,
    stored_tuning,
    tables_config,
)
from .comparison_names import COMPARISON_METHODS
from .compatibility import CompatibleSchedulerMixin
from .flowmap_statistics import FlowMapStatistics
from .history_directions import (
    active_mask,
    history_direction,
    masked_mean,
    masked_token_mean,
    sample_scale,
    solver_history_direction,
    token_cosine_distance,
    zero_inactive,
)
from .outputs import LanguageFlowSchedulerOutput
from .run_context import RunContext, TakesRunContext
from .sampler_statistics import COEFFICIENT_NAMES, SamplerStatistics, model_fingerprint
from .scheduling_ace import ACEELFScheduler, ACELangFlowScheduler, HiGSACEELFScheduler, HiGSACELangFlowScheduler
from .scheduling_elf import DEFAULT_SDE_GAMMA, NOISE_SCALE, P_MEAN, P_STD, T_EPS, ELFScheduler
from .scheduling_flowmap import CDEQScheduler, FlowMapLMScheduler, FlowMapSchedulerOutput
from .scheduling_higs import HiGSELFScheduler, HiGSLangFlowScheduler
from .scheduling_langflow import QUANTILE_EPS, LangFlowScheduler
from .scheduling_momentum import MomentumELFScheduler, MomentumLangFlowScheduler
from .scheduling_multistep import MultistepELFScheduler, MultistepLangFlowScheduler
from .scheduling_untied import UntiedSelfConditioningScheduler, untied_scheduler_class
from .scheduling_untied_elf import UntiedELFScheduler
from .scheduling_untied_langflow import UntiedLangFlowScheduler
from .solvers import ELFSolver, LangFlowSolver
from .transform import compute_dtype, overlap_transform, retention
from .untied_mixin import DEGENERACY_EPS, EPS_FP, StepSwitches, UntiedSelfConditioningMixin
from .untied_step import UntiedState
