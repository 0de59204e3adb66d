"""Checks of scheduler config values: ranges of numeric settings, and unknown keys named with the nearest known one.

A config file edited by hand (or written by another version) must fail loudly: an out-of-range value such as
`quantile_eps=2.0` otherwise samples `<|pad|>` everywhere, and a misspelt key (`eta_rr`) silently runs on defaults.
"""

import difflib
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..per_nfe import read_steps_table


@dataclass(frozen=True)
class Range:
    """An interval for a numeric config value; `None` bounds are open-ended."""

    low: float | None = None
    high: float | None = None
    low_inclusive: bool = True
    high_inclusive: bool = True

    def contains(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and not self.low_inclusive)):
            return False
        return not (self.high is not None and (value > self.high or (value == self.high and not self.high_inclusive)))

    def __str__(self) -> str:
        left = "[" if self.low_inclusive and self.low is not None else "("
        right = "]" if self.high_inclusive and self.high is not None else ")"
        low = "-∞" if self.low is None else f"{self.low:g}"
        high = "∞" if self.high is None else f"{self.high:g}"
        return f"{left}{low}, {high}{right}"


POSITIVE = Range(0.0, None, low_inclusive=False)
NON_NEGATIVE = Range(0.0, None)
FINITE = Range()

# Where the untied coefficients are expected (docs/algorithm.md §4.4): up to ten times the paper's largest value (η_R,
# η_T 3.3 and η_O 6.0 in its Table 6, `data/coefficients.json`), which every preset, the sensitivity experiment (×2)
# and three rounds of `untied-sc tune`'s ×2 grid stay inside. A value beyond is allowed, with a warning: it is more
# likely a typo (1000 for 1.0) than a choice.
USUAL_COEFFICIENT_RANGES = {"eta_r": Range(0.0, 33.0), "eta_t": Range(0.0, 33.0), "eta_o": Range(0.0, 60.0)}


def unusual_coefficient_message(name: str, value: float, where: str = "") -> str | None:
    """The warning for an untied coefficient outside its usual range ([`USUAL_COEFFICIENT_RANGES`]), else `None`."""
    usual = USUAL_COEFFICIENT_RANGES.get(name)
    if usual is None or usual.contains(float(value)):
        return None
    return (
        f"{name}{where} = {value:g} lies far outside the usual range {usual} (the paper's presets use at most 3.3 for "
        "η_R and η_T, 6.0 for η_O; docs/algorithm.md §4.4). It runs as given; if it is a typo, fix the value (e.g. "
        f"`{name}=1.0`) or use a preset (`coefficients='elf-b'`)."
    )


def check_config_ranges(owner: str, config: Mapping, ranges: Mapping[str, Range], where: str | None = None) -> None:
    """
    Raises a ValueError naming `owner` (a class name), the field, its allowed range and the file (`where`) when a
    value in `config` lies outside `ranges`. `None` values (unset) pass; a mapping value (e.g. `sde_gamma_by_steps`)
    is checked entry by entry.
    """
    source = f" in {where}" if where else ""
    for name, allowed in ranges.items():
        value = config.get(name)
        if value is None:
            continue
        if isinstance(value, Mapping):  # a per-NFE table (e.g. `sde_gamma_by_steps`): its keys are numbers of steps
            read_steps_table(value, f"{owner} config{source}: {name}")
        entries = value.items() if isinstance(value, Mapping) else [(None, value)]
        for key, entry in entries:
            field = name if key is None else f"{name}[{key!r}]"
            if isinstance(entry, bool) or not isinstance(entry, int | float) or not allowed.contains(float(entry)):
                raise ValueError(
                    f"{owner} config{source}: {field} = {entry!r} lies outside {allowed}. Fix the value (or delete the "
                    "key to use the default)."
                )


def nearest_key(key: str, known: Iterable[str]) -> str | None:
    """The known key closest in spelling to `key` (difflib ratio ≥ 0.6), or `None`."""
    matches = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
    return matches[0] if matches else None


def unknown_key_message(owner: str, key: str, known: Iterable[str]) -> str:
    """The warning for a config key `owner` does not take, naming the nearest known key where there is one."""
    suggestion = nearest_key(key, known)
    hint = f" Did you mean {suggestion!r}?" if suggestion else f" Known keys: {', '.join(sorted(known))}."
    return f"{owner} has no config key {key!r}; it is ignored.{hint}"
