"""Uncertainty of the reported numbers: mean ± standard error, a (cluster) percentile bootstrap, paired comparisons.

The bootstrap resamples the unit of randomness that samples share ([`cluster_resample_weights`]): samples drawn with
one random time grid (an ELF batch) are not independent, and resampling them one by one makes intervals too narrow. Every
interval here takes `clusters` (one label per observation; `None`: every observation is its own cluster) and `strata`
(e.g. the seed: clusters are redrawn within each stratum, so every stratum keeps its size in expectation).

With few clusters (a dozen ELF time grids) a percentile bootstrap is too narrow: [`ratio_difference_intervals`] gives
the t-interval and the studentized bootstrap of a ratio of sums (or a difference of two: the log GenPPL ratio) over
clusters, [`cluster_mean_intervals`] those of a pooled mean, and [`headline_interval`] picks the reported one
(t-interval below [`SMALL_SAMPLE_CLUSTERS`] clusters).

No function touches the global RNG: every random draw takes a `torch.Generator` or an integer seed (`None` means seed
0, so results are reproducible by default).
"""

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


def _as_generator(generator: torch.Generator | int | None) -> torch.Generator:
    if isinstance(generator, torch.Generator):
        return generator
    return torch.Generator().manual_seed(0 if generator is None else int(generator))


def _as_vector(values, name: str = "values") -> torch.Tensor:
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim != 1 or values.numel() == 0:
        raise ValueError(f"`{name}` must be a non-empty 1-D sequence of numbers, got shape {tuple(values.shape)}.")
    return values


def percentile_interval(estimates: torch.Tensor, confidence: float = 0.95) -> tuple[float, float]:
    """The (1 - c)/2 and (1 + c)/2 quantiles of bootstrap `estimates` (linear interpolation)."""
    tail = (1 - confidence) / 2
    low, high = torch.quantile(estimates.double(), torch.tensor([tail, 1 - tail], dtype=torch.float64))
    return float(low), float(high)


def cluster_resample_weights(
    clusters: Sequence,
    num_resamples: int = 1000,
    generator: torch.Generator | int | None = None,
    strata: Sequence | None = None,
) -> torch.Tensor:
    """Weights of a stratified cluster bootstrap: row r gives every observation the number of times its cluster was
    drawn in resample r.

    Within each stratum, the C clusters found there are drawn C times with replacement; an observation's weight is its
    cluster's count. With one observation per cluster this is the ordinary (pair) bootstrap. Statistics are then
    weighted sums (a weighted mean is a mean over the resampled observations).

    Args:
        clusters (`Sequence`): one hashable label per observation (e.g. `(seed, batch)`); equal labels in one stratum
            are one cluster.
        num_resamples (`int`, defaults to 1000): rows of the result.
        generator (`torch.Generator` or `int`, *optional*): an int is a seed, `None` is seed 0.
        strata (`Sequence`, *optional*): one label per observation; clusters are resampled within each stratum.

    Returns:
        `torch.Tensor` of shape `(num_resamples, len(clusters))`, float64.
    """
    labels = list(clusters)
    if not labels:
        raise ValueError("`clusters` must label at least one observation.")
    if num_resamples < 1:
        raise ValueError(f"`num_resamples` must be at least 1, got {num_resamples}.")
    strata = [None] * len(labels) if strata is None else list(strata)
    if len(strata) != len(labels):
        raise ValueError(f"`strata` has {len(strata)} labels for {len(labels)} observations.")
    index: dict = {}  # (stratum, cluster) -> column of `counts`, in order of first appearance
    by_stratum: dict = {}
    columns = []
    for stratum, label in zip(strata, labels, strict=True):
        key = (stratum, label)
        if key not in index:
            index[key] = len(index)
            by_stratum.setdefault(stratum, []).append(index[key])
        columns.append(index[key])
    generator = _as_generator(generator)
    counts = torch.zeros(num_resamples, len(index), dtype=torch.float64)
    for members in by_stratum.values():
        draws = torch.randint(len(members), (num_resamples, len(members)), generator=generator)
        drawn = torch.zeros(num_resamples, len(members), dtype=torch.float64)
        drawn.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64))
        counts[:, members] = drawn
    return counts[:, columns]


