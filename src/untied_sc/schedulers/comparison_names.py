"""The comparison samplers by method and family, read from the registry of sampling methods
([`untied_sc.sampling_methods`]): their class names, for `_compatibles` lists (names only: no imports at module
level, so the official schedulers can list them without importing the modules that build on them), and
[`comparison_scheduler_class`] to get a class from a sampler spec's method name."""

from ..families import family_names
from ..sampling_methods import comparison_methods, comparison_scheduler_names, get_method


COMPARISON_METHODS = tuple(method.name for method in comparison_methods())
# The methods that steer with ACE's direction (the pipeline component `ace_statistics`).
ACE_METHODS = tuple(method.name for method in comparison_methods() if method.uses_ace)
ELF_COMPARISON_SCHEDULERS = comparison_scheduler_names("elf")
LANGFLOW_COMPARISON_SCHEDULERS = comparison_scheduler_names("langflow")


def comparison_scheduler_class(method: str, family: str) -> type:
    """The scheduler of comparison `method` (`"momentum"`, `"higs"`, `"ace"`, `"higs_ace"`, `"multistep"`) for
    `family` (`"elf"` or `"langflow"`)."""
    if method not in COMPARISON_METHODS or family not in get_method(method).schedulers:
        raise ValueError(
            f"No comparison sampler {method!r} for family {family!r}: methods are {COMPARISON_METHODS}, families "
            f"{sorted(family_names())}."
        )
    return get_method(method).scheduler_class(family)
