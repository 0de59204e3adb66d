"""How a report's samplers were tuned on the tuning bank (`--experiment baselines`, the report's `knob_tuning`): the
bank ([`KnobTuning`]) and each sampler's choice per NFE ([`TuningRecord`], its bank scores [`BankScores`] and its
comparison with official [`BankComparison`]), in either rule's layout (the one rule's, with `budget`; the fixed
grid's, with `max_entropy_drop`), and what a `--tune-here` generation sampled per NFE ([`TunedWhenSampled`]).

Every record reads its JSON with `from_json` and writes it back with `to_json`, key for key and in order; NFEs are
`int` in memory, `str` only in the JSON. The search's own records (its candidates, official's curve, its start) are
kept as the search wrote them: the report renders none of them.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from untied_sc.per_nfe import read_steps_table, write_steps_table

from ..evaluation.aggregates import by_sampler_from_json, by_sampler_to_json
from ..record_fields import require


_RECORD = "tuning record"  # how a missing field's error names the record


def _in_order(fields: dict, sorted_keys: bool) -> dict:
    """`fields` in the record's own order, or sorted where it was read with sorted keys (a saved scheduler config's
    JSON sorts them: the untied sampler's records come from there)."""
    return dict(sorted(fields.items())) if sorted_keys else fields


def _sorted_keys(data: Mapping) -> bool:
    return list(data) == sorted(data)


@dataclass(frozen=True)
class BankScores:
    """GenPPL and entropy on the tuning bank (`sorted_keys`: the JSON lists them sorted, [`_in_order`])."""

    gen_ppl: float
    entropy: float
    sorted_keys: bool = field(default=False, compare=False)

    @classmethod
    def from_json(cls, data: Mapping, where: str = "bank scores") -> "BankScores":
        return cls(
            require(data, "gen_ppl", _RECORD, where), require(data, "entropy", _RECORD, where), _sorted_keys(data)
        )

    def to_json(self) -> dict:
        return _in_order({"gen_ppl": self.gen_ppl, "entropy": self.entropy}, self.sorted_keys)


# The two layouts of a comparison with official: the one rule's equal-entropy ratio, the fixed grid's paired ΔNLL.
RATIO_FIELDS = ("entropy", "gen_ppl", "baseline_gen_ppl_at_entropy", "ratio", "ratio_ci", "fraction_outside")
DELTA_FIELDS = ("num_pairs", "mean_delta_nll", "mean_delta_nll_ci", "fraction_worse")


@dataclass(frozen=True)
class BankComparison:
    """
    The pick against official on the bank: the one rule's GenPPL ratio at the pick's entropy ([`RATIO_FIELDS`]:
    `ratio`, `ratio_ci` and the readings they come from) or the fixed grid's paired mean ΔNLL ([`DELTA_FIELDS`]:
    `mean_delta_nll`, `mean_delta_nll_ci`, over `num_pairs` pairs); `None` where a layout lacks a field.
    """

    ratio: float | None = None
    ratio_ci: Sequence[float] | None = None
    mean_delta_nll: float | None = None
    mean_delta_nll_ci: Sequence[float] | None = None
    entropy: float | None = None
    gen_ppl: float | None = None
    baseline_gen_ppl_at_entropy: float | None = None
    fraction_outside: float | None = None
    num_pairs: int | None = None
    fraction_worse: float | None = None
    sorted_keys: bool = field(default=False, compare=False)

    @property
    def is_paired_delta(self) -> bool:
        """The fixed grid's layout (paired ΔNLL over matched pairs)."""
        return self.num_pairs is not None

    @classmethod
    def from_json(cls, data: Mapping, where: str = "a comparison with official") -> "BankComparison":
        names = DELTA_FIELDS if "num_pairs" in data else RATIO_FIELDS
        return cls(**{name: require(data, name, _RECORD, where) for name in names}, sorted_keys=_sorted_keys(data))

    def to_json(self) -> dict:
        names = DELTA_FIELDS if self.is_paired_delta else RATIO_FIELDS
        return _in_order({name: getattr(self, name) for name in names}, self.sorted_keys)


def _comparison(data: Mapping, where: str) -> BankComparison | None:
    comparison = require(data, "best_vs_official", _RECORD, where)
    return None if comparison is None else BankComparison.from_json(comparison, f"{where}.best_vs_official")