def mean_and_standard_error(values) -> tuple[float, float]:
    """Mean and standard error s / √n of `values` (s the sample standard deviation, n - 1 in the denominator).

    The standard error is NaN for a single value. Use it for "mean ± SE over seeds".
    """
    values = _as_vector(values)
    if values.numel() == 1:
        return float(values[0]), float("nan")
    return float(values.mean()), float(values.std(correction=1) / math.sqrt(values.numel()))


def bootstrap_ci(
    values,
    statistic: Callable[[torch.Tensor], torch.Tensor | float] | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
    clusters: Sequence | None = None,
    strata: Sequence | None = None,
) -> tuple[float, float]:
    """Percentile (cluster) bootstrap confidence interval of a statistic of `values`.

    Draws `num_resamples` resamples of the clusters of rows of `values` with replacement
    ([`cluster_resample_weights`]), evaluates the statistic on each and returns its (1 - c)/2 and (1 + c)/2 quantiles
    (linear interpolation), c = `confidence`.

    Args:
        values (array-like of shape `(n,)` or `(n, k)`): observations; rows are resampled together, so paired data
            (e.g. `torch.stack([a, b], dim=1)`) keeps its pairing.
        statistic (`Callable`, *optional*): maps one resample (its rows, each repeated as often as drawn) to a scalar;
            defaults to the mean of a 1-D `values` (vectorised).
        num_resamples (`int`, defaults to 1000): number of bootstrap resamples.
        confidence (`float`, defaults to 0.95): coverage of the interval, in (0, 1).
        generator (`torch.Generator` or `int`, *optional*): source of the resampling; an int is a seed, `None` is 0.
        clusters, strata (`Sequence`, *optional*): one label per row (see [`cluster_resample_weights`]); by default
            every row is its own cluster.

    Returns:
        `(low, high)`.
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError(f"`values` must have at least one row, got shape {tuple(values.shape)}.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    n = values.shape[0]
    clusters = range(n) if clusters is None else clusters
    weights = cluster_resample_weights(clusters, num_resamples, generator, strata)
    if weights.shape[1] != n:
        raise ValueError(f"`clusters` labels {weights.shape[1]} rows, `values` has {n}.")
    if statistic is None:
        if values.ndim != 1:
            raise ValueError("The default statistic (the mean) needs 1-D `values`; pass `statistic` for rows.")
        estimates = (weights @ values) / weights.sum(dim=1)
    else:
        estimates = torch.tensor(
            [float(statistic(values.repeat_interleave(row.long(), dim=0))) for row in weights], dtype=torch.float64
        )
    return percentile_interval(estimates, confidence)


@dataclass
class PairedComparison:
    """Matched samples a (e.g. official) and b (e.g. untied), compared by per-sample NLL; Δ = nll_b - nll_a.

    Attributes:
        num_pairs (`int`): pairs compared (pairs with a NaN on either side are left out).
        fraction_b_worse (`float`): fraction of pairs with Δ > 0 (b's sample scores a higher NLL).
        fraction_tied (`float`): fraction of pairs with Δ = 0.
        mean_delta (`float`): mean Δ (negative: b better on average).
        mean_delta_ci (`tuple[float, float]`): bootstrap CI of the mean Δ.
        fraction_b_worse_ci (`tuple[float, float]`): bootstrap CI of `fraction_b_worse` (same resamples).
        num_dropped (`int`): pairs left out because of a NaN.
    """

    num_pairs: int
    fraction_b_worse: float
    fraction_tied: float
    mean_delta: float
    mean_delta_ci: tuple[float, float]
    fraction_b_worse_ci: tuple[float, float]
    num_dropped: int = 0


def paired_comparison(
    nll_a,
    nll_b,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
    clusters: Sequence | None = None,
    strata: Sequence | None = None,
) -> PairedComparison:
    """Compares matched per-sample NLLs: how often b is worse than a, and by how much on average.

    Pass per-token NLLs (`SampleNLLs.mean_nll`, the log of each sample's perplexity) so that samples of different
    lengths weigh the same. Pair i must come from the same model, grid, initial latent and random stream.

    Args:
        nll_a, nll_b (array-like of shape `(n,)`): per-sample NLLs of the two samplers, in matching order.
        num_resamples, confidence, generator: as in [`bootstrap_ci`]; both intervals use the same resamples.
        clusters, strata (`Sequence`, *optional*): the resampling unit of each pair (e.g. `(seed, batch)` for ELF,
            whose batch shares one time grid) and its stratum, as in [`cluster_resample_weights`]; by default every
            pair is its own cluster.

    Returns:
        [`PairedComparison`].
    """
    nll_a, nll_b = _as_vector(nll_a, "nll_a"), _as_vector(nll_b, "nll_b")
    if nll_a.shape != nll_b.shape:
        raise ValueError(f"Paired NLLs must have the same length, got {nll_a.numel()} and {nll_b.numel()}.")
    n = nll_a.numel()
    clusters = list(range(n)) if clusters is None else list(clusters)
    strata = [None] * n if strata is None else list(strata)
    if len(clusters) != n or len(strata) != n:
        raise ValueError(f"`clusters` and `strata` need one label per pair ({n}), got {len(clusters)}, {len(strata)}.")
    finite = ~(nll_a.isnan() | nll_b.isnan())
    delta = (nll_b - nll_a)[finite]
    if delta.numel() == 0:
        raise ValueError("No pair has a finite NLL on both sides.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    kept = finite.tolist()
    weights = cluster_resample_weights(
        [c for c, keep in zip(clusters, kept, strict=True) if keep],
        num_resamples,
        generator,
        [s for s, keep in zip(strata, kept, strict=True) if keep],
    )
    total = weights.sum(dim=1)
    return PairedComparison(
        num_pairs=delta.numel(),
        fraction_b_worse=float((delta > 0).double().mean()),
        fraction_tied=float((delta == 0).double().mean()),
        mean_delta=float(delta.mean()),
        mean_delta_ci=percentile_interval((weights @ delta) / total, confidence),
        fraction_b_worse_ci=percentile_interval((weights @ (delta > 0).double()) / total, confidence),
        num_dropped=int((~finite).sum()),
    )


# ---- few clusters ----------------------------------------------------------------------------------------------------

# Below this many clusters a report shows the small-sample intervals beside the cluster bootstrap, and the headline
# interval is the t-interval ([`headline_interval`]): a percentile bootstrap over a dozen clusters covers too rarely.
SMALL_SAMPLE_CLUSTERS = 50


def _t_two_sided_mass(t: float, degrees_of_freedom: int) -> float:
    """P(|T| < t) for Student's T with integer `degrees_of_freedom` ν (Abramowitz & Stegun 26.7.3-4): with
    θ = atan(t / √ν), ν odd: (2/π)(θ + sin θ cos θ (1 + 2/3 cos²θ + … )); ν even: sin θ (1 + 1/2 cos²θ + …)."""
    nu = degrees_of_freedom
    theta = math.atan(t / math.sqrt(nu))
    cos2 = math.cos(theta) ** 2
    term, series = 1.0, 1.0
    if nu % 2 == 1:
        for k in range(1, (nu - 1) // 2):  # terms cos^{2k}θ · (2·4···2k) / (3·5···(2k+1))
            term *= cos2 * (2 * k) / (2 * k + 1)
            series += term
        inner = theta + (math.sin(theta) * math.cos(theta) * series if nu > 1 else 0.0)
        return 2 / math.pi * inner
    for k in range(1, nu // 2):  # terms cos^{2k}θ · (1·3···(2k-1)) / (2·4···2k)
        term *= cos2 * (2 * k - 1) / (2 * k)
        series += term
    return math.sin(theta) * series


@functools.lru_cache(maxsize=256)  # a sweep asks for the same few (probability, C - 1) again and again
def student_t_quantile(probability: float, degrees_of_freedom: int) -> float:
    """The `probability` quantile of Student's t with integer `degrees_of_freedom` (≥ 1), by bisection on its exact
    distribution function (e.g. 0.975 with 11 degrees: 2.2010)."""
    if not 0 < probability < 1:
        raise ValueError(f"`probability` must be in (0, 1), got {probability}.")
    if int(degrees_of_freedom) != degrees_of_freedom or degrees_of_freedom < 1:
        raise ValueError(f"`degrees_of_freedom` must be a positive integer, got {degrees_of_freedom}.")
    if probability < 0.5:
        return -student_t_quantile(1 - probability, degrees_of_freedom)
    if degrees_of_freedom > 1000:  # Cornish-Fisher in 1/ν (error far below 1e-9 here): the series grows with ν
        z = float(torch.special.ndtri(torch.tensor(probability, dtype=torch.float64)))
        nu = float(degrees_of_freedom)
        return z + (z**3 + z) / (4 * nu) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * nu**2)
    mass = 2 * probability - 1  # P(|T| < q)
    low, high = 0.0, 1.0
    while _t_two_sided_mass(high, int(degrees_of_freedom)) < mass:
        high *= 2
    for _ in range(200):
        middle = (low + high) / 2
        if _t_two_sided_mass(middle, int(degrees_of_freedom)) < mass:
            low = middle
        else:
            high = middle
        if high - low < 1e-12 * high:
            break
    return (low + high) / 2


def cluster_totals(values, clusters: Sequence) -> tuple[torch.Tensor, list]:
    """Sums the rows of `values` (shape `(n,)` or `(n, k)`) within each cluster: `(totals of shape (C, k), labels)`,
    clusters in order of first appearance."""
    values = torch.as_tensor(values, dtype=torch.float64)
    values = values[:, None] if values.ndim == 1 else values
    labels = list(clusters)
    if len(labels) != values.shape[0]:
        raise ValueError(f"`clusters` labels {len(labels)} rows, `values` has {values.shape[0]}.")
    index: dict = {}
    rows = torch.tensor([index.setdefault(label, len(index)) for label in labels])
    totals = torch.zeros(len(index), values.shape[1], dtype=torch.float64).index_add_(0, rows, values)
    return totals, list(index)


def _ratio_difference(totals: torch.Tensor, counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """θ = Σ y_b / Σ x_b - Σ y_a / Σ x_a over clusters drawn `counts` times, and its linearised standard error.

    `totals` (C, 4) holds each cluster's (y_a, x_a, y_b, x_b); `counts` (R, C) how often each cluster is drawn (a row
    of ones: the data themselves). The estimator is a smooth function of cluster means, so to first order
    θ̂ - θ = (1/C) Σ_c u_c with u_c = (y_b,c - θ_b x_b,c) / x̄_b - (y_a,c - θ_a x_a,c) / x̄_a (x̄ the mean cluster
    denominator), and SE² = Σ_c u_c² / (C (C - 1)) over the C drawn clusters (the u_c of a sample sum to 0).
    Returns (θ, SE), each of shape (R,).
    """
    size = counts.sum(dim=1, keepdim=True)  # clusters drawn: C
    sums = counts @ totals  # (R, 4)
    theta_a, theta_b = sums[:, 0] / sums[:, 1], sums[:, 2] / sums[:, 3]
    mean_a, mean_b = sums[:, 1:2] / size, sums[:, 3:4] / size
    u = (totals[:, 2] - theta_b[:, None] * totals[:, 3]) / mean_b - (
        totals[:, 0] - theta_a[:, None] * totals[:, 1]
    ) / mean_a
    variance = (counts * u**2).sum(dim=1) / (size[:, 0] * (size[:, 0] - 1))
    return theta_b - theta_a, variance.sqrt()


@dataclass
class ClusterIntervals:
    """Small-sample intervals of a statistic over C independent clusters (e.g. ELF time grids).

    Attributes:
        estimate (`float`): the statistic on the data.
        standard_error (`float`): its linearised standard error across clusters ([`ratio_difference_intervals`]).
        num_clusters (`int`): C.
        degrees_of_freedom (`int`): C - 1.
        t_interval (`tuple[float, float]`): estimate ± t_{C-1, (1+c)/2} · SE.
        bootstrap_t_interval (`tuple[float, float]` or `None`): the studentized bootstrap: (estimate - q_hi · SE,
            estimate - q_lo · SE), q the quantiles of t* = (θ* - estimate) / SE* over cluster resamples; `None` with
            fewer than 3 clusters (2 clusters have one informative resample, which reproduces the data).
    """

    estimate: float
    standard_error: float
    num_clusters: int
    degrees_of_freedom: int
    t_interval: tuple[float, float]
    bootstrap_t_interval: tuple[float, float] | None

    def exp(self) -> "ClusterIntervals":
        """The intervals mapped through exp (a log ratio's to the ratio's); the standard error stays on the log
        scale."""
        return ClusterIntervals(
            estimate=math.exp(self.estimate),
            standard_error=self.standard_error,
            num_clusters=self.num_clusters,
            degrees_of_freedom=self.degrees_of_freedom,
            t_interval=_exp_interval(self.t_interval),
            bootstrap_t_interval=_exp_interval(self.bootstrap_t_interval),
        )


def _exp_interval(interval: tuple[float, float] | None) -> tuple[float, float] | None:
    """exp of both ends; an end beyond float range is inf (a t-interval over 2 clusters can reach it)."""
    if interval is None:
        return None
    return tuple(math.exp(end) if end < 709 else math.inf for end in interval)


def ratio_difference_intervals(
    numerators_b,
    denominators_b,
    numerators_a=None,
    denominators_a=None,
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
) -> ClusterIntervals:
    """t-interval and studentized bootstrap (bootstrap-t) of θ = Σ y_b / Σ x_b - Σ y_a / Σ x_a over clusters.

    Observation i contributes y_b = `numerators_b[i]`, x_b = `denominators_b[i]` (and y_a, x_a; without them θ is
    the ratio Σ y_b / Σ x_b alone). The clusters are taken as independent draws (every ELF batch has its own generator
    seed, so the grids of all seeds are one sample of C grids: no strata, C - 1 degrees of freedom). With
    u_c the linearisation of θ̂ at cluster c (see [`_ratio_difference`]), SE² = Σ u_c² / (C (C - 1)) and

    - t-interval: θ̂ ± t_{C-1, (1+c)/2} SE: exact for normal cluster means, and what a sandwich/CR1 interval with
      C - 1 degrees of freedom gives;
    - bootstrap-t (3 clusters or more): C clusters drawn with replacement `num_resamples` times, t*_r = (θ*_r - θ̂) /
      SE*_r (resamples with SE* = 0, which drew one distinct cluster, are left out), interval (θ̂ - q_{(1+c)/2}(t*) SE,
      θ̂ - q_{(1-c)/2}(t*) SE): it follows skew that the t-interval ignores.

    Uses: the log GenPPL ratio candidate / baseline is y = NLL sums, x = token counts (b the candidate); a pooled
    mean of values v is y_b = v, x_b = 1 (see [`cluster_mean_intervals`]).

    Args:
        numerators_b, denominators_b (array-like of shape `(n,)`): y_b and x_b of each observation.
        numerators_a, denominators_a (array-like of shape `(n,)`, *optional*): y_a and x_a (both or neither).
        clusters (`Sequence`, *optional*): one label per observation; default every observation its own cluster.
        num_resamples (`int`, defaults to 1000): bootstrap-t resamples.
        confidence (`float`, defaults to 0.95): coverage of both intervals.
        generator (`torch.Generator` or `int`, *optional*): source of the resampling; an int is a seed, `None` is 0.

    Returns:
        [`ClusterIntervals`] on the scale of θ (call `.exp()` for a ratio of GenPPLs).
    """
    y_b, x_b = _as_vector(numerators_b, "numerators_b"), _as_vector(denominators_b, "denominators_b")
    if (numerators_a is None) != (denominators_a is None):
        raise ValueError("Pass both `numerators_a` and `denominators_a`, or neither.")
    if numerators_a is None:
        y_a, x_a = torch.zeros_like(y_b), torch.ones_like(y_b)
    else:
        y_a, x_a = _as_vector(numerators_a, "numerators_a"), _as_vector(denominators_a, "denominators_a")
    if not y_a.shape == x_a.shape == y_b.shape == x_b.shape:
        raise ValueError(
            f"Numerators and denominators need one value per observation, got lengths {y_a.numel()}, {x_a.numel()}, "
            f"{y_b.numel()} and {x_b.numel()}."
        )
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    totals, labels = cluster_totals(
        torch.stack([y_a, x_a, y_b, x_b], dim=1), range(y_b.numel()) if clusters is None else clusters
    )
    size = len(labels)
    if size < 2:
        raise ValueError(f"A t-interval needs at least 2 clusters, got {size}.")
    if (totals[:, 1] == 0).all() or (totals[:, 3] == 0).all():
        raise ValueError("Every denominator sums to 0: θ is undefined.")
    theta, se = (float(v[0]) for v in _ratio_difference(totals, torch.ones(1, size, dtype=torch.float64)))
    tail = (1 - confidence) / 2
    if se == 0:  # every cluster agrees: no spread to scale
        return ClusterIntervals(theta, 0.0, size, size - 1, (theta, theta), (theta, theta))
    quantile = student_t_quantile(1 - tail, size - 1)
    bootstrap_t = None
    if size >= 3:
        counts = cluster_resample_weights(range(size), num_resamples, generator)
        theta_star, se_star = _ratio_difference(totals, counts)
        usable = se_star > 1e-9 * se  # one distinct cluster drawn: SE* is 0 up to rounding
        if int(usable.sum()) >= 2:
            low_t, high_t = percentile_interval((theta_star[usable] - theta) / se_star[usable], confidence)
            bootstrap_t = (theta - high_t * se, theta - low_t * se)
    return ClusterIntervals(
        estimate=theta,
        standard_error=se,
        num_clusters=size,
        degrees_of_freedom=size - 1,
        t_interval=(theta - quantile * se, theta + quantile * se),
        bootstrap_t_interval=bootstrap_t,
    )


def cluster_mean_intervals(
    values,
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
) -> ClusterIntervals:
    """t-interval and bootstrap-t of the pooled mean of `values` (e.g. per-pair ΔNLL) over clusters: the mean is the
    ratio Σ v / Σ 1, so this is [`ratio_difference_intervals`] with y_b = v, x_b = 1; NaNs are left out."""
    values = _as_vector(values)
    labels = list(range(values.numel())) if clusters is None else list(clusters)
    if len(labels) != values.numel():
        raise ValueError(f"`clusters` labels {len(labels)} values, got {values.numel()} values.")
    finite = (~values.isnan()).tolist()
    kept = values[~values.isnan()]
    return ratio_difference_intervals(
        kept,
        torch.ones_like(kept),
        clusters=[label for label, keep in zip(labels, finite, strict=True) if keep],
        num_resamples=num_resamples,
        confidence=confidence,
        generator=generator,
    )


def headline_interval(
    bootstrap: tuple[float, float], small_sample: ClusterIntervals, threshold: int = SMALL_SAMPLE_CLUSTERS
) -> tuple[tuple[float, float], str]:
    """The interval a report leads with, and its method: below `threshold` clusters the t-interval (`"t"`), otherwise
    the cluster bootstrap (`"bootstrap"`). See docs/results.md for why."""
    if small_sample.num_clusters < threshold:
        return small_sample.t_interval, "t"
    return tuple(bootstrap), "bootstrap"
