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
from .outputs import LanguageFlowSchedulerOutput
from .run_context import RunContext, TakesRunContext
from .sampler_statistics import COEFFICIENT_NAMES, SamplerStatistics, model_fingerprint
from .scheduling_ace import ACEELFScheduler, ACELangFlowScheduler, HiGSACEELFScheduler, HiGSACELangFlowScheduler
from .scheduling_elf import ELFScheduler
from .scheduling_flowmap import CDEQScheduler, FlowMapLMScheduler, FlowMapSchedulerOutput
from .scheduling_higs import HiGSELFScheduler, HiGSLangFlowScheduler
from .scheduling_langflow import LangFlowScheduler
from .scheduling_momentum import MomentumELFScheduler, MomentumLangFlowScheduler
from .scheduling_multistep import MultistepELFScheduler, MultistepLangFlowScheduler
from .scheduling_untied import UntiedSelfConditioningScheduler, untied_scheduler_class
from .scheduling_untied_elf import UntiedELFScheduler
from .scheduling_untied_langflow import UntiedLangFlowScheduler
from .solvers import ELFSolver, LangFlowSolver
from .untied_functions import masked_mean
from .untied_mixin import UntiedSelfConditioningMixin