def _comparison_json(comparison: BankComparison | None) -> dict | None:
    return None if comparison is None else comparison.to_json()


@dataclass(frozen=True)
class TuningRecord:
    """
    One sampler's choice at one NFE, in one of four layouts ([`TuningRecord.layout`]): a comparison sampler's by the
    one rule (`"search"`) or by the fixed grid (`"grid"`), the untied sampler's by `untied-sc tune` (`"untied"`) or
    by the entropy-guard rule before it (`"untied grid"`).

    Args:
        chosen (`Mapping[str, float | str]`): the knob values it runs with.
        chosen_scores ([`BankScores`]): theirs on the bank.
        outcome (`str`): what the keep rule decided.
        rule (`str`, *optional*): the rule (the one rule's records; the untied sampler's earlier records name theirs).
        candidates_tried (`int`, *optional*): the scored candidates.
        best_vs_official ([`BankComparison`], *optional*): the pick against official (`None`: no admissible pick).
        edges (`Mapping[str, str]`, *optional*): where the pick lies on each knob's line.
        on_edge (`bool`): whether it lies on an edge.
        grid (`Sequence[Mapping]`, *optional*), official ([`BankScores`], *optional*): the fixed grid and official's
            bank scores (the fixed grid's records).
        seed (`int`, *optional*), seed_space (`str`, *optional*), num_samples (`int`, *optional*): the untied
            sampler's own bank (`untied-sc tune`); a record with a seed is the untied sampler's.
        budget (`int`, *optional*): the one rule's scored candidates at most.
        max_entropy_drop (`float`, *optional*): the untied sampler's earlier entropy guard.
        knobs, start, official_curve, candidates, best, confidence, neutral, grid_source (*optional*): the
            comparison sampler's search as it wrote them ([`SearchResult.record`], [`knob_record`]).
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
    budget: int | None = None
    max_entropy_drop: float | None = None
    knobs: Mapping[str, str] | Sequence[str] | None = None
    start: Mapping[str, float | str] | None = None
    official_curve: Mapping | None = None
    candidates: Sequence[Mapping] | None = None
    best: Mapping | None = None
    confidence: float | None = None
    neutral: Mapping[str, float | str] | None = None
    grid_source: str | None = None

    @property
    def layout(self) -> str:
        """`"search"`, `"grid"`, `"untied"` or `"untied grid"` (the class docstring)."""
        if self.seed is not None:
            return "untied" if self.budget is not None else "untied grid"
        return "grid" if self.grid is not None else "search"

    @classmethod
    def from_json(cls, data: Mapping, where: str = "a tuning record") -> "TuningRecord":
        def need(name: str) -> Any:
            return require(data, name, _RECORD, where)

        common = {
            "chosen": need("chosen"),
            "chosen_scores": BankScores.from_json(need("chosen_scores"), f"{where}.chosen_scores"),
            "outcome": need("outcome"),
        }
        if "seed" in data:
            bank = {"seed": need("seed"), "seed_space": need("seed_space"), "num_samples": need("num_samples")}
            if "budget" not in data:
                return cls(**common, **bank, rule=data.get("rule"), max_entropy_drop=need("max_entropy_drop"))
            return cls(
                **common,
                **bank,
                rule=need("rule"),
                budget=need("budget"),
                candidates_tried=need("candidates_tried"),
                best_vs_official=_comparison(data, where),
                on_edge=need("on_edge"),
                edges=data.get("edges"),  # the untied sampler's earliest records of the one rule have none
            )
        if "grid" in data:
            return cls(
                **common,
                knobs=need("knobs"),
                neutral=need("neutral"),
                grid=need("grid"),
                grid_source=need("grid_source"),
                official=BankScores.from_json(need("official"), f"{where}.official"),
                candidates=need("candidates"),
                best_vs_official=_comparison(data, where),
            )
        return cls(
            **common,
            rule=need("rule"),
            budget=need("budget"),
            candidates_tried=need("candidates_tried"),
            knobs=need("knobs"),
            start=need("start"),
            official_curve=need("official_curve"),
            candidates=need("candidates"),
            best=need("best"),
            edges=need("edges"),
            on_edge=need("on_edge"),
            best_vs_official=_comparison(data, where),
            confidence=need("confidence"),
            neutral=need("neutral"),
        )

    def to_json(self) -> dict:
        chosen, scores = dict(self.chosen), self.chosen_scores.to_json()
        comparison = _comparison_json(self.best_vs_official)
        layout = self.layout
        if layout in ("untied", "untied grid"):
            bank = {"seed": self.seed, "seed_space": self.seed_space, "num_samples": self.num_samples}
            if layout == "untied grid":
                rule = {} if self.rule is None else {"rule": self.rule}  # the earliest records name no rule
                return {
                    **bank,
                    **rule,
                    "chosen": chosen,
                    "chosen_scores": scores,
                    "max_entropy_drop": self.max_entropy_drop,
                    "outcome": self.outcome,
                }
            edges = {} if self.edges is None else {"edges": dict(self.edges)}
            return {
                **bank,
                "rule": self.rule,
                "budget": self.budget,
                "candidates_tried": self.candidates_tried,
                "chosen": chosen,
                "chosen_scores": scores,
                "best_vs_official": comparison,
                "on_edge": self.on_edge,
                **edges,
                "outcome": self.outcome,
            }
        if layout == "grid":
            return {
                "knobs": self.knobs,
                "neutral": self.neutral,
                "grid": self.grid,
                "grid_source": self.grid_source,
                "official": self.official.to_json(),
                "candidates": self.candidates,
                "chosen": chosen,
                "chosen_scores": scores,
                "outcome": self.outcome,
                "best_vs_official": comparison,
            }
        return {
            "rule": self.rule,
            "budget": self.budget,
            "candidates_tried": self.candidates_tried,
            "knobs": self.knobs,
            "start": self.start,
            "official_curve": self.official_curve,
            "candidates": self.candidates,
            "best": self.best,
            "edges": dict(self.edges),
            "on_edge": self.on_edge,
            "best_vs_official": comparison,
            "confidence": self.confidence,
            "outcome": self.outcome,
            "chosen": chosen,
            "neutral": self.neutral,
            "chosen_scores": scores,
        }


def _optional(data: Mapping | None) -> TuningRecord | None:
    return None if data is None else TuningRecord.from_json(data, "an untied sampler's tuning record")


def _optional_json(record: TuningRecord | None) -> dict | None:
    return None if record is None else record.to_json()


UntiedRecords = Mapping[str, Mapping[int, TuningRecord | None]]


def untied_from_json(data: Mapping) -> dict[str, dict[int, TuningRecord | None]]:
    """The untied samplers' records, `{sampler: {nfe: record or None}}` (`None`: not tuned), NFEs `int`."""
    return by_sampler_from_json(data, _optional)


