"""The judge's files as typed records: the key of a blinded export ([`JudgeKey`], its [`PairOrigin`]s and
[`Presentation`]s), a prompts-file line ([`Prompt`]), a judge's reply ([`ChatReply`]) and a reply-cache line
([`CachedReply`]), a verdicts-file line of `judge run` ([`JudgedPresentation`]), what `judge run` did
([`RunSummary`]), and the score report ([`JudgeScore`], its [`PairOutcome`]s, [`Estimate`]s, [`PositionCounts`] and
[`BootstrapSettings`]).

Each crosses the file boundary with `from_json(data, where)` / `to_json()`, key for key in the order the committed
files have them (they are written again byte for byte). A missing field is a [`RecordError`] (a `ValueError`, from
`record_fields.py`) naming the field, the record and `where` (the file, and its line for a JSONL file).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..record_fields import optional, require


# The fields of a pair's origin other than its diversity knobs (a knob is any further field).
ORIGIN_FIELDS = ("seed", "batch", "index", "nfe")
# The statistics a score report gives with an interval, in the report's order.
STATISTICS = ("win_rate", "tie_rate", "loss_rate", "win_rate_non_tie", "arena_score")
# A pair's outcomes: the scored ones, then the two that leave a pair out.
SCORED_OUTCOMES = ("win", "tie", "loss")
UNSCORED_OUTCOMES = ("missing", "unparseable")


def _interval(ci: Sequence[float] | None) -> tuple[float, float] | None:
    return None if ci is None else (ci[0], ci[1])


def _interval_json(ci: tuple[float, float] | None) -> list[float] | None:
    return None if ci is None else list(ci)


@dataclass(frozen=True)
class PairOrigin:
    """Where a pair's two samples come from: seed, batch, sample index, NFE, and the diversity knobs set (empty for
    the main run), which make them the same latent and random stream for both samplers."""

    seed: int
    batch: int
    index: int
    nfe: int
    knobs: Mapping[str, Any]

    def match_key(self) -> tuple:
        """What two samplers' samples share when they are a pair (hashable)."""
        return self.seed, self.batch, self.index, self.nfe, tuple(sorted(self.knobs.items()))

    @classmethod
    def from_json(cls, data: Mapping, where: str, record: str = "pair origin") -> "PairOrigin":
        seed, batch, index, nfe = (require(data, name, record, where) for name in ORIGIN_FIELDS)
        return cls(seed, batch, index, nfe, {name: data[name] for name in data if name not in ORIGIN_FIELDS})

    def to_json(self) -> dict:
        return {"seed": self.seed, "batch": self.batch, "index": self.index, "nfe": self.nfe, **self.knobs}


@dataclass(frozen=True)
class Presentation:
    """One blinded presentation of a pair: the pair's number and the side (`"A"` or `"B"`) the candidate was shown
    on."""

    pair: int
    candidate: str

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "Presentation":
        return cls(require(data, "pair", "presentation", where), require(data, "candidate", "presentation", where))

    def to_json(self) -> dict:
        return {"pair": self.pair, "candidate": self.candidate}


