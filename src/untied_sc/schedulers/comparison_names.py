"""The comparison samplers by method and family: their class names, for `_compatibles` lists (names only: no imports
at module level, so the official schedulers can list them without importing the modules that build on them), and
[`comparison_scheduler_class`] to get a class from a sampler spec's method name."""

import importlib


COMPARISON_METHODS = ("momentum", "higs", "ace", "higs_ace", "multistep")
# The methods that steer with ACE's direction (the pipeline component `ace_statistics`).
ACE_METHODS = ("ace", "higs_ace")
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


def comparison_scheduler_class(method: str, family: str) -> type:
    """The scheduler of comparison `method` (`"momentum"`, `"higs"`, `"ace"`, `"higs_ace"`, `"multistep"`) for
    `family` (`"elf"` or `"langflow"`)."""
    names = {"elf": ELF_COMPARISON_SCHEDULERS, "langflow": LANGFLOW_COMPARISON_SCHEDULERS}
    if method not in COMPARISON_METHODS or family not in names:
        raise ValueError(
            f"No comparison sampler {method!r} for family {family!r}: methods are {COMPARISON_METHODS}, families "
            f"{sorted(names)}."
        )
    schedulers = importlib.import_module(__package__)
    return getattr(schedulers, dict(zip(COMPARISON_METHODS, names[family], strict=True))[method])
