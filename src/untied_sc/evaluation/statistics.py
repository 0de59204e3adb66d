"""Uncertainty of the reported numbers: mean ± standard error, a (cluster) percentile bootstrap, paired comparisons.

The bootstrap resamples the unit of randomness that samples share ([`cluster_resample_weights`]): samples drawn with
one random time grid (an ELF batch) are not independent, and resampling them one by one makes intervals too narrow. Every
interval here takes `clusters` (one label per observation; `None`: every observation is its own cluster) and `strata`
(e.g. the seed: clusters are redrawn within each stratum, so every stratum keeps its size in expectation).

No function touches the global RNG: every random draw takes a `torch.Generator` or an integer seed (`None` means seed
0, so results are reproducible by default).
"""

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
