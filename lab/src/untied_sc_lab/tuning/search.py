"""One tuning rule for every sampler, judged at equal entropy (docs/algorithm.md §4.4).

The untied sampler (`untied-sc tune`) and every comparison sampler (`untied-sc benchmark --experiment baselines`) are
tuned by the same search, on the same bank, with the same budget and objective:

1. **Bank.** `num_samples` samples of seed `seed` in the tuning seed space (`untied_sc.seeds`): every candidate and
   the official sampler see the same latents and random streams (matched pairs), and no benchmark batch lies there.
2. **Official curve.** The official sampler runs on the bank at several values of the family's diversity knob
   ([`diversity_knob`]: LangFlow's x̂ temperature, ELF's decode temperature), its default among them; that traces
   GenPPL against entropy ([`OfficialCurve`]).
3. **Objective.** A candidate at entropy h scores `log GenPPL(candidate) − log GenPPL_official(h)`, the official
   curve read at h ([`gen_ppl_on_curve`], the monotone cubic of the benchmark's equal-entropy control). It is
   two-sided: a candidate that raises entropy is compared with official at that higher entropy and credited for it.
   No extrapolation beyond `extrapolate` nats (default 0.02) outside the curve's measured entropies (read there on the
   end's tangent, which on a convex curve errs against the candidate); further out the candidate is `outside`,
   unscored and never picked. The official sampler itself scores exactly 0 (the curve passes through its point).
4. **Search.** A coordinate search over the method's knobs ([`METHOD_KNOBS`]: its strengths and the choices its
   source leaves open, e.g. HiGS's routing), from the method's start (the untied sampler: its calibrated
   coefficients; the others: their sources' defaults). A strength knob tries ×0, ×½, ×2 of the current best (coarse
   rounds, repeated until a round changes nothing), then ×√½, ×√2 (fine rounds, likewise); a choice knob tries its
   other values. Whenever a line's best value is the largest (or smallest) value tried on that line and not a hard
   limit of the knob (0, or α = 1, β = 1), the line is extended by the phase's step until it is not. Every method has
   the same `budget` of scored candidates per NFE (default [`TUNE_BUDGET`] = 20; the start counts, the official
   curve does not, repeats are free); the search stops when it is spent or converged.
5. **Keep rule.** The best candidate is kept only if it beats official at equal entropy on the bank's matched pairs:
   the cluster bootstrap interval of its equal-entropy ratio ([`equal_entropy_ratio`], the curve re-fitted on every
   resample, the family's resampling unit) lies below 1. Otherwise the method runs at its neutral value (bit for bit
   the official sampler).

The record ([`SearchResult.record`]) lists the rule, the budget, every candidate with its score and the phase that
proposed it, the pick, and for every knob whether the pick lies on an edge of what was tried: `interior`, `hard
limit` (the knob cannot go further) or `edge (budget spent)`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from untied_sc.defaults import EXTRAPOLATE, TUNE_BUDGET, TUNE_CONFIDENCE
from untied_sc.sampling_methods import Knob, methods

from ..evaluation.curves import EntropyRatio, equal_entropy_ratio, gen_ppl_on_curve
from ..record_fields import require
from ..runs.bank_run import BankRun


COARSE_FACTORS = (0.0, 0.5, 2.0)
FINE_FACTORS = (2**-0.5, 2**0.5)
KNOB_DEFAULTS = {"temperature": 1.0, "decode_temperature": 0.0}


# [choice] Each method's knobs (its strength, and the choices its source leaves open: docs/algorithm.md §9), the
# values at which it is the official sampler bit for bit (knobs not named keep their start), and its source's
# defaults, where a comparison method's search starts (the untied sampler starts from calibration): the registry of
# sampling methods.
METHOD_KNOBS: dict[str, tuple[Knob, ...]] = {method.name: method.knobs for method in methods()}
NEUTRAL = {method.name: dict(method.neutral) for method in methods()}
START = {method.name: dict(method.start) for method in methods() if method.start is not None}


@dataclass
class OfficialCurve:
    """The official sampler on the bank at several values of the diversity `knob` (`runs[i]` at `values[i]`)."""

    knob: str
    values: list[float]
    runs: list[BankRun]
    extrapolate: float = EXTRAPOLATE

    @property
    def default(self) -> BankRun:
        """The official sampler itself (the knob at its default)."""
        return self.runs[self.values.index(KNOB_DEFAULTS[self.knob])]

    def usable(self) -> list[tuple[float, BankRun]]:
        return [(v, r) for v, r in zip(self.values, self.runs, strict=True) if r.entropy is not None and r.gen_ppl > 0]

    def entropy_range(self) -> tuple[float, float]:
        entropies = [run.entropy for _, run in self.usable()]
        return min(entropies), max(entropies)

    def reference(self, entropy: float | None) -> float | None:
        """Official's GenPPL at `entropy` on the curve; `None` outside (beyond `extrapolate`)."""
        usable = self.usable()
        if entropy is None or not usable or not math.isfinite(entropy):
            return None
        return gen_ppl_on_curve(
            [run.entropy for _, run in usable], [run.gen_ppl for _, run in usable], entropy, self.extrapolate
        )

    def objective(self, run: BankRun) -> float | None:
        """`log GenPPL(run) − log GenPPL_official(entropy of run)`; `None` outside the curve or for a non-finite run."""
        reference = self.reference(run.entropy)
        if reference is None or not (math.isfinite(run.gen_ppl) and run.gen_ppl > 0):
            return None
        return math.log(run.gen_ppl) - math.log(reference)

    def record(self) -> dict:
        return {
            "knob": self.knob,
            "points": [{self.knob: v, **r.scores()} for v, r in zip(self.values, self.runs, strict=True)],
            "entropy_range": list(self.entropy_range()),
            "extrapolate": self.extrapolate,
        }


