"""A rescored report's evaluator control (`benchmark --rescore`, [`evaluator_control`]) as records: each sampler's
headline ratios under the two evaluators ([`HeadlineRatios`], [`ControlRow`]), the samplers' rank agreement per NFE
([`RankAgreement`]) and the per-sample NLL correlation ([`NllCorrelation`]), gathered in [`EvaluatorControl`].

`from_json` / `to_json` cross the report's boundary key for key in the order the committed reports have them; NFEs
are `int` in memory.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..evaluation.aggregates import by_sampler_from_json, by_sampler_to_json, listed


@dataclass(frozen=True)
class HeadlineRatios:
    """
    A sampler's headline at one NFE under one evaluator.

    Args:
        ratio (`float`, *optional*), ratio_ci (*optional*): the GenPPL ratio to the baseline at equal entropy and its
            interval (`None` where there is no reading).
        raw_ratio (`float`), raw_ratio_ci: the main runs' paired GenPPL ratio and its headline interval.
    """

    ratio: float | None
    ratio_ci: Sequence[float] | None
    raw_ratio: float
    raw_ratio_ci: Sequence[float]

    def ratios(self, raw: bool) -> tuple[float | None, Sequence[float] | None]:
        """The raw or the equal-entropy ratio with its interval."""
        return (self.raw_ratio, self.raw_ratio_ci) if raw else (self.ratio, self.ratio_ci)

    @classmethod
    def from_json(cls, data: Mapping) -> "HeadlineRatios":
        return cls(data["ratio"], data["ratio_ci"], data["raw_ratio"], data["raw_ratio_ci"])

    def to_json(self) -> dict:
        return {
            "ratio": self.ratio,
            "ratio_ci": listed(self.ratio_ci),
            "raw_ratio": self.raw_ratio,
            "raw_ratio_ci": listed(self.raw_ratio_ci),
        }


def _optional(data: Mapping | None) -> HeadlineRatios | None:
    return None if data is None else HeadlineRatios.from_json(data)


@dataclass(frozen=True)
class ControlRow:
    """A sampler at one NFE under the first and the second evaluator (`None` where a report has no such cell)."""

    first: HeadlineRatios | None
    second: HeadlineRatios | None

    @classmethod
    def from_json(cls, data: Mapping) -> "ControlRow":
        return cls(_optional(data["first"]), _optional(data["second"]))

    def to_json(self) -> dict:
        return {side: getattr(self, side) and getattr(self, side).to_json() for side in ("first", "second")}


@dataclass(frozen=True)
class RankAgreement:
    """
    Kendall's τ-b of the samplers' ratios under the two evaluators at one NFE.

    Args:
        kendall_tau (`float`, *optional*): τ-b; `None` with fewer than two samplers ranked.
        num_ranked (`int`), ranked (`Sequence[str]`): the samplers both reports can rank.
    """

    kendall_tau: float | None
    num_ranked: int
    ranked: Sequence[str]

    @classmethod
    def from_json(cls, data: Mapping) -> "RankAgreement":
        return cls(data["kendall_tau"], data["num_ranked"], data["ranked"])

    def to_json(self) -> dict:
        return {"kendall_tau": self.kendall_tau, "num_ranked": self.num_ranked, "ranked": list(self.ranked)}


@dataclass(frozen=True)
class NllCorrelation:
    """
    The per-sample NLL per token under the two evaluators, over the distinct samples both scored.

    Args:
        measure (`str`): what is correlated.
        num_samples (`int`): the samples.
        pearson (`float`, *optional*), spearman (`float`, *optional*): the correlations (`None`: undefined).
    """

    measure: str
    num_samples: int
    pearson: float | None
    spearman: float | None

    @classmethod
    def from_json(cls, data: Mapping) -> "NllCorrelation":
        return cls(data["measure"], data["num_samples"], data["pearson"], data["spearman"])

    def to_json(self) -> dict:
        return {
            "measure": self.measure,
            "num_samples": self.num_samples,
            "pearson": self.pearson,
            "spearman": self.spearman,
        }


@dataclass(frozen=True)
class ScoredBy:
    """One side's evaluator: its name (a folder, Hub id or bundled name) and its description (`None`: not recorded)."""

    evaluator: str | None
    evaluator_description: str | None

    @property
    def short_name(self) -> str:
        """The evaluator as the control's headings name it (a folder or Hub id by its last part)."""
        return Path(str(self.evaluator).rstrip("/")).name

    @classmethod
    def from_json(cls, data: Mapping) -> "ScoredBy":
        return cls(data["evaluator"], data["evaluator_description"])

    def to_json(self) -> dict:
        return {"evaluator": self.evaluator, "evaluator_description": self.evaluator_description}


def _by_nfe(data: Mapping) -> dict[int, RankAgreement]:
    return {int(nfe): RankAgreement.from_json(row) for nfe, row in data.items()}


@dataclass(frozen=True)
class EvaluatorControl:
    """
    Two reports of the same runs under two evaluators, side by side.

    Args:
        first ([`ScoredBy`]), second ([`ScoredBy`]): each report's evaluator.
        reading (`str`, *optional*): the equal-entropy reading (`"frontier"`, `"baseline curve"`; `None`: raw only).
        by_sampler: `{sampler: {nfe: ControlRow}}`.
        equal_entropy_agreement, raw_agreement: `{nfe: RankAgreement}` at equal entropy and raw.
        nll_correlation ([`NllCorrelation`]): the per-sample NLLs' correlation.
    """

    first: ScoredBy
    second: ScoredBy
    reading: str | None
    by_sampler: Mapping[str, Mapping[int, ControlRow]]
    equal_entropy_agreement: Mapping[int, RankAgreement]
    raw_agreement: Mapping[int, RankAgreement]
    nll_correlation: NllCorrelation

    @classmethod
    def from_json(cls, data: Mapping) -> "EvaluatorControl":
        agreement = data["rank_agreement"]
        return cls(
            ScoredBy.from_json(data["first"]),
            ScoredBy.from_json(data["second"]),
            data["reading"],
            by_sampler_from_json(data["by_sampler"], ControlRow.from_json),
            _by_nfe(agreement["equal_entropy"]),
            _by_nfe(agreement["raw"]),
            NllCorrelation.from_json(data["nll_correlation"]),
        )

    def to_json(self) -> dict:
        return {
            "first": self.first.to_json(),
            "second": self.second.to_json(),
            "reading": self.reading,
            "by_sampler": by_sampler_to_json(self.by_sampler, ControlRow.to_json),
            "rank_agreement": {
                "equal_entropy": {str(nfe): row.to_json() for nfe, row in self.equal_entropy_agreement.items()},
                "raw": {str(nfe): row.to_json() for nfe, row in self.raw_agreement.items()},
            },
            "nll_correlation": self.nll_correlation.to_json(),
        }
