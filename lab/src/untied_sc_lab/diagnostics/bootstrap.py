"""An estimate of a diagnostic with its percentile bootstrap interval ([`BootstrapEstimate`], [`percentile_interval`])."""

import math
from dataclasses import dataclass


def percentile_interval(draws: list[float], confidence: float) -> tuple[float, float] | None:
    """The percentile interval of bootstrap `draws` at level `confidence`; `None` without draws."""
    if not draws:
        return None
    draws = sorted(draws)
    return (
        draws[int(math.floor((1 - confidence) / 2 * (len(draws) - 1)))],
        draws[int(math.ceil((1 + confidence) / 2 * (len(draws) - 1)))],
    )


@dataclass(frozen=True)
class BootstrapEstimate:
    """
    An estimate with its percentile bootstrap interval.

    Args:
        value (`float`): the estimate on all the data.
        ci (`tuple[float, float]`, *optional*): its interval at `confidence`; `None` without resamples.
        confidence (`float`), resamples (`int`): the interval's level and bootstrap resamples.
    """

    value: float
    ci: tuple[float, float] | None
    confidence: float
    resamples: int

    def to_json(self, name: str) -> dict:
        """The estimate as the JSON payload stores it, its value under `name` (what the estimate is)."""
        ci = None if self.ci is None else list(self.ci)
        return {name: self.value, "ci": ci, "confidence": self.confidence, "resamples": self.resamples}