@dataclass(frozen=True)
class JudgeKey:
    """
    The key that un-blinds an export (`key.json`).

    Args:
        format: [`KEY_FORMAT`] of a key `judge export` wrote.
        baseline, candidate: the samplers of the two sides; nfe: their NFE; knobs: the diversity-knob run paired.
        samples (*optional*): the samples file exported; seed (*optional*): the shuffle's and the ids' seed.
        num_pairs: the pairs exported; pairs: pair i's [`PairOrigin`] at position i.
        presentations: each presentation id's [`Presentation`], in the key's order.
    """

    format: str
    baseline: str
    candidate: str
    nfe: int
    knobs: Mapping[str, Any]
    samples: str | None
    seed: int | None
    num_pairs: int
    pairs: Sequence[PairOrigin]
    presentations: Mapping[str, Presentation]

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "JudgeKey":
        def field(name: str) -> Any:
            return require(data, name, "judge key", where)

        return cls(
            format=field("format"),
            baseline=field("baseline"),
            candidate=field("candidate"),
            nfe=field("nfe"),
            knobs=optional(data, "knobs", {}),
            samples=optional(data, "samples"),
            seed=optional(data, "seed"),
            num_pairs=field("num_pairs"),
            pairs=tuple(PairOrigin.from_json(origin, f"{where}, pair {i}") for i, origin in enumerate(field("pairs"))),
            presentations={
                id_: Presentation.from_json(where_, f"{where}, presentation {id_}")
                for id_, where_ in field("presentations").items()
            },
        )

    def to_json(self) -> dict:
        return {
            "format": self.format,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "nfe": self.nfe,
            "knobs": dict(self.knobs),
            "samples": self.samples,
            "seed": self.seed,
            "num_pairs": self.num_pairs,
            "pairs": [origin.to_json() for origin in self.pairs],
            "presentations": {id_: presentation.to_json() for id_, presentation in self.presentations.items()},
        }


@dataclass(frozen=True)
class Prompt:
    """One line of a prompts file: a presentation's opaque id and its two answers in the order shown."""

    id: str
    answer_a: str
    answer_b: str

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "Prompt":
        id_, answer_a, answer_b = (require(data, name, "prompt", where) for name in ("id", "answer_a", "answer_b"))
        if not all(isinstance(value, str) for value in (id_, answer_a, answer_b)):
            raise ValueError(f"{where}: expected string 'id', 'answer_a', 'answer_b'.")
        return cls(id_, answer_a, answer_b)

    def to_json(self) -> dict:
        return {"id": self.id, "answer_a": self.answer_a, "answer_b": self.answer_b}


@dataclass(frozen=True)
class ChatReply:
    """What a judge answered: the message `content`, and the optional `reasoning_content` and `usage` some servers
    send."""

    content: str
    reasoning: str | None = None
    usage: Mapping | None = None
    finish_reason: str | None = None

    @classmethod
    def from_json(cls, payload: Mapping, where: str) -> "ChatReply":
        """The first choice of a chat completion (OpenAI format); an empty or absent content reads as `""`."""
        choices = require(payload, "choices", "chat completion", where)
        choice = choices[0]
        message = require(choice, "message", "chat completion choice", where)
        return cls(
            content=optional(message, "content") or "",
            reasoning=optional(message, "reasoning_content"),
            usage=optional(payload, "usage"),
            finish_reason=optional(choice, "finish_reason"),
        )


@dataclass(frozen=True)
class CachedReply:
    """One line of a reply cache: the request's key (SHA-256 of its body), the presentation it was asked for, and
    what the judge answered."""

    key: str
    id: str | None
    reply: ChatReply

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "CachedReply":
        key, content = require(data, "key", "cached reply", where), require(data, "reply", "cached reply", where)
        reply = ChatReply(
            content, optional(data, "reasoning"), optional(data, "usage"), optional(data, "finish_reason")
        )
        return cls(key, optional(data, "id"), reply)

    def to_json(self) -> dict:
        return {
            "key": self.key,
            "id": self.id,
            "reply": self.reply.content,
            "reasoning": self.reply.reasoning,
            "usage": self.reply.usage,
            "finish_reason": self.reply.finish_reason,
        }


@dataclass(frozen=True)
class JudgedPresentation:
    """One line of the verdicts file `judge run` writes: the presentation, its canonical verdict (`None`:
    unparseable), the judge model and its reply."""

    id: str
    verdict: str | None
    judge: str
    reply: str

    def to_json(self) -> dict:
        return {"id": self.id, "verdict": self.verdict, "judge": self.judge, "reply": self.reply}