@dataclass
class Candidate:
    """One scored setting: its knob values, the run and the objective (`None`: outside the curve)."""

    knobs: dict
    run: BankRun
    objective: float | None
    phase: str

    def record(self, curve: OfficialCurve) -> dict:
        return {
            **self.knobs,
            **self.run.scores(),
            "official_gen_ppl_at_entropy": curve.reference(self.run.entropy),
            "objective": self.objective,
            "phase": self.phase,
        }


@dataclass
class SearchResult:
    """The search of one method at one NFE (module docstring): `comparison` is the keep test's reading of the pick
    (`None` without one); `entropy_matching` the diversity knob's value at official's entropy, where `untied-sc tune`
    set it ([`EntropyMatch`])."""

    method: str
    num_inference_steps: int
    knobs: tuple[Knob, ...]
    curve: OfficialCurve
    budget: int
    start: dict
    candidates: list[Candidate]
    best: Candidate | None
    edges: dict[str, str]
    comparison: EntropyRatio | None
    kept: bool
    chosen: dict
    confidence: float = TUNE_CONFIDENCE
    entropy_matching: EntropyMatch | None = None

    @property
    def outcome(self) -> str:
        if self.best is None:
            return "no candidate inside the official curve"
        return "accepted" if self.kept else "no win at equal entropy beyond noise"

    def record(self) -> dict:
        """Plain JSON: the rule, the budget, the official curve, every candidate, the pick, its edges, the keep test."""
        return {
            "rule": RULE,
            "budget": self.budget,
            "candidates_tried": len(self.candidates),
            "knobs": {knob.name: knob.why for knob in self.knobs},
            "start": dict(self.start),
            "official_curve": self.curve.record(),
            "candidates": [candidate.record(self.curve) for candidate in self.candidates],
            "best": None if self.best is None else self.best.record(self.curve),
            "edges": dict(self.edges),
            "on_edge": any(state.startswith("edge") for state in self.edges.values()),
            "best_vs_official": None if self.comparison is None else self.comparison.to_json(),
            "confidence": self.confidence,
            "outcome": self.outcome,
            "chosen": dict(self.chosen),
            **({} if self.entropy_matching is None else {"entropy_matching": self.entropy_matching.to_json()}),
        }


RULE = (
    "coordinate search (strengths ×0, ×½, ×2 until a round changes nothing, then ×√½, ×√2; choices: every value; a "
    "line whose best is its largest or smallest value tried is extended unless that is a hard limit) within the "
    "budget of scored candidates per NFE; objective log GenPPL − log GenPPL_official at the candidate's entropy on "
    "official's temperature curve on the bank (two-sided; no reading beyond the curve's ends ± extrapolate nats); "
    "kept only if the equal-entropy ratio's cluster bootstrap interval on the bank lies below 1, else neutral"
)


