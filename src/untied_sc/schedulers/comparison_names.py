"""The class names of the comparison samplers per family, for `_compatibles` lists (names only: no imports, so the
official schedulers can list them without importing the modules that build on them)."""

ELF_COMPARISON_SCHEDULERS = (
    "MomentumELFScheduler",
    "HiGSELFScheduler",
    "ACEELFScheduler",
    "HiGSACEELFScheduler",
    "MultistepELFScheduler",
)
LANGFLOW_COMPARISON_SCHEDULERS = (
    "MomentumLangFlowScheduler",
    "HiGSLangFlowScheduler",
    "ACELangFlowScheduler",
    "HiGSACELangFlowScheduler",
    "MultistepLangFlowScheduler",
)
