from .outputs import LanguageFlowSchedulerOutput
from .sampler_statistics import SamplerStatistics, model_fingerprint
from .scheduling_elf import ELFScheduler
from .scheduling_langflow import LangFlowScheduler
from .scheduling_untied import UntiedSelfConditioningScheduler, paper_coefficients
from .solvers import ELFSolver, LangFlowSolver