def _key(knobs: Mapping) -> tuple:
    return tuple(sorted((k, round(v, 12) if isinstance(v, float) else v) for k, v in knobs.items()))


def _better(candidate: Candidate, best: Candidate) -> bool:
    if candidate.objective is None:
        return False
    return best.objective is None or candidate.objective < best.objective


def _on_line(candidate: Candidate, best: Mapping, name: str) -> bool:
    return all(candidate.knobs[k] == v for k, v in best.items() if k != name)


def knob_edges(knobs: Sequence[Knob], best: Mapping, candidates: Sequence[Candidate]) -> dict[str, str]:
    """Where the pick lies on each knob's line (the other knobs at the pick's values). A scale knob is `interior`
    (values on both sides were scored inside the curve; `interior (on an earlier line)` where a side was scored only
    while another knob had a value the pick no longer has), at a `hard limit` (the knob cannot pass that side), at a
    `curve limit` (the next value tried fell outside the official curve) or on an `edge (budget spent)`; a choice knob
    is `every value` once all were tried on the pick's line, `every value (on an earlier line)` once all were tried
    but some only while another knob had a value the pick no longer has (a later step moved that knob), else on an
    `edge (budget spent)`."""
    edges = {}
    for knob in knobs:
        line = [c for c in candidates if _on_line(c, best, knob.name)]
        if knob.kind == "choice":
            everywhere = {c.knobs[knob.name] for c in candidates}
            if set(knob.choices) <= {c.knobs[knob.name] for c in line}:
                edges[knob.name] = "every value"
            elif set(knob.choices) <= everywhere:
                edges[knob.name] = "every value (on an earlier line)"
            else:
                edges[knob.name] = "edge (budget spent)"
            continue
        x = knob.to_search(best[knob.name])
        sides = []
        for below, limit in ((True, knob.lowest()), (False, knob.upper)):
            beyond = [
                c
                for c in line
                if (knob.to_search(c.knobs[knob.name]) < x if below else knob.to_search(c.knobs[knob.name]) > x)
            ]
            earlier = [
                c
                for c in candidates
                if c.objective is not None
                and (knob.to_search(c.knobs[knob.name]) < x if below else knob.to_search(c.knobs[knob.name]) > x)
            ]
            if limit is not None and math.isclose(x, limit, abs_tol=1e-12):
                sides.append("hard limit")
            elif any(c.objective is not None for c in beyond):
                sides.append("interior")
            elif beyond:
                sides.append("curve limit")
            elif earlier:  # tried beyond, with another knob at a value the pick no longer has
                sides.append("interior (on an earlier line)")
            else:
                sides.append("edge (budget spent)")
        order = ("edge (budget spent)", "curve limit", "hard limit", "interior (on an earlier line)", "interior")
        edges[knob.name] = min(sides, key=order.index)
    return edges


def coordinate_search(
    knobs: Sequence[Knob],
    start: Mapping,
    score: Callable[[dict], BankRun],
    curve: OfficialCurve,
    budget: int = TUNE_BUDGET,
) -> tuple[list[Candidate], Candidate | None]:
    """Steps 3-4 of the module docstring: every candidate scored (in order) and the best inside the curve (`None`
    when none is). `score(knobs)` runs the method with the config overrides `knobs` on the bank."""
    if budget < 1:
        raise ValueError(f"The budget must be at least 1 candidate, got {budget}.")
    scored: dict[tuple, Candidate] = {}

    def evaluate(values: dict, phase: str) -> Candidate | None:
        key = _key(values)
        if key not in scored:
            if len(scored) >= budget:
                return None
            run = score(dict(values))
            scored[key] = Candidate(dict(values), run, curve.objective(run), phase)
        return scored[key]

    best = evaluate(dict(start), "start")
    for phase, factors in (("coarse", COARSE_FACTORS), ("fine", FINE_FACTORS)):
        changed = True
        while changed and len(scored) < budget:
            changed = False
            for knob in knobs:
                line_start = best
                if knob.kind == "choice":
                    proposals = [c for c in knob.choices if c != best.knobs[knob.name]] if phase == "coarse" else []
                    for value in proposals:
                        candidate = evaluate({**best.knobs, knob.name: value}, phase)
                        if candidate is not None and _better(candidate, best):
                            best = candidate
                else:
                    best = _line_search(knob, best, factors, phase, evaluate)
                changed = changed or best is not line_start
    inside = [c for c in scored.values() if c.objective is not None]
    return list(scored.values()), (min(inside, key=lambda c: c.objective) if inside else None)


