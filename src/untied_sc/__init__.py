"""untied-sc: few-step sampling for continuous language flow models (ELF, LangFlow) with untied self-conditioning."""

from .models import (
    ELFTransformerModel,
    LangFlowTransformerModel,
    convert_official_elf,
    convert_official_langflow,
    load_official_elf,
    load_official_langflow,
)
from .pipelines import ELFPipeline, LangFlowPipeline, LanguageFlowPipelineOutput
from .schedulers import (
    ELFScheduler,
    LangFlowScheduler,
    SamplerStatistics,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    UntiedSelfConditioningMixin,
    UntiedSelfConditioningScheduler,
)


__version__ = "0.1.0.dev0"
