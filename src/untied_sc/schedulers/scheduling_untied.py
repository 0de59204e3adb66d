"""UntiedSelfConditioningScheduler: the untied scheduler of a pipeline's family, chosen from its config."""

import importlib
from abc import ABCMeta
from collections.abc import Mapping

from diffusers.configuration_utils import ConfigMixin
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ..families import family_names, get_family, untied_families
from .scheduling_untied_elf import UntiedELFScheduler
from .scheduling_untied_langflow import UntiedLangFlowScheduler
from .untied_mixin import UntiedSelfConditioningMixin


UNTIED_SCHEDULERS = {cls.family: cls for cls in (UntiedELFScheduler, UntiedLangFlowScheduler)}


def untied_scheduler_class(family: str) -> type:
    """The untied scheduler of `family` (`"elf"` or `"langflow"`: the families Algorithm 1 serves)."""
    if family in family_names() and family not in untied_families():
        record = get_family(family)
        raise ValueError(
            f"The {record.display_name} family is not sampled by Algorithm 1's untied scheduler: build its own, "
            f"{record.untied_scheduler.name}.from_config(pipe.scheduler.config, ...)."
        )
    if family not in untied_families():
        raise ValueError(f"The solver family must be one of {sorted(untied_families())}, got {family!r}.")
    return get_family(family).untied_scheduler.load()


def _class_family(class_name) -> str | None:
    """The `family` of a scheduler class of this package named `class_name` (`None` for any other name)."""
    schedulers = importlib.import_module(__package__)
    return getattr(getattr(schedulers, str(class_name), None), "family", None)


class UntiedSelfConditioningScheduler(SchedulerMixin, ConfigMixin, metaclass=ABCMeta):
    r"""
    The untied scheduler for a config's family: [`UntiedELFScheduler`] or [`UntiedLangFlowScheduler`].

    `UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, **overrides)` reads the family from the
    config's `_class_name` (`ELFScheduler` and `UntiedELFScheduler` → ELF; LangFlow likewise), or from a `solver=`
    argument, and returns that family's scheduler built from the config. `from_pretrained(folder)` does the same
    from a saved `scheduler_config.json`. `UntiedSelfConditioningScheduler(solver="elf", eta_r=...)` builds one
    directly.

    It is never itself instantiated; `isinstance(scheduler, UntiedSelfConditioningScheduler)` is true for every
    untied scheduler ([`UntiedSelfConditioningMixin`]).
    """

    def __new__(cls, *args, solver: str | None = None, **kwargs):
        if cls is not UntiedSelfConditioningScheduler:
            raise TypeError(
                f"{cls.__name__} subclasses UntiedSelfConditioningScheduler, which only picks a family's scheduler. "
                "Subclass UntiedELFScheduler or UntiedLangFlowScheduler (or UntiedSelfConditioningMixin) instead."
            )
        if args:
            raise TypeError("UntiedSelfConditioningScheduler takes keyword arguments only (the family's config).")
        if solver is None:
            raise ValueError(
                "Give the solver family: UntiedSelfConditioningScheduler(solver='elf' or 'langflow', ...), or build "
                "UntiedELFScheduler(...) / UntiedLangFlowScheduler(...) directly."
            )
        return untied_scheduler_class(solver)(**kwargs)

    @classmethod
    def family_of(cls, config: Mapping, solver: str | None = None) -> str:
        """The family of `config`: from `solver` or its `_class_name` (they must agree)."""
        sources = {
            "the solver argument": solver,
            f"_class_name {config.get('_class_name')!r}": _class_family(config.get("_class_name")),
        }
        found = {source: family for source, family in sources.items() if family is not None}
        if len(set(found.values())) > 1:
            raise ValueError(f"The scheduler config names two solver families: {found}.")
        if not found:
            raise ValueError(
                f"Cannot tell the solver family of a {config.get('_class_name') or 'scheduler'} config: it is neither "
                "an ELF nor a LangFlow scheduler's. Pass solver='elf' or 'langflow', or use "
                "UntiedELFScheduler.from_config / UntiedLangFlowScheduler.from_config."
            )
        return next(iter(found.values()))

    @classmethod
    def from_config(cls, config: Mapping | None = None, return_unused_kwargs: bool = False, **kwargs):
        """The family's untied scheduler from `config` (see the class docstring); `kwargs` override config values."""
        config = dict(config or {})
        target = untied_scheduler_class(cls.family_of(config, kwargs.pop("solver", None)))
        return target.from_config(config, return_unused_kwargs=return_unused_kwargs, **kwargs)


UntiedSelfConditioningScheduler.register(UntiedSelfConditioningMixin)
