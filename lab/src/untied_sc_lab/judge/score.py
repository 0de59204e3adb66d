"""Scoring pairwise verdicts as the paper's protocol defines it (App. "Pairwise LLM-judge evaluation protocol").

Every presentation's verdict is first read from the candidate's side through the key: `A>>B` with the candidate
shown as B is "baseline significantly better". It then becomes binary observations of "the candidate is better",
as in Arena-Hard-Auto: a significant verdict (≫) is three observations (1 if the candidate is the better side, 0 if
not), a slight verdict (>) one observation (1 or 0), a tie one observation of 0.5.

- **Pair outcome.** A pair's two presentations are merged: with n_i its observations and s_i their sum, the pair is a
  candidate win if s_i / n_i > 0.5, a baseline win (loss) if s_i / n_i < 0.5, and a tie otherwise.
- **Win, tie and loss rates**: the three outcomes' shares of the scored pairs.
- **Win rate**: wins / (wins + losses), the candidate's share of the non-tie pairs (the paper's "wins 96.3% of
  non-tie comparisons").
- **Arena score**: 100 · Σ s_i / Σ n_i, the mean of all observations (pairs with ≫ verdicts weigh more).
- **Intervals**: percentile intervals of 10,000 paired bootstrap resamples: pairs are drawn with replacement (both
  presentations of a pair travel together) and every statistic is recomputed on each resample.

A pair with a presentation left unjudged or an unparseable verdict is not scored (Arena-Hard-Auto drops the question
too); both counts are reported, and the paper's protocol expects them to be zero.
"""

import math
from collections import Counter

import torch

from untied_sc.defaults import JUDGE_NUM_RESAMPLES

from ..evaluation.statistics import cluster_resample_weights, percentile_interval
from .records import (
    SCORED_OUTCOMES,
    STATISTICS,
    BootstrapSettings,
    Estimate,
    JudgeKey,
    JudgeScore,
    PairOrigin,
    PairOutcome,
    PositionCounts,
)
from .verdicts import VERDICT_STRENGTH, VerdictRecord


SCORE_FORMAT = "untied-sc judge score v1"
NUM_RESAMPLES = JUDGE_NUM_RESAMPLES
OUTCOMES = SCORED_OUTCOMES
# Candidate-side strength (+2 candidate significantly better ... -2 baseline significantly better) -> observations
# and their doubled sum (integers, so that s / n = 0.5 is decided exactly).
OBSERVATIONS = {2: (3, 6), 1: (1, 2), 0: (1, 1), -1: (1, 0), -2: (3, 0)}
CANDIDATE_SIDE_LABELS = {2: "candidate>>", 1: "candidate>", 0: "tie", -1: "baseline>", -2: "baseline>>"}


def candidate_strength(verdict: str, candidate_side: str) -> int:
    """The verdict read from the candidate's side: +2 candidate significantly better ... -2 baseline significantly
    better."""
    strength = VERDICT_STRENGTH[verdict]
    if candidate_side == "A":
        return strength
    if candidate_side == "B":
        return -strength
    raise ValueError(f"A key's candidate side must be 'A' or 'B', got {candidate_side!r}.")


def _pair_outcome(observations: int, doubled_points: int) -> str:
    # s / n vs 0.5 with s = doubled_points / 2: compare doubled_points with n.
    if doubled_points > observations:
        return "win"
    if doubled_points < observations:
        return "loss"
    return "tie"


