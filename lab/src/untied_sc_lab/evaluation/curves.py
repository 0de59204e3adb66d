"""The equal-entropy control: a sampler's GenPPL against the baseline's GenPPL–entropy curve at the same entropy.

The baseline (official) sampler is run at several values of a diversity knob (LangFlow: the x̂ temperature; ELF: the
decode temperature), which traces GenPPL against entropy. A candidate sampler at entropy h is compared with that curve
read at h.

The fit: a monotone cubic Hermite interpolant (Fritsch–Carlson / PCHIP, [`monotone_cubic`]) of log-GenPPL against
entropy through the measured points. Why this one:

- the measured curves are convex (GenPPL rises faster and faster with entropy); a straight line between two points
  lies above a convex curve, so linear interpolation overstates the baseline between its points and biases every
  ratio low. A cubic through the points bends with its neighbours;
- it is monotone wherever the measured points are (it never invents a dip or a bump between two points, as a global
  polynomial can), and it passes through every measured point, so there is no model error at the points themselves;
  their measurement noise is carried by the bootstrap instead;
- it never extrapolates: outside the measured entropy range the answer is "outside the curve's range".

The interval resamples the whole curve with the same clusters as the candidate ([`equal_entropy_ratio`]): every series
of one seed shares its samples' initial latents and random streams, so one set of cluster weights is applied to the
candidate and to every point of the curve, and the curve is re-fitted on each resample. Per-sample entropies are
resampled with the NLLs when the run records hold them; records that hold only each run's mean entropy keep it at its
measured value (the report says which).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .aggregates import listed
from .statistics import cluster_resample_weights, percentile_interval


FIT_DESCRIPTION = (
    "monotone cubic Hermite interpolation (PCHIP, Fritsch–Carlson) of log-GenPPL against entropy through the measured "
    "points; no extrapolation"
)


def _pchip_slopes(x: Sequence[float], y: Sequence[float]) -> list[float]:
    """Node derivatives of the Fritsch–Carlson monotone cubic: weighted harmonic means of the neighbouring secants
    (0 where they change sign), and shape-preserving three-point estimates at the two ends."""
    h = [x[i + 1] - x[i] for i in range(len(x) - 1)]
    delta = [(y[i + 1] - y[i]) / h[i] for i in range(len(h))]
    if len(h) == 1:
        return [delta[0], delta[0]]
    slopes = [0.0] * len(x)
    for k in range(1, len(x) - 1):
        if delta[k - 1] * delta[k] > 0:
            w1, w2 = 2 * h[k] + h[k - 1], h[k] + 2 * h[k - 1]
            slopes[k] = (w1 + w2) / (w1 / delta[k - 1] + w2 / delta[k])

    def end(h0: float, h1: float, d0: float, d1: float) -> float:
        slope = ((2 * h0 + h1) * d0 - h0 * d1) / (h0 + h1)
        if slope * d0 <= 0:
            return 0.0
        if d0 * d1 < 0 and abs(slope) > 3 * abs(d0):
            return 3 * d0
        return slope

    slopes[0] = end(h[0], h[1], delta[0], delta[1])
    slopes[-1] = end(h[-1], h[-2], delta[-1], delta[-2])
    return slopes


def monotone_cubic(x: Sequence[float], y: Sequence[float], at: float, extrapolate: float = 0.0) -> float | None:
    """The monotone cubic Hermite interpolant (PCHIP) of the points `(x, y)`, evaluated at `at`.

    Points are sorted by x; points with equal x are merged (their y averaged). Two points give the straight line
    between them; one point gives its y at its x only. `None` outside `[min x − extrapolate, max x + extrapolate]`;
    within `extrapolate` of an end the value lies on the end's tangent (the interpolant's slope there; on a convex
    curve the tangent lies below it, so a reference read there errs against the candidate). By default nothing is
    extrapolated. E.g. through y = x² at x = 0, 1, 2, 3 the value at 1.5 is 2.21875 (the truth 2.25, the chord 2.5).
    """
    if len(x) != len(y) or not x:
        raise ValueError(f"`x` and `y` must be non-empty and of equal length, got {len(x)} and {len(y)}.")
    merged: dict[float, list[float]] = {}
    for xi, yi in zip(x, y, strict=True):
        merged.setdefault(float(xi), []).append(float(yi))
    if extrapolate < 0:
        raise ValueError(f"`extrapolate` must be ≥ 0, got {extrapolate}.")
    xs = sorted(merged)
    ys = [sum(merged[v]) / len(merged[v]) for v in xs]
    if not xs[0] - extrapolate <= at <= xs[-1] + extrapolate or any(math.isnan(v) for v in ys):
        return None
    if len(xs) == 1:
        return ys[0] if at == xs[0] else None
    slopes = _pchip_slopes(xs, ys)
    if at < xs[0]:
        return ys[0] + slopes[0] * (at - xs[0])
    if at > xs[-1]:
        return ys[-1] + slopes[-1] * (at - xs[-1])
    k = next(i for i in range(len(xs) - 1) if at <= xs[i + 1])
    h = xs[k + 1] - xs[k]
    t = (at - xs[k]) / h
    h00, h10 = (1 + 2 * t) * (1 - t) ** 2, t * (1 - t) ** 2
    h01, h11 = t * t * (3 - 2 * t), t * t * (t - 1)
    return h00 * ys[k] + h10 * h * slopes[k] + h01 * ys[k + 1] + h11 * h * slopes[k + 1]


def gen_ppl_on_curve(
    entropies: Sequence[float], gen_ppls: Sequence[float], entropy: float, extrapolate: float = 0.0
) -> float | None:
    """GenPPL of a curve at `entropy` ([`monotone_cubic`] in log-GenPPL); `None` outside the measured range widened
    by `extrapolate` nats on each side (read on the end's tangent there)."""
    value = monotone_cubic(list(entropies), [math.log(p) for p in gen_ppls], entropy, extrapolate)
    return None if value is None else math.exp(value)


@dataclass
class RunSamples:
    """One run's per-sample records (one seed): `nll_sum`, `num_tokens` and, when recorded, per-sample `entropy`
    (`None` entries for samples without one). `run_entropy` is the run's own mean entropy (used when `entropy` is
    absent)."""

    nll_sum: Sequence[float]
    num_tokens: Sequence[float]
    entropy: Sequence[float | None] | None
    run_entropy: float


def _series(runs: Sequence[RunSamples], weights: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """(R,) GenPPL (mean over seeds of each seed's pooled GenPPL) and (R,) entropy (mean over seeds of the weighted
    mean per-sample entropy) under per-seed resample weights; the flag says whether entropies were resampled."""
    ppl, entropy, resampled = [], [], True
    for run, w in zip(runs, weights, strict=True):
        nll = torch.as_tensor(run.nll_sum, dtype=torch.float64)
        tokens = torch.as_tensor(run.num_tokens, dtype=torch.float64)
        ppl.append(((w @ nll) / (w @ tokens).clamp(min=1e-12)).exp())
        if run.entropy is None:
            resampled = False
            entropy.append(torch.full((w.shape[0],), float(run.run_entropy), dtype=torch.float64))
            continue
        values = torch.tensor([math.nan if e is None else float(e) for e in run.entropy], dtype=torch.float64)
        finite = ~values.isnan()
        entropy.append((w[:, finite] @ values[finite]) / w[:, finite].sum(dim=1))
    return torch.stack(ppl).mean(0), torch.stack(entropy).mean(0), resampled


@dataclass(frozen=True)
class EntropyRatio:
    """
    A candidate's GenPPL over the baseline curve's at the candidate's entropy ([`equal_entropy_ratio`]).

    Args:
        entropy (`float`), gen_ppl (`float`): the candidate's.
        baseline_gen_ppl_at_entropy (`float`, *optional*): the curve's GenPPL there; `None` outside its range.
        ratio (`float`, *optional*): `gen_ppl` over it; `None` outside.
        ratio_ci (`tuple[float, float]`, *optional*): its interval; `None` when more than (1 - c)/2 of the resamples
            fall outside the curve's range, since one tail of the interval is then unknown.
        fraction_outside (`float`): the fraction of the resamples outside the curve's range.
        entropy_resampled (`bool`): whether the per-sample entropies were resampled with the NLLs.
    """

    entropy: float
    gen_ppl: float
    baseline_gen_ppl_at_entropy: float | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    fraction_outside: float
    entropy_resampled: bool

    def to_json(self) -> dict:
        """The reading as a tuning record's `best_vs_official` holds it: the readings, the ratio and its interval (a
        list), and the fraction outside; the record has no `entropy_resampled`."""
        return {
            "entropy": self.entropy,
            "gen_ppl": self.gen_ppl,
            "baseline_gen_ppl_at_entropy": self.baseline_gen_ppl_at_entropy,
            "ratio": self.ratio,
            "ratio_ci": listed(self.ratio_ci),
            "fraction_outside": self.fraction_outside,
        }


def _interval(boot: torch.Tensor, inside: bool, outside: float, confidence: float) -> tuple[float, float] | None:
    """The percentile interval of the finite resampled ratios `boot` (NaN: outside a range); `None` when the estimate
    lies outside (`inside` false) or more than (1 - c)/2 of the resamples do (one tail is then unknown)."""
    if not inside or outside > (1 - confidence) / 2:
        return None
    return percentile_interval(boot[~boot.isnan()], confidence)


def equal_entropy_ratio(
    candidate: Sequence[RunSamples],
    curve: Sequence[Sequence[RunSamples]],
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = 0,
    extrapolate: float = 0.0,
) -> EntropyRatio:
    """The candidate's GenPPL over the baseline curve's GenPPL at the candidate's entropy, with a cluster bootstrap
    interval that re-fits the curve on every resample.

    Args:
        candidate (sequence over seeds of [`RunSamples`]): the candidate sampler's runs, one per seed.
        curve (sequence over knob values of sequences over seeds of [`RunSamples`]): the baseline's runs at each knob
            value, the same seeds in the same order; sample i of every run of one seed is matched.
        clusters (`Sequence`, *optional*): the resampling unit of sample i (the same in every seed, e.g. its batch
            index for ELF; by default `i` itself, as for LangFlow); clusters are resampled within each seed.
        num_resamples, confidence, generator: as in [`bootstrap_ci`].
        extrapolate (`float`, defaults to 0): nats beyond the curve's measured entropies read on its end tangent
            ([`monotone_cubic`]); further out a ratio is `None`.

    Returns:
        [`EntropyRatio`].
    """
    seeds = len(candidate)
    sizes = [len(run.nll_sum) for run in candidate]
    clusters = range(sizes[0]) if clusters is None else clusters
    if not curve or any(len(point) != seeds for point in curve):
        raise ValueError(f"Every curve point needs the candidate's {seeds} seeds.")
    for run in [*candidate, *(r for point in curve for r in point)]:
        if len(run.nll_sum) != len(clusters) or len(run.num_tokens) != len(run.nll_sum):
            raise ValueError(f"Every run needs {len(clusters)} per-sample records (one per cluster label).")
    if len(set(sizes)) != 1:
        raise ValueError(f"Runs of different sizes {sizes}.")
    labels = [(seed, label) for seed in range(seeds) for label in clusters]
    strata = [seed for seed in range(seeds) for _ in clusters]
    all_weights = cluster_resample_weights(labels, num_resamples, generator, strata)
    per_seed = list(all_weights.split(sizes, dim=1))
    ones = [torch.ones(1, n, dtype=torch.float64) for n in sizes]

    def ratios(weights: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
        ppl, entropy, resampled = _series(candidate, weights)
        nodes = [_series(point, weights) for point in curve]
        resampled = resampled and all(flag for _, _, flag in nodes)
        reference = []
        for r in range(ppl.shape[0]):
            value = gen_ppl_on_curve(
                [float(e[r]) for _, e, _ in nodes], [float(p[r]) for p, _, _ in nodes], float(entropy[r]), extrapolate
            )
            reference.append(math.nan if value is None else value)
        reference = torch.tensor(reference, dtype=torch.float64)
        return ppl, entropy, reference, resampled

    ppl, entropy, reference, resampled = ratios(ones)
    ppl, entropy, reference = float(ppl[0]), float(entropy[0]), float(reference[0])
    estimates = ratios(per_seed)
    boot = estimates[0] / estimates[2]
    outside = float(boot.isnan().double().mean())
    inside = math.isfinite(reference)
    return EntropyRatio(
        entropy,
        ppl,
        reference if inside else None,
        ppl / reference if inside else None,
        _interval(boot, inside, outside, confidence),
        outside,
        resampled,
    )


def _check_runs(groups: Sequence[Sequence[RunSamples]], clusters: Sequence) -> None:
    seeds = len(groups[0])
    for group in groups:
        if len(group) != seeds:
            raise ValueError(f"Every series needs the reference's {seeds} seeds, got {len(group)}.")
        for run in group:
            if len(run.nll_sum) != len(clusters) or len(run.num_tokens) != len(run.nll_sum):
                raise ValueError(f"Every run needs {len(clusters)} per-sample records (one per cluster label).")


def _read_frontier(nodes, entropy: torch.Tensor, extrapolate: float) -> torch.Tensor:
    """GenPPL of the frontier `nodes` (per point: (R,) GenPPL, (R,) entropy, flag) at `entropy` (R,), NaN outside."""
    values = []
    for r in range(entropy.shape[0]):
        value = gen_ppl_on_curve(
            [float(e[r]) for _, e, _ in nodes], [float(p[r]) for p, _, _ in nodes], float(entropy[r]), extrapolate
        )
        values.append(math.nan if value is None else value)
    return torch.tensor(values, dtype=torch.float64)


@dataclass(frozen=True)
class FrontierReading:
    """
    Two frontiers read at a reference run's entropy ([`frontier_ratio`]).

    Args:
        entropy (`float`): the reference's entropy, where both are read.
        gen_ppl (`float`, *optional*): the numerator frontier's GenPPL there; `None` outside its range.
        reference_gen_ppl (`float`, *optional*): the denominator frontier's (or the reference's own); `None` outside.
        ratio (`float`, *optional*): the one over the other; `None` where either is outside.
        ratio_ci, fraction_outside, entropy_resampled: as in [`EntropyRatio`].
    """

    entropy: float
    gen_ppl: float | None
    reference_gen_ppl: float | None
    ratio: float | None
    ratio_ci: tuple[float, float] | None
    fraction_outside: float
    entropy_resampled: bool


def frontier_ratio(
    numerator: Sequence[Sequence[RunSamples]],
    reference: Sequence[RunSamples],
    denominator: Sequence[Sequence[RunSamples]] | None = None,
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = 0,
    extrapolate: float = 0.0,
) -> FrontierReading:
    """Two samplers compared at the entropy of a reference run, each read on its own frontier: the GenPPL of the
    `numerator` frontier at the reference's entropy over that of the `denominator` frontier there (by default the
    reference's own GenPPL), with a cluster bootstrap interval that re-fits both frontiers on every resample.

    A frontier is a sampler's runs at several values of the diversity knob (its tuned setting among them): sequences
    over points of sequences over seeds of [`RunSamples`], the reference's seeds in the same order (sample i of every
    run of one seed is matched, so one set of cluster weights serves every run).

    Args:
        numerator, denominator: the two frontiers (`denominator=None`: the reference run itself).
        reference (sequence over seeds of [`RunSamples`]): the run whose entropy both are read at (the official
            sampler's main run: "at official's entropy").
        clusters, num_resamples, confidence, generator, extrapolate: as in [`equal_entropy_ratio`].

    Returns:
        [`FrontierReading`].
    """
    sizes = [len(run.nll_sum) for run in reference]
    if not numerator or (denominator is not None and not denominator):
        raise ValueError("A frontier needs at least one point.")
    if len(set(sizes)) != 1:
        raise ValueError(f"Runs of different sizes {sizes}.")
    clusters = range(sizes[0]) if clusters is None else clusters
    _check_runs([reference, *numerator, *(denominator or [])], clusters)
    seeds = len(reference)
    labels = [(seed, label) for seed in range(seeds) for label in clusters]
    strata = [seed for seed in range(seeds) for _ in clusters]
    per_seed = list(cluster_resample_weights(labels, num_resamples, generator, strata).split(sizes, dim=1))
    ones = [torch.ones(1, n, dtype=torch.float64) for n in sizes]

    def evaluate(weights):
        reference_ppl, entropy, resampled = _series(reference, weights)
        top_nodes = [_series(point, weights) for point in numerator]
        top = _read_frontier(top_nodes, entropy, extrapolate)
        bottom_nodes = [] if denominator is None else [_series(point, weights) for point in denominator]
        bottom = reference_ppl if denominator is None else _read_frontier(bottom_nodes, entropy, extrapolate)
        resampled = resampled and all(flag for _, _, flag in (*top_nodes, *bottom_nodes))
        return top, bottom, entropy, resampled

    top, bottom, entropy, resampled = evaluate(ones)
    top, bottom, entropy = float(top[0]), float(bottom[0]), float(entropy[0])
    boot_top, boot_bottom, _, _ = evaluate(per_seed)
    boot = boot_top / boot_bottom
    outside = float(boot.isnan().double().mean())
    inside = math.isfinite(top) and math.isfinite(bottom)
    return FrontierReading(
        entropy,
        top if math.isfinite(top) else None,
        bottom if math.isfinite(bottom) else None,
        top / bottom if inside else None,
        _interval(boot, inside, outside, confidence),
        outside,
        resampled,
    )
