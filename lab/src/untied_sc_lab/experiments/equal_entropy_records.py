"""A report's readings at equal entropy as records: each sampler against the baseline's curve at its own entropy
([`EqualEntropyRow`], the report's `equal_entropy`) and, where every sampler was swept, each one on its own frontier
at the baseline's entropy with the head-to-head readings ([`FrontierRow`], [`HeadToHead`], [`Frontiers`]).

`from_json` / `to_json` cross the report's boundary key for key in the order the committed reports have them; NFEs
are `int` in memory.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..evaluation.aggregates import by_sampler_from_json, by_sampler_to_json


if TYPE_CHECKING:  # the curves pull in torch; the records only read a reading's fields
    from ..evaluation.curves import FrontierReading


# The keys of a reading at an entropy, in the reports' order: the baseline's curve at a sampler's entropy
# (`equal_entropy`), a frontier at the baseline's entropy (`frontiers`), a head-to-head between two frontiers.
EQUAL_ENTROPY_KEYS = (
    "entropy",
    "gen_ppl",
    "baseline_gen_ppl_at_entropy",
    "ratio",
    "ratio_ci",
    "fraction_outside",
    "entropy_resampled",
)
READING_KEYS = (
    "entropy",
    "gen_ppl",
    "reference_gen_ppl",
    "ratio",
    "ratio_ci",
    "fraction_outside",
    "entropy_resampled",
)
FRONTIER_KEYS = (*READING_KEYS, "points", "frontier_entropy_range", "raw_ratio", "raw_ratio_ci", "switched_off")
HEAD_TO_HEAD_KEYS = ("sampler", "against", *READING_KEYS)


def _reading_fields(reading: "FrontierReading") -> dict:
    """A frontier reading's fields under the names a frontier row and a head-to-head share ([`READING_KEYS`])."""
    return {key: getattr(reading, key) for key in READING_KEYS}


def _json(record, keys: tuple[str, ...]) -> dict:
    """A record's fields under `keys`, in that order, intervals as lists (JSON's arrays)."""
    values = {key: getattr(record, key) for key in keys}
    return {key: list(value) if isinstance(value, tuple) else value for key, value in values.items()}


@dataclass(frozen=True)
class EqualEntropyRow:
    """
    One sampler at one NFE against the baseline's GenPPL–entropy curve read at the sampler's entropy.

    Args:
        entropy (`float`), gen_ppl (`float`): the sampler's main runs.
        baseline_gen_ppl_at_entropy (`float`, *optional*): the curve's GenPPL there; `None` outside its range.
        ratio (`float`, *optional*): `gen_ppl` over it; `None` outside.
        ratio_ci (`Sequence[float]`, *optional*): its interval; `None` where too many resamples fall outside.
        fraction_outside (`float`, *optional*): the fraction of resamples outside the curve's range.
        entropy_resampled (`bool`): whether the entropies were resampled (reports without per-sample entropies hold
            them at their measured values).
    """

    entropy: float
    gen_ppl: float
    baseline_gen_ppl_at_entropy: float | None
    ratio: float | None
    ratio_ci: Sequence[float] | None
    fraction_outside: float | None
    entropy_resampled: bool

    @classmethod
    def from_json(cls, data: Mapping) -> "EqualEntropyRow":
        return cls(**{key: data[key] for key in EQUAL_ENTROPY_KEYS})

    def to_json(self) -> dict:
        return _json(self, EQUAL_ENTROPY_KEYS)


# `{sampler: {nfe: EqualEntropyRow}}`
EqualEntropy = Mapping[str, Mapping[int, EqualEntropyRow]]


def equal_entropy_from_json(data: Mapping) -> EqualEntropy:
    return by_sampler_from_json(data, EqualEntropyRow.from_json)


def equal_entropy_to_json(rows: EqualEntropy) -> dict:
    return by_sampler_to_json(rows, EqualEntropyRow.to_json)


