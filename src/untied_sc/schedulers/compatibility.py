"""What every scheduler of this package shares with diffusers' config machinery: swapping schedulers by config.

diffusers resolves a scheduler's `_compatibles` (class names) in its own namespace only, so a third-party scheduler
can list none: `scheduler.compatibles` stays empty, and `from_config` warns that the keys of a config saved by a
sibling scheduler "will be ignored" (it keeps them all the same, as hidden config, so a swap back restores them).
[`CompatibleSchedulerMixin`] resolves the names in `untied_sc.schedulers` first, then in diffusers.
"""

import importlib
import warnings

import diffusers

from .config_checks import Range, check_config_ranges, unknown_key_message
from .contract import init_keys


class CompatibleSchedulerMixin:
    r"""
    Mixed in before diffusers' `SchedulerMixin, ConfigMixin` by every scheduler of this package.

    - `_compatibles` names the schedulers a config can be swapped with (`Cls.from_config(other.config)`); names
      resolve in `untied_sc.schedulers`, then in `diffusers`. A sibling's keys are then filtered silently and kept
      as hidden config, so official → untied → official keeps the untied keys without a "will be ignored" warning.
    - `_kept_config_keys` names keys this class does not take but keeps in its config when a config carries them
      (the lab's ablation switches at the paper's values): they load silently, so that swapping back to a class that
      takes them gives them back.
    - The config carries `_class_name` from the start (diffusers adds it only when saving), so that
      `UntiedSelfConditioningScheduler.from_config(scheduler.config)` can tell the family of a config in memory.
    - `_use_default_values` is kept sorted, so that two configs of equal values compare equal (diffusers lists the
      keys in set order, which differs between instances).
    - A key set with `register_to_config` after `__init__` (e.g. `coefficients_by_steps` written by
      `untied-sc tune`) stops counting as an `__init__` default, so that an in-memory `from_config` swap keeps it
      (diffusers drops the keys it remembers as defaults before building the new scheduler).
    - `_config_ranges` gives the allowed range of numeric settings: an out-of-range value is refused when the
      scheduler is built (from a file, a config or keyword arguments), and a key that neither this class nor a
      compatible one takes warns, naming the nearest known key (`from_config(eta_rr=1.0)`).
    """

    _compatibles: list[str] = []
    _kept_config_keys: tuple[str, ...] = ()
    _config_ranges: dict[str, Range] = {}

    @classmethod
    def _get_compatibles(cls) -> list[type]:
        schedulers = importlib.import_module(__package__)
        names = sorted({cls.__name__, *cls._compatibles})
        found = [getattr(schedulers, name, None) or getattr(diffusers, name, None) for name in names]
        return [scheduler for scheduler in found if scheduler is not None]

    @classmethod
    def extract_init_dict(cls, config_dict, **kwargs):
        defaults = config_dict.get("_use_default_values", [])
        kept = {key: config_dict[key] for key in cls._kept_config_keys if key in config_dict and key not in defaults}
        current = {key: value for key, value in config_dict.items() if key not in cls._kept_config_keys}
        init_dict, unused_kwargs, hidden_config = super().extract_init_dict(current, **kwargs)
        known = set(cls._kept_config_keys)
        for scheduler in cls._get_compatibles():
            known |= init_keys(scheduler) | set(getattr(scheduler, "_kept_config_keys", ()))
        for key in unused_kwargs:
            if not key.startswith("_") and key not in known and key != "dtype":
                warnings.warn(unknown_key_message(cls.__name__, key, known), UserWarning, stacklevel=3)
        return init_dict, unused_kwargs, {**hidden_config, **kept}

    def register_to_config(self, **kwargs) -> None:
        first = "_internal_dict" not in self.__dict__
        if first:
            check_config_ranges(type(self).__name__, kwargs, self._config_ranges)
            if "_use_default_values" in kwargs:  # diffusers lists them in set order: sorted, configs compare equal
                kwargs["_use_default_values"] = sorted(kwargs["_use_default_values"])
        super().register_to_config(**kwargs)
        if first:
            # The class name, which diffusers writes only when saving, so that a config in memory says what it is.
            super().register_to_config(_class_name=type(self).__name__)
            return
        defaults = self._internal_dict.get("_use_default_values")
        if defaults:  # keys set after `__init__` hold chosen values
            super().register_to_config(_use_default_values=[key for key in defaults if key not in kwargs])
