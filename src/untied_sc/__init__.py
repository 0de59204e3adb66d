"""untied-sc: few-step sampling for continuous language flow models (ELF, LangFlow) with untied self-conditioning.

The names below are imported on first access, so that `import untied_sc` (and the `untied-sc` command line) does not
load torch, diffusers or transformers until they are needed.
"""

from .lazy_imports import lazy_attributes


__version__ = "0.1.0.dev0"

__getattr__, __dir__, __all__ = lazy_attributes(
    __name__,
    {
        ".models": (
            "ELFTransformerModel",
            "LangFlowTransformerModel",
            "FlowMapTransformerModel",
            "convert_official_elf",
            "convert_official_flowmap",
            "convert_official_langflow",
            "load_official_elf",
            "load_official_flowmap",
            "load_official_langflow",
        ),
        ".pipelines": (
            "ELFPipeline",
            "ELFText2TextPipeline",
            "FlowMapPipeline",
            "LangFlowPipeline",
            "LanguageFlowPipelineOutput",
        ),
        ".schedulers": (
            "CDEQScheduler",
            "ELFScheduler",
            "FlowMapLMScheduler",
            "LangFlowScheduler",
            "SamplerStatistics",
            "UntiedELFScheduler",
            "UntiedLangFlowScheduler",
            "UntiedSelfConditioningMixin",
            "UntiedSelfConditioningScheduler",
        ),
    },
)