def _line_search(knob: Knob, best: Candidate, factors, phase: str, evaluate) -> Candidate:
    """One scale knob around `best`: the phase's factors, then extensions while the best is the line's end."""
    x0 = knob.to_search(best.knobs[knob.name])
    tried = {x0}
    for factor in factors:
        x = knob.step(x0, factor)
        if x is None or any(math.isclose(x, t, abs_tol=1e-12) for t in tried):
            continue
        tried.add(x)
        candidate = evaluate({**best.knobs, knob.name: knob.to_config(x)}, phase)
        if candidate is not None and _better(candidate, best):
            best = candidate
    step = max(factors)
    while True:  # the extension: the best is the largest (smallest) value tried, and the knob can go further
        x = knob.to_search(best.knobs[knob.name])
        if x == 0:
            return best
        if x >= max(tried):
            nxt = knob.step(x, step)
        elif x <= min(tried):
            nxt = knob.step(x, 1 / step)
        else:
            return best
        if nxt is None or any(math.isclose(nxt, t, abs_tol=1e-12) for t in tried):
            return best
        tried.add(nxt)
        candidate = evaluate({**best.knobs, knob.name: knob.to_config(nxt)}, "extension")
        if candidate is None or not _better(candidate, best):
            return best
        best = candidate


def keep_test(
    best: Candidate | None, curve: OfficialCurve, clusters: Sequence | None, confidence: float = TUNE_CONFIDENCE
) -> tuple[EntropyRatio | None, bool]:
    """Step 5: the pick's equal-entropy ratio against the official curve on the bank, with its cluster bootstrap
    interval (generator 0: the decision is a function of the scores); kept when the interval lies below 1."""
    if best is None:
        return None, False
    comparison = equal_entropy_ratio(
        [best.run.samples()],
        [[run.samples()] for _, run in curve.usable()],
        clusters,
        confidence=confidence,
        generator=0,
        extrapolate=curve.extrapolate,
    )
    return comparison, comparison.ratio_ci is not None and comparison.ratio_ci[1] < 1


def tune_method(
    method: str,
    num_inference_steps: int,
    start: Mapping,
    score: Callable[[dict], BankRun],
    curve: OfficialCurve,
    budget: int = TUNE_BUDGET,
    clusters: Sequence | None = None,
    confidence: float = TUNE_CONFIDENCE,
    knobs: Sequence[Knob] | None = None,
) -> SearchResult:
    """The whole rule for one method at one NFE: the search, the edges, the keep test, the chosen knob values (the
    pick if kept, else `start` with the method's neutral values)."""
    knobs = tuple(METHOD_KNOBS[method] if knobs is None else knobs)
    missing = [knob.name for knob in knobs if knob.name not in start]
    if missing:
        raise ValueError(f"The start of {method} gives no value for {missing}.")
    candidates, best = coordinate_search(knobs, start, score, curve, budget)
    edges = knob_edges(knobs, best.knobs, candidates) if best is not None else {}
    comparison, kept = keep_test(best, curve, clusters, confidence)
    chosen = dict(best.knobs) if kept else {**dict(start), **NEUTRAL[method]}
    return SearchResult(
        method,
        num_inference_steps,
        knobs,
        curve,
        budget,
        dict(start),
        candidates,
        best,
        edges,
        comparison,
        kept,
        chosen,
        confidence,
    )


_MATCHING = "entropy-matching record"  # how a missing field's error names the record


@dataclass(frozen=True)
class MatchRun:
    """One run of the entropy matching: the diversity knob's `value` and the bank's GenPPL and entropy there."""

    value: float
    gen_ppl: float
    entropy: float | None

    @classmethod
    def from_json(cls, data: Mapping, where: str = "an entropy-matching run") -> MatchRun:
        return cls(*(require(data, name, _MATCHING, where) for name in ("value", "gen_ppl", "entropy")))

    def to_json(self) -> dict:
        return {"value": self.value, "gen_ppl": self.gen_ppl, "entropy": self.entropy}


