from .outputs import LanguageFlowSchedulerOutput
from .scheduling_elf import ELFScheduler
from .scheduling_langflow import LangFlowScheduler
from .solvers import ELFSolver, LangFlowSolver