@dataclass(frozen=True)
class RunSummary:
    """What a `judge run` did: presentations judged, requests sent and answered from the cache, unparseable replies
    (their ids in prompts-file order), and the verdicts and cache files."""

    num_presentations: int
    num_requests: int
    num_cached: int
    unparseable_ids: Sequence[str]
    out: str
    cache: str

    @property
    def num_unparseable(self) -> int:
        return len(self.unparseable_ids)

    def to_json(self) -> dict:
        return {
            "num_presentations": self.num_presentations,
            "num_requests": self.num_requests,
            "num_cached": self.num_cached,
            "num_unparseable": self.num_unparseable,
            "unparseable_ids": list(self.unparseable_ids),
            "out": self.out,
            "cache": self.cache,
        }


@dataclass(frozen=True)
class PairOutcome:
    """
    One pair's line of a score report.

    Args:
        origin ([`PairOrigin`]): where the pair's samples come from; pair: its number in the key.
        outcome: `"win"`, `"tie"` or `"loss"` (of the candidate), or `"missing"` / `"unparseable"` (left out).
        verdicts, observations, points, score: a scored pair's candidate-side verdicts (both presentations), its
            observations, their sum and their mean; `None` for a pair left out.
    """

    origin: PairOrigin
    pair: int
    outcome: str
    verdicts: Sequence[str] | None = None
    observations: int | None = None
    points: float | None = None
    score: float | None = None

    @property
    def scored(self) -> bool:
        return self.outcome in SCORED_OUTCOMES

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "PairOutcome":
        def field(name: str) -> Any:
            return require(data, name, "pair outcome", where)

        pair, outcome = field("pair"), field("outcome")
        own = ("pair", "verdicts", "observations", "points", "score", "outcome")
        origin = PairOrigin.from_json({name: data[name] for name in data if name not in own}, where, "pair outcome")
        if outcome not in SCORED_OUTCOMES:
            return cls(origin, pair, outcome)
        return cls(
            origin, pair, outcome, tuple(field("verdicts")), field("observations"), field("points"), field("score")
        )

    def to_json(self) -> dict:
        head = {**self.origin.to_json(), "pair": self.pair}
        if not self.scored:
            return {**head, "outcome": self.outcome}
        return {
            **head,
            "verdicts": list(self.verdicts),
            "observations": self.observations,
            "points": self.points,
            "score": self.score,
            "outcome": self.outcome,
        }


@dataclass(frozen=True)
class Estimate:
    """A statistic of the scored pairs and its bootstrap interval (`None`: undefined, e.g. the win rate without a
    non-tie pair)."""

    value: float | None
    ci: tuple[float, float] | None


@dataclass(frozen=True)
class PositionCounts:
    """How often the judge preferred the answer shown first (A), second (B), or neither, over the scored pairs."""

    a_preferred: int
    b_preferred: int
    tie: int

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "PositionCounts":
        return cls(*(require(data, name, "position count", where) for name in ("A_preferred", "B_preferred", "tie")))

    def to_json(self) -> dict:
        return {"A_preferred": self.a_preferred, "B_preferred": self.b_preferred, "tie": self.tie}