@dataclass(frozen=True)
class FrontierRow:
    """
    One sampler at one NFE read on its own frontier (its main run and its diversity sweep) at the baseline's entropy.

    Args:
        entropy (`float`): the baseline's main-run entropy, where the frontier is read.
        gen_ppl (`float`, *optional*): the frontier's GenPPL there; `None` outside it.
        reference_gen_ppl (`float`): the baseline's GenPPL.
        ratio, ratio_ci, fraction_outside, entropy_resampled: as in [`EqualEntropyRow`].
        points (`int`): the frontier's points.
        frontier_entropy_range (`Sequence[float]`, *optional*): its lowest and highest entropy.
        raw_ratio, raw_ratio_ci (*optional*): the main runs' paired GenPPL ratio and its interval.
        switched_off (`bool`): the method runs the baseline's samples (not a rival).
    """

    entropy: float
    gen_ppl: float | None
    reference_gen_ppl: float
    ratio: float | None
    ratio_ci: Sequence[float] | None
    fraction_outside: float | None
    entropy_resampled: bool
    points: int
    frontier_entropy_range: Sequence[float] | None = None
    raw_ratio: float | None = None
    raw_ratio_ci: Sequence[float] | None = None
    switched_off: bool = False

    @classmethod
    def from_reading(cls, reading: "FrontierReading", points: int, **more) -> "FrontierRow":
        """A sampler's frontier read at the baseline's entropy, with its `points` and the optional fields `more`."""
        return cls(**_reading_fields(reading), points=points, **more)

    @classmethod
    def from_json(cls, data: Mapping) -> "FrontierRow":
        optional = {key: data[key] for key in FRONTIER_KEYS[len(READING_KEYS) + 1 :] if key in data}
        return cls(**{key: data[key] for key in (*READING_KEYS, "points")}, **optional)

    def to_json(self) -> dict:
        return _json(self, FRONTIER_KEYS)


@dataclass(frozen=True)
class HeadToHead:
    """
    An untied sampler against the best other method at the baseline's entropy, both on their own frontiers.

    Args:
        sampler (`str`), against (`str`): the two.
        entropy, gen_ppl, reference_gen_ppl, ratio, ratio_ci, fraction_outside, entropy_resampled: as in
            [`FrontierRow`], `against`'s frontier the reference.
    """

    sampler: str
    against: str
    entropy: float
    gen_ppl: float | None
    reference_gen_ppl: float | None
    ratio: float | None
    ratio_ci: Sequence[float] | None
    fraction_outside: float | None
    entropy_resampled: bool

    @classmethod
    def from_reading(cls, sampler: str, against: str, reading: "FrontierReading") -> "HeadToHead":
        return cls(sampler, against, **_reading_fields(reading))

    @classmethod
    def from_json(cls, data: Mapping) -> "HeadToHead":
        return cls(**{key: data[key] for key in HEAD_TO_HEAD_KEYS})

    def to_json(self) -> dict:
        return _json(self, HEAD_TO_HEAD_KEYS)


@dataclass(frozen=True)
class Frontiers:
    """
    A sweep's frontier readings at the baseline's entropy.

    Args:
        by_sampler: `{sampler: {nfe: FrontierRow}}`.
        head_to_head: `{nfe: [HeadToHead, …]}` (empty where no rival has a reading).
    """

    by_sampler: Mapping[str, Mapping[int, FrontierRow]]
    head_to_head: Mapping[int, Sequence[HeadToHead]]

    @classmethod
    def from_json(cls, data: Mapping) -> "Frontiers":
        heads = {int(nfe): [HeadToHead.from_json(row) for row in rows] for nfe, rows in data["head_to_head"].items()}
        return cls(by_sampler_from_json(data["by_sampler"], FrontierRow.from_json), heads)

    def to_json(self) -> dict:
        return {
            "by_sampler": by_sampler_to_json(self.by_sampler, FrontierRow.to_json),
            "head_to_head": {str(nfe): [row.to_json() for row in rows] for nfe, rows in self.head_to_head.items()},
        }