def untied_to_json(untied: UntiedRecords) -> dict:
    """[`untied_from_json`]'s inverse."""
    return by_sampler_to_json(untied, _optional_json)


@dataclass(frozen=True)
class AceDirection:
    """The ACE direction the ACE samplers ran with: its estimation settings and the sha256 of its values."""

    seed: int
    seed_space: str
    num_trajectories: int
    num_inference_steps: int
    batch_size: int
    model_fingerprint: str
    direction_sha256: str

    @classmethod
    def from_json(cls, data: Mapping, where: str = "knob_tuning.ace") -> "AceDirection":
        return cls(**{name: require(data, name, _RECORD, where) for name in cls.__dataclass_fields__})

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class KnobTuning:
    """
    The tuning bank and every sampler's choice on it.

    Args:
        seed (`int`), seed_space (`str`): the bank's seed and its seed space.
        num_samples (`int`), batch_size (`int`): its samples and batches.
        evaluator (`str`, *optional*), protocol (`str`): its scoring (`None` until the caller names the evaluator).
        confidence (`float`): the keep rule's interval level.
        budget (`int`, *optional*): the one rule's scored candidates per NFE at most.
        max_entropy_drop (`float`, *optional*): the fixed grid's entropy guard (that layout's mark).
        samplers: `{sampler: {nfe: TuningRecord}}`, the comparison samplers.
        untied: `{sampler: {nfe: TuningRecord | None}}`, the untied samplers (`None`: not tuned).
        ace ([`AceDirection`], *optional*): the ACE direction (`None`: the pipeline has none).
        methods: `{sampler: method}`, each comparison sampler's method.
    """

    seed: int
    seed_space: str
    num_samples: int
    batch_size: int
    evaluator: str | None
    protocol: str
    confidence: float
    budget: int | None
    max_entropy_drop: float | None
    samplers: Mapping[str, Mapping[int, TuningRecord]]
    untied: UntiedRecords
    ace: AceDirection | None = None
    methods: Mapping[str, str] = field(default_factory=dict)

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
        where = "knob_tuning"

        def need(name: str) -> Any:
            return require(data, name, _RECORD, where)

        samplers, methods = {}, {}
        for sampler, entry in need("samplers").items():
            at = f"{where}.samplers[{sampler!r}]"
            methods[sampler] = require(entry, "method", _RECORD, at)
            samplers[sampler] = read_steps_table(
                require(entry, "by_steps", _RECORD, at),
                f"{at}.by_steps",
                lambda _n, record, record_at: TuningRecord.from_json(record, record_at),
            )
        ace = need("ace")
        return cls(
            need("seed"),
            data.get("seed_space", "benchmark"),  # reports before the seed spaces: benchmark seeds
            need("num_samples"),
            need("batch_size"),
            need("evaluator"),
            need("protocol"),
            need("confidence"),
            data.get("budget"),
            data.get("max_entropy_drop"),
            samplers,
            untied_from_json(data.get("untied", {})),
            None if ace is None else AceDirection.from_json(ace),
            methods,
        )

    def to_json(self) -> dict:
        rule = {"max_entropy_drop": self.max_entropy_drop} if self.is_grid else {"budget": self.budget}
        return {
            "seed": self.seed,
            "seed_space": self.seed_space,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "evaluator": self.evaluator,
            "protocol": self.protocol,
            **rule,
            "confidence": self.confidence,
            "ace": None if self.ace is None else self.ace.to_json(),
            "samplers": {
                sampler: {"method": self.methods[sampler], "by_steps": write_steps_table(by_nfe, TuningRecord.to_json)}
                for sampler, by_nfe in self.samplers.items()
            },
            "untied": untied_to_json(self.untied),
        }


