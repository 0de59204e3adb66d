"""How a report's samplers were tuned on the tuning bank (`--experiment baselines`, the report's `knob_tuning`), as
the report reads it: the bank ([`KnobTuning`]) and each sampler's choice per NFE ([`TuningRecord`], its bank scores
[`BankScores`] and its comparison with official [`BankComparison`]), in either rule's layout (the one rule's, with
`budget`; the fixed grid's, with `max_entropy_drop`).

[`KnobTuning.from_json`] reads the fields a report renders; the search's own records (candidates, the official
curve, the start) stay in the JSON the tuning wrote.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..evaluation.aggregates import by_sampler_from_json


@dataclass(frozen=True)
class BankScores:
    """GenPPL and entropy on the tuning bank."""

    gen_ppl: float
    entropy: float

    @classmethod
    def from_json(cls, data: Mapping) -> "BankScores":
        return cls(data["gen_ppl"], data["entropy"])


@dataclass(frozen=True)
class BankComparison:
    """
    The pick against official on the bank: the one rule's GenPPL ratio at the pick's entropy (`ratio`, `ratio_ci`)
    or the fixed grid's paired mean ΔNLL (`mean_delta_nll`, `mean_delta_nll_ci`); `None` where a layout lacks it.
    """

    ratio: float | None = None
    ratio_ci: Sequence[float] | None = None
    mean_delta_nll: float | None = None
    mean_delta_nll_ci: Sequence[float] | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> "BankComparison":
        return cls(data.get("ratio"), data.get("ratio_ci"), data.get("mean_delta_nll"), data.get("mean_delta_nll_ci"))


@dataclass(frozen=True)
class TuningRecord:
    """
    One sampler's choice at one NFE.

    Args:
        chosen (`Mapping[str, float | str]`): the knob values it runs with.
        chosen_scores ([`BankScores`]): theirs on the bank.
        outcome (`str`): what the keep rule decided.
        rule (`str`, *optional*): the rule (the one rule's records).
        candidates_tried (`int`, *optional*): the scored candidates.
        best_vs_official ([`BankComparison`], *optional*): the pick against official (`None`: no admissible pick).
        edges (`Mapping[str, str]`, *optional*): where the pick lies on each knob's line.
        on_edge (`bool`): whether it lies on an edge.
        grid (`Sequence[Mapping]`, *optional*), official ([`BankScores`], *optional*): the fixed grid and official's
            bank scores (the fixed grid's records).
        seed (`int`, *optional*), seed_space (`str`, *optional*), num_samples (`int`, *optional*): the untied
            sampler's own bank (`untied-sc tune`).
    """

    chosen: Mapping[str, float | str]
    chosen_scores: BankScores
    outcome: str
    rule: str | None = None
    candidates_tried: int | None = None
    best_vs_official: BankComparison | None = None
    edges: Mapping[str, str] | None = None
    on_edge: bool = False
    grid: Sequence[Mapping] | None = None
    official: BankScores | None = None
    seed: int | None = None
    seed_space: str | None = None
    num_samples: int | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> "TuningRecord":
        comparison = data.get("best_vs_official")
        official = data.get("official")
        return cls(
            data["chosen"],
            BankScores.from_json(data["chosen_scores"]),
            data["outcome"],
            data.get("rule"),
            data.get("candidates_tried"),
            BankComparison.from_json(comparison) if comparison else None,
            data.get("edges"),
            bool(data.get("on_edge")),
            data.get("grid"),
            BankScores.from_json(official) if official else None,
            data.get("seed"),
            data.get("seed_space"),
            data.get("num_samples"),
        )


def _optional(data: Mapping | None) -> TuningRecord | None:
    return None if data is None else TuningRecord.from_json(data)


@dataclass(frozen=True)
class KnobTuning:
    """
    The tuning bank and every sampler's choice on it.

    Args:
        seed (`int`), seed_space (`str`): the bank's seed and its seed space.
        num_samples (`int`), batch_size (`int`): its samples and batches.
        evaluator (`str`), protocol (`str`): its scoring.
        confidence (`float`): the keep rule's interval level.
        budget (`int`, *optional*): the one rule's scored candidates per NFE at most.
        max_entropy_drop (`float`, *optional*): the fixed grid's entropy guard (that layout's mark).
        samplers: `{sampler: {nfe: TuningRecord}}`, the comparison samplers.
        untied: `{sampler: {nfe: TuningRecord | None}}`, the untied samplers (`None`: not tuned).
    """

    seed: int
    seed_space: str
    num_samples: int
    batch_size: int
    evaluator: str
    protocol: str
    confidence: float
    budget: int | None
    max_entropy_drop: float | None
    samplers: Mapping[str, Mapping[int, TuningRecord]]
    untied: Mapping[str, Mapping[int, TuningRecord | None]]

    @property
    def is_grid(self) -> bool:
        """A report of the fixed-grid rule (its own layout)."""
        return self.max_entropy_drop is not None

    def records(self) -> list[TuningRecord]:
        """Every sampler's records, the comparison samplers first, the untied ones not tuned left out."""
        tuned = [record for by_nfe in self.samplers.values() for record in by_nfe.values()]
        return tuned + [record for by_nfe in self.untied.values() for record in by_nfe.values() if record]

    @classmethod
    def from_json(cls, data: Mapping) -> "KnobTuning":
        samplers = {
            sampler: {int(nfe): TuningRecord.from_json(record) for nfe, record in entry["by_steps"].items()}
            for sampler, entry in data["samplers"].items()
        }
        return cls(
            data["seed"],
            data.get("seed_space", "benchmark"),
            data["num_samples"],
            data["batch_size"],
            data["evaluator"],
            data["protocol"],
            data["confidence"],
            data.get("budget"),
            data.get("max_entropy_drop"),
            samplers,
            by_sampler_from_json(data.get("untied", {}), _optional),
        )