@dataclass(frozen=True)
class BootstrapSettings:
    """The intervals' bootstrap: resamples, coverage, what is resampled (`"pair"`), the interval (`"percentile"`) and
    the seed."""

    num_resamples: int
    confidence: float
    unit: str
    interval: str
    seed: int

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "BootstrapSettings":
        names = ("num_resamples", "confidence", "unit", "interval", "seed")
        return cls(*(require(data, name, "bootstrap setting", where) for name in names))

    def to_json(self) -> dict:
        return {
            "num_resamples": self.num_resamples,
            "confidence": self.confidence,
            "unit": self.unit,
            "interval": self.interval,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class JudgeScore:
    """
    A score report (`<name>.json`), definitions in [`untied_sc_lab.judge.score`].

    Args:
        format: [`SCORE_FORMAT`]; baseline, candidate, nfe, knobs: the key's; judges: the judge models named by the
            verdicts (sorted).
        num_pairs, num_pairs_scored, num_pairs_missing, num_pairs_unparseable: the key's pairs, those scored, and
            those left out for an unjudged or an unparseable presentation.
        num_presentations, num_unparseable, num_observations: the key's presentations, the unparseable verdicts, the
            scored pairs' observations.
        wins, ties, losses: the scored pairs' outcomes.
        win_rate, tie_rate, loss_rate, win_rate_non_tie, arena_score ([`Estimate`]): the statistics
            ([`STATISTICS`]) with their intervals.
        verdicts: the scored pairs' candidate-side verdict counts, by label; position ([`PositionCounts`]).
        bootstrap ([`BootstrapSettings`]); unparseable_ids, missing_ids: sorted presentation ids.
        per_pair: each pair's [`PairOutcome`], in key order.
    """

    format: str
    baseline: str
    candidate: str
    nfe: int
    knobs: Mapping[str, Any]
    judges: Sequence[str]
    num_pairs: int
    num_pairs_scored: int
    num_pairs_missing: int
    num_pairs_unparseable: int
    num_presentations: int
    num_unparseable: int
    num_observations: int
    wins: int
    ties: int
    losses: int
    win_rate: Estimate
    tie_rate: Estimate
    loss_rate: Estimate
    win_rate_non_tie: Estimate
    arena_score: Estimate
    verdicts: Mapping[str, int]
    position: PositionCounts
    bootstrap: BootstrapSettings
    unparseable_ids: Sequence[str]
    missing_ids: Sequence[str]
    per_pair: Sequence[PairOutcome]

    def estimates(self) -> list[tuple[str, Estimate]]:
        """The statistics by name, in the report's order."""
        return [(name, getattr(self, name)) for name in STATISTICS]

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "JudgeScore":
        def field(name: str) -> Any:
            return require(data, name, "judge score", where)

        counts = ("num_pairs", "num_pairs_scored", "num_pairs_missing", "num_pairs_unparseable", "num_presentations")
        counts += ("num_unparseable", "num_observations", "wins", "ties", "losses")
        return cls(
            format=field("format"),
            baseline=field("baseline"),
            candidate=field("candidate"),
            nfe=field("nfe"),
            knobs=field("knobs"),
            judges=tuple(field("judges")),
            **{name: field(name) for name in counts},
            **{name: Estimate(field(name), _interval(field(f"{name}_ci"))) for name in STATISTICS},
            verdicts=field("verdicts"),
            position=PositionCounts.from_json(field("position"), f"{where}, position"),
            bootstrap=BootstrapSettings.from_json(field("bootstrap"), f"{where}, bootstrap"),
            unparseable_ids=tuple(field("unparseable_ids")),
            missing_ids=tuple(field("missing_ids")),
            per_pair=tuple(
                PairOutcome.from_json(pair, f"{where}, per_pair {i}") for i, pair in enumerate(field("per_pair"))
            ),
        )

    def to_json(self) -> dict:
        data = {
            "format": self.format,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "nfe": self.nfe,
            "knobs": dict(self.knobs),
            "judges": list(self.judges),
            "num_pairs": self.num_pairs,
            "num_pairs_scored": self.num_pairs_scored,
            "num_pairs_missing": self.num_pairs_missing,
            "num_pairs_unparseable": self.num_pairs_unparseable,
            "num_presentations": self.num_presentations,
            "num_unparseable": self.num_unparseable,
            "num_observations": self.num_observations,
            "wins": self.wins,
            "ties": self.ties,
            "losses": self.losses,
        }
        for name, estimate in self.estimates():
            data[name], data[f"{name}_ci"] = estimate.value, _interval_json(estimate.ci)
        data.update(
            verdicts=dict(self.verdicts),
            position=self.position.to_json(),
            bootstrap=self.bootstrap.to_json(),
            unparseable_ids=list(self.unparseable_ids),
            missing_ids=list(self.missing_ids),
            per_pair=[pair.to_json() for pair in self.per_pair],
        )
        return data