@dataclass(frozen=True)
class EntropyMatch:
    """
    The diversity knob's value at which a sampler runs at official's entropy on the bank ([`match_entropy`]), as the
    tuning record's `entropy_matching` holds it.

    Args:
        knob (`str`): the diversity knob.
        value (`float`, *optional*): the measured value closest to the target (6 decimals); `None` when even the
            closest is no nearer than the knob's default (the knob cannot reach the target).
        target_entropy (`float`): official's entropy.
        runs (`tuple[MatchRun, ...]`): the runs the matching scored (the default's own run is not one).
        entropy (`float`, *optional*), gen_ppl (`float`, *optional*): the sampler's at `value` (at the default where
            `value` is `None`); `None` where no step was tried.
        tolerance (`float`, *optional*): the nats within which the steps stop; `None` where no step was tried (the
            run at the default has no entropy, or official's entropy does not rise with the knob), and then the record
            holds only `knob`, `value`, `target_entropy` and `runs`.
    """

    knob: str
    value: float | None
    target_entropy: float
    runs: tuple[MatchRun, ...] = ()
    entropy: float | None = None
    gen_ppl: float | None = None
    tolerance: float | None = None

    @classmethod
    def from_json(cls, data: Mapping, where: str = "entropy_matching") -> EntropyMatch:
        def need(name: str):
            return require(data, name, _MATCHING, where)

        runs = tuple(MatchRun.from_json(run, f"{where}.runs[{i}]") for i, run in enumerate(need("runs")))
        tried = {} if "tolerance" not in data else {name: need(name) for name in ("entropy", "gen_ppl", "tolerance")}
        return cls(need("knob"), need("value"), need("target_entropy"), runs, **tried)

    def to_json(self) -> dict:
        runs = [run.to_json() for run in self.runs]
        if self.tolerance is None:
            return {"knob": self.knob, "value": self.value, "target_entropy": self.target_entropy, "runs": runs}
        return {
            "knob": self.knob,
            "value": self.value,
            "entropy": self.entropy,
            "gen_ppl": self.gen_ppl,
            "target_entropy": self.target_entropy,
            "tolerance": self.tolerance,
            "runs": runs,
        }


def match_entropy(
    score: Callable[[float], BankRun],
    target: float,
    first: tuple[float, BankRun],
    slope: float,
    lowest: float,
    tolerance: float = 0.002,
    max_runs: int = 3,
    *,
    knob: str,
) -> EntropyMatch:
    """The value of the diversity `knob` at which a sampler runs at the `target` entropy (official's), on the bank.

    Secant steps from `first` (the knob's default and the sampler's run there), the first step along `slope` (official's
    entropy per unit of the knob, from its curve); at most `max_runs` runs, stopping within `tolerance` nats. The knob
    stays ≥ `lowest`. Returns the measured value closest to the target and every run ([`EntropyMatch`]).
    """
    points = [first]
    if first[1].entropy is None or slope <= 0:
        return EntropyMatch(knob, None, target)
    for _ in range(max_runs):
        (v1, r1) = points[-1]
        if abs(r1.entropy - target) <= tolerance:
            break
        if len(points) >= 2:
            v0, r0 = points[-2]
            local = (r1.entropy - r0.entropy) / (v1 - v0) if v1 != v0 else slope
            slope_now = local if local > 0 else slope
        else:
            slope_now = slope
        value = max(lowest, v1 + (target - r1.entropy) / slope_now)
        if any(math.isclose(value, v, abs_tol=1e-9) for v, _ in points):
            break
        points.append((value, score(value)))
    value, run = min(points, key=lambda p: abs(p[1].entropy - target) if p[1].entropy is not None else math.inf)
    improved = value != first[0] and abs(run.entropy - target) < abs(first[1].entropy - target)
    at = run if improved else first[1]
    return EntropyMatch(
        knob,
        round(value, 6) if improved else None,
        target,
        tuple(MatchRun(v, r.gen_ppl, r.entropy) for v, r in points[1:]),
        at.entropy,
        at.gen_ppl,
        tolerance,
    )


def curve_slope(curve: OfficialCurve) -> float:
    """Official's entropy per unit of the knob around its default (the two nearest points on each side, or one)."""
    default = KNOB_DEFAULTS[curve.knob]
    points = sorted((v, r.entropy) for v, r in curve.usable())
    below = [p for p in points if p[0] < default]
    above = [p for p in points if p[0] > default]
    here = [p for p in points if p[0] == default]
    a = below[-1] if below else here[0]
    b = above[0] if above else here[0]
    return (b[1] - a[1]) / (b[0] - a[0]) if b[0] != a[0] else 0.0