def _ratio(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    return numerator / denominator.where(denominator > 0, torch.full_like(denominator, float("nan")))


def _interval(estimates: torch.Tensor, confidence: float) -> tuple[float, float] | None:
    finite = estimates[estimates.isfinite()]
    return percentile_interval(finite, confidence) if finite.numel() else None


def _preferred_side(verdict: str) -> str:
    """The side a verdict prefers, whatever the candidate's: `"A"`, `"B"` or `"tie"`."""
    return "A" if verdict.startswith("A>") else "B" if verdict.startswith("B>") else "tie"


def _score_pair(origin: PairOrigin, pair: int, games: list[tuple[VerdictRecord | None, str]]) -> PairOutcome:
    """A pair's outcome from its presentations' verdicts and the candidate's side in each (module docstring)."""
    if any(record is None for record, _ in games):
        return PairOutcome(origin, pair, "missing")
    if any(record.verdict is None for record, _ in games):
        return PairOutcome(origin, pair, "unparseable")
    strengths = [candidate_strength(record.verdict, side) for record, side in games]
    observations = sum(OBSERVATIONS[s][0] for s in strengths)
    doubled = sum(OBSERVATIONS[s][1] for s in strengths)
    return PairOutcome(
        origin,
        pair,
        _pair_outcome(observations, doubled),
        verdicts=tuple(CANDIDATE_SIDE_LABELS[s] for s in strengths),
        observations=observations,
        points=doubled / 2,
        score=doubled / (2 * observations),
    )


def score_verdicts(
    key: JudgeKey,
    verdicts: dict[str, VerdictRecord],
    num_resamples: int = NUM_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> JudgeScore:
    """Scores `verdicts` (from [`read_verdicts`]) through `key` (from [`read_key`]); definitions in the module
    docstring.

    Returns:
        [`JudgeScore`]: the key's sides and NFE, the counts, outcomes, statistics with their intervals, the
        candidate-side verdict counts, how often each position was preferred, the bootstrap settings, the ids left
        out and each pair's [`PairOutcome`].
    """
    presentations = key.presentations
    unknown = sorted(set(verdicts) - set(presentations))
    if unknown:
        raise ValueError(
            f"{len(unknown)} verdicts name presentations the key does not hold (e.g. {unknown[:3]}): wrong --key?"
        )
    by_pair: dict[int, list[tuple[VerdictRecord | None, str]]] = {i: [] for i in range(key.num_pairs)}
    for id_, where in presentations.items():
        by_pair[where.pair].append((verdicts.get(id_), where.candidate))
    unparseable_ids = sorted(id_ for id_, record in verdicts.items() if record.verdict is None)
    missing_ids = sorted(set(presentations) - set(verdicts))
    per_pair = [_score_pair(key.pairs[i], i, games) for i, games in by_pair.items()]
    scored = [p for p in per_pair if p.scored]
    if not scored:
        raise ValueError(
            f"No pair has two parseable verdicts ({len(missing_ids)} presentations unjudged, {len(unparseable_ids)} "
            "unparseable); nothing to score."
        )
    preferred = [_preferred_side(record.verdict) for p in per_pair if p.scored for record, _ in by_pair[p.pair]]
    n = torch.tensor([p.observations for p in scored], dtype=torch.float64)
    points = torch.tensor([p.points for p in scored], dtype=torch.float64)
    outcome = {name: torch.tensor([p.outcome == name for p in scored], dtype=torch.float64) for name in OUTCOMES}

    def statistics(weights: torch.Tensor) -> dict[str, torch.Tensor]:
        total = weights.sum(dim=-1)
        wins, ties, losses = (weights @ outcome[name] for name in OUTCOMES)
        rates = (wins / total, ties / total, losses / total, _ratio(wins, wins + losses))
        return dict(zip(STATISTICS, (*rates, 100 * (weights @ points) / (weights @ n)), strict=True))

    point = statistics(torch.ones(len(scored), dtype=torch.float64))
    resampled = statistics(cluster_resample_weights(range(len(scored)), num_resamples, seed))
    estimates = {}
    for name in STATISTICS:
        value = float(point[name])
        estimates[name] = Estimate(None if math.isnan(value) else value, _interval(resampled[name], confidence))
    wins, ties, losses = (int(outcome[name].sum()) for name in OUTCOMES)
    strengths = Counter(label for p in scored for label in p.verdicts)
    return JudgeScore(
        format=SCORE_FORMAT,
        baseline=key.baseline,
        candidate=key.candidate,
        nfe=key.nfe,
        knobs=key.knobs,
        judges=tuple(sorted({v.judge for v in verdicts.values() if v.judge})),
        num_pairs=key.num_pairs,
        num_pairs_scored=len(scored),
        num_pairs_missing=sum(p.outcome == "missing" for p in per_pair),
        num_pairs_unparseable=sum(p.outcome == "unparseable" for p in per_pair),
        num_presentations=len(presentations),
        num_unparseable=len(unparseable_ids),
        num_observations=int(n.sum()),
        wins=wins,
        ties=ties,
        losses=losses,
        **estimates,
        verdicts={label: strengths[label] for label in CANDIDATE_SIDE_LABELS.values()},
        position=PositionCounts(preferred.count("A"), preferred.count("B"), preferred.count("tie")),
        bootstrap=BootstrapSettings(num_resamples, confidence, "pair", "percentile", seed),
        unparseable_ids=tuple(unparseable_ids),
        missing_ids=tuple(missing_ids),
        per_pair=tuple(per_pair),
    )
