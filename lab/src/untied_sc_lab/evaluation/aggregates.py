"""A scored sweep's aggregates as [`aggregate`] computes them and a report stores them ([`Aggregates`]): the mean ± SE
over seeds of every metric per (sampler, NFE) ([`MeanSE`]) and the paired comparison of each candidate against the
baseline per NFE ([`PairedSummary`]).

[`Aggregates.to_json`] / [`Aggregates.from_json`] cross the report's boundary key for key in the order the committed
reports have them (they re-render byte for byte); NFEs are `int` in memory and `str` only in JSON (object keys).
"""

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .statistics import mean_and_standard_error


@dataclass(frozen=True)
class MeanSE:
    """
    A mean ± standard error over seeds.

    Args:
        mean (`float`, *optional*): the mean of the finite values; `None` where there is none.
        se (`float`, *optional*): its standard error; `None` with fewer than two values.
        n (`int`): how many finite values it pools.
    """

    mean: float | None
    se: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float | None]) -> "MeanSE":
        """The mean ± SE of `values`, leaving out `None` and NaN."""
        finite = [v for v in values if v is not None and not math.isnan(v)]
        if not finite:
            return cls(None, None, 0)
        mean, se = mean_and_standard_error(finite)
        return cls(mean, None if math.isnan(se) else se, len(finite))

    @classmethod
    def from_json(cls, data: Mapping) -> "MeanSE":
        return cls(data["mean"], data["se"], data["n"])

    def to_json(self) -> dict:
        return {"mean": self.mean, "se": self.se, "n": self.n}


def listed(interval: Sequence[float] | None) -> list[float] | None:
    """An interval as JSON holds it (a list), `None` kept."""
    return None if interval is None else list(interval)


# The paired keys of a report analysed with the small-sample intervals ([`aggregate`]'s `small_sample`), in order.
SMALL_SAMPLE_KEYS = (
    "num_clusters",
    "interval_method",
    "gen_ppl_ratio_headline_ci",
    "gen_ppl_ratio_t_ci",
    "gen_ppl_ratio_bootstrap_t_ci",
    "mean_delta_headline_ci",
    "mean_delta_t_ci",
    "mean_delta_bootstrap_t_ci",
)


@dataclass(frozen=True)
class PairedSummary:
    """
    One candidate against the baseline at one NFE, the pairs of all common seeds pooled.

    Args:
        baseline (`str`): the baseline sampler.
        seeds (`Sequence[int]`): the seeds both samplers ran.
        gen_ppl_ratio (`float`), gen_ppl_ratio_ci: the pooled GenPPL ratio candidate / baseline and its cluster
            bootstrap interval.
        gen_ppl_ratio_per_seed ([`MeanSE`]): the per-seed ratios' mean ± SE.
        num_pairs, fraction_b_worse, fraction_tied, mean_delta, mean_delta_ci, fraction_b_worse_ci, num_dropped:
            the per-sample ΔNLL comparison ([`PairedComparison`]).
        retained_throughput ([`MeanSE`]): candidate / baseline samples per second over seeds.
        num_clusters (`int`, *optional*): the cell's clusters; `None` in a report analysed without the small-sample
            intervals, which then lacks every field below.
        interval_method (`str`, *optional*): the headline's method, `"t"` or `"bootstrap"` (`None`: one cluster).
        gen_ppl_ratio_headline_ci, gen_ppl_ratio_t_ci, gen_ppl_ratio_bootstrap_t_ci, mean_delta_headline_ci,
            mean_delta_t_ci, mean_delta_bootstrap_t_ci: the headline, t- and studentized bootstrap intervals.
    """

    baseline: str
    seeds: Sequence[int]
    gen_ppl_ratio: float
    gen_ppl_ratio_ci: Sequence[float]
    gen_ppl_ratio_per_seed: MeanSE
    num_pairs: int
    fraction_b_worse: float
    fraction_tied: float
    mean_delta: float
    mean_delta_ci: Sequence[float]
    fraction_b_worse_ci: Sequence[float]
    num_dropped: int
    retained_throughput: MeanSE
    num_clusters: int | None = None
    interval_method: str | None = None
    gen_ppl_ratio_headline_ci: Sequence[float] | None = None
    gen_ppl_ratio_t_ci: Sequence[float] | None = None
    gen_ppl_ratio_bootstrap_t_ci: Sequence[float] | None = None
    mean_delta_headline_ci: Sequence[float] | None = None
    mean_delta_t_ci: Sequence[float] | None = None
    mean_delta_bootstrap_t_ci: Sequence[float] | None = None

    @property
    def has_small_sample(self) -> bool:
        """Whether the cell holds the small-sample intervals."""
        return self.num_clusters is not None

    @classmethod
    def from_json(cls, data: Mapping) -> "PairedSummary":
        small = {key: data[key] for key in SMALL_SAMPLE_KEYS} if "num_clusters" in data else {}
        return cls(
            data["baseline"],
            data["seeds"],
            data["gen_ppl_ratio"],
            data["gen_ppl_ratio_ci"],
            MeanSE.from_json(data["gen_ppl_ratio_per_seed"]),
            data["num_pairs"],
            data["fraction_b_worse"],
            data["fraction_tied"],
            data["mean_delta"],
            data["mean_delta_ci"],
            data["fraction_b_worse_ci"],
            data["num_dropped"],
            MeanSE.from_json(data["retained_throughput"]),
            **small,
        )

    def to_json(self) -> dict:
        cell = {
            "baseline": self.baseline,
            "seeds": list(self.seeds),
            "gen_ppl_ratio": self.gen_ppl_ratio,
            "gen_ppl_ratio_ci": list(self.gen_ppl_ratio_ci),
            "gen_ppl_ratio_per_seed": self.gen_ppl_ratio_per_seed.to_json(),
            "num_pairs": self.num_pairs,
            "fraction_b_worse": self.fraction_b_worse,
            "fraction_tied": self.fraction_tied,
            "mean_delta": self.mean_delta,
            "mean_delta_ci": list(self.mean_delta_ci),
            "fraction_b_worse_ci": list(self.fraction_b_worse_ci),
            "num_dropped": self.num_dropped,
            "retained_throughput": self.retained_throughput.to_json(),
        }
        if not self.has_small_sample:
            return cell
        cell.update(num_clusters=self.num_clusters, interval_method=self.interval_method)
        cell.update({key: listed(getattr(self, key)) for key in SMALL_SAMPLE_KEYS[2:]})
        return cell