@dataclass(frozen=True)
class TunedWhenSampled:
    """
    How a `--tune-here` generation was tuned where it was sampled: the bank's evaluator and protocol, and per NFE the
    runs it sampled (those whose choice was not neutral, official's among them).
    """

    evaluator: str
    protocol: str
    sampled: Mapping[int, Sequence[str]]

    @classmethod
    def from_json(cls, data: Mapping, where: str = "tuned_when_sampled") -> "TunedWhenSampled":
        sampled = read_steps_table(require(data, "sampled", _RECORD, where), f"{where}.sampled")
        return cls(require(data, "evaluator", _RECORD, where), require(data, "protocol", _RECORD, where), sampled)

    def to_json(self) -> dict:
        sampled = write_steps_table({n: list(names) for n, names in self.sampled.items()})
        return {"evaluator": self.evaluator, "protocol": self.protocol, "sampled": sampled}


@dataclass(frozen=True)
class SampledBank:
    """
    The tuning bank a `--tune-here` generation sampled, with the search's settings (`benchmark --store DIR` replays
    the search on it): its seed, seed space, size and batches, and the rule's budget, confidence, official's curve
    values (`None`: the family's) and extrapolation.
    """

    seed: int
    seed_space: str
    num_samples: int
    batch_size: int
    budget: int
    confidence: float
    curve_values: Sequence[float] | None
    extrapolate: float

    @classmethod
    def from_json(cls, data: Mapping, where: str = "the sampled tuning bank") -> "SampledBank":
        fields = {
            name: require(data, name, _RECORD, where) for name in cls.__dataclass_fields__ if name != "curve_values"
        }
        return cls(**fields, curve_values=data.get("curve_values"))

    def to_json(self) -> dict:
        curve_values = None if self.curve_values is None else list(self.curve_values)
        return {
            "seed": self.seed,
            "seed_space": self.seed_space,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "budget": self.budget,
            "confidence": self.confidence,
            "curve_values": curve_values,
            "extrapolate": self.extrapolate,
        }