@dataclass(frozen=True)
class Aggregates:
    """
    A sweep's aggregates over its main runs.

    Args:
        by_sampler: `{sampler: {nfe: {metric: MeanSE}}}`, the metrics in [`AGGREGATED_METRICS`]'s order.
        paired: `{candidate: {nfe: PairedSummary}}` against the baseline.
    """

    by_sampler: Mapping[str, Mapping[int, Mapping[str, MeanSE]]]
    paired: Mapping[str, Mapping[int, PairedSummary]]

    def metrics(self, sampler: str, nfe: int) -> Mapping[str, MeanSE]:
        """A sampler's metrics at an NFE (empty where it did not run there)."""
        return self.by_sampler.get(sampler, {}).get(nfe, {})

    def metric(self, sampler: str, nfe: int, name: str) -> MeanSE | None:
        """One metric of a sampler at an NFE; `None` where it did not run there or the report lacks the metric."""
        return self.metrics(sampler, nfe).get(name)

    @classmethod
    def from_json(cls, data: Mapping) -> "Aggregates":
        by_sampler = by_sampler_from_json(
            data["by_sampler"], lambda metrics: {name: MeanSE.from_json(stat) for name, stat in metrics.items()}
        )
        return cls(by_sampler, by_sampler_from_json(data["paired"], PairedSummary.from_json))

    def to_json(self) -> dict:
        return {
            "by_sampler": by_sampler_to_json(
                self.by_sampler, lambda metrics: {name: stat.to_json() for name, stat in metrics.items()}
            ),
            "paired": by_sampler_to_json(self.paired, PairedSummary.to_json),
        }


@dataclass(frozen=True)
class CurvePoint:
    """
    One point of a sampler's GenPPL–entropy curve at one NFE: a diversity knob value's runs over seeds.

    Args:
        value (`float`, *optional*): the knob's value (the report's `diversity_knob` names the knob); `None` where the
            main runs have no default value to sit at.
        default (`bool`): the main runs (the sampler's own value).
        gen_ppl ([`MeanSE`]), entropy ([`MeanSE`]): the runs' GenPPL and entropy over seeds.
    """

    value: float | None
    default: bool
    gen_ppl: MeanSE
    entropy: MeanSE

    @classmethod
    def from_json(cls, data: Mapping, knob: str) -> "CurvePoint":
        return cls(data[knob], data["default"], MeanSE.from_json(data["gen_ppl"]), MeanSE.from_json(data["entropy"]))

    def to_json(self, knob: str) -> dict:
        return {
            knob: self.value,
            "default": self.default,
            "gen_ppl": self.gen_ppl.to_json(),
            "entropy": self.entropy.to_json(),
        }


# `{sampler: {nfe: [CurvePoint, …]}}`, each curve sorted by knob value.
DiversityCurves = Mapping[str, Mapping[int, Sequence[CurvePoint]]]


def by_sampler_from_json(data: Mapping, read: Callable[[Any], Any]) -> dict:
    """A report's `{sampler: {nfe: cell}}` table with each cell `read` and NFEs `int` (JSON object keys are `str`)."""
    return {sampler: {int(nfe): read(cell) for nfe, cell in by_nfe.items()} for sampler, by_nfe in data.items()}


def by_sampler_to_json(table: Mapping, write: Callable[[Any], Any]) -> dict:
    """The JSON of a `{sampler: {nfe: cell}}` table ([`by_sampler_from_json`]'s inverse), each cell `write`n."""
    return {sampler: {str(nfe): write(cell) for nfe, cell in by_nfe.items()} for sampler, by_nfe in table.items()}


def curves_from_json(data: Mapping, knob: str) -> DiversityCurves:
    """A report's `diversity_curves` as [`CurvePoint`]s (NFEs `int`)."""
    return by_sampler_from_json(data, lambda points: [CurvePoint.from_json(point, knob) for point in points])


def curves_to_json(curves: DiversityCurves, knob: str) -> dict:
    """The `diversity_curves` a report holds ([`curves_from_json`]'s inverse)."""
    return by_sampler_to_json(curves, lambda points: [point.to_json(knob) for point in points])
