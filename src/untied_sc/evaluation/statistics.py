"""Uncertainty of the reported numbers: mean ± standard error, percentile bootstrap, paired comparisons.

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


def _percentile_interval(estimates: torch.Tensor, confidence: float) -> tuple[float, float]:
    """The (1 - c)/2 and (1 + c)/2 quantiles of bootstrap `estimates` (linear interpolation)."""
    tail = (1 - confidence) / 2
    low, high = torch.quantile(estimates.double(), torch.tensor([tail, 1 - tail], dtype=torch.float64))
    return float(low), float(high)


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
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of a statistic of `values`.

    Draws `num_resamples` resamples of the rows of `values` with replacement, evaluates the statistic on each and
    returns its (1 - c)/2 and (1 + c)/2 quantiles (linear interpolation), c = `confidence`.

    Args:
        values (array-like of shape `(n,)` or `(n, k)`): observations; rows are resampled together, so paired data
            (e.g. `torch.stack([a, b], dim=1)`) keeps its pairing.
        statistic (`Callable`, *optional*): maps one resample (same trailing shape as `values`) to a scalar; defaults
            to the mean of a 1-D `values` (vectorised).
        num_resamples (`int`, defaults to 1000): number of bootstrap resamples.
        confidence (`float`, defaults to 0.95): coverage of the interval, in (0, 1).
        generator (`torch.Generator` or `int`, *optional*): source of the resampling indices; an int is a seed, `None`
            is seed 0.

    Returns:
        `(low, high)`.
    """
    values = torch.as_tensor(values, dtype=torch.float64)
    if values.ndim == 0 or values.shape[0] == 0:
        raise ValueError(f"`values` must have at least one row, got shape {tuple(values.shape)}.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    if num_resamples < 1:
        raise ValueError(f"`num_resamples` must be at least 1, got {num_resamples}.")
    n = values.shape[0]
    index = torch.randint(n, (num_resamples, n), generator=_as_generator(generator))
    if statistic is None:
        if values.ndim != 1:
            raise ValueError("The default statistic (the mean) needs 1-D `values`; pass `statistic` for rows.")
        estimates = values[index].mean(dim=1)
    else:
        estimates = torch.tensor([float(statistic(values[row])) for row in index], dtype=torch.float64)
    return _percentile_interval(estimates, confidence)


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
) -> PairedComparison:
    """Compares matched per-sample NLLs: how often b is worse than a, and by how much on average.

    Pass per-token NLLs (`SampleNLLs.mean_nll`, the log of each sample's perplexity) so that samples of different
    lengths weigh the same. Pair i must come from the same model, grid, initial latent and random stream (SPEC §6).

    Args:
        nll_a, nll_b (array-like of shape `(n,)`): per-sample NLLs of the two samplers, in matching order.
        num_resamples, confidence, generator: as in [`bootstrap_ci`]; both intervals use the same resamples.

    Returns:
        [`PairedComparison`].
    """
    nll_a, nll_b = _as_vector(nll_a, "nll_a"), _as_vector(nll_b, "nll_b")
    if nll_a.shape != nll_b.shape:
        raise ValueError(f"Paired NLLs must have the same length, got {nll_a.numel()} and {nll_b.numel()}.")
    finite = ~(nll_a.isnan() | nll_b.isnan())
    delta = (nll_b - nll_a)[finite]
    if delta.numel() == 0:
        raise ValueError("No pair has a finite NLL on both sides.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    index = torch.randint(delta.numel(), (num_resamples, delta.numel()), generator=_as_generator(generator))
    resampled = delta[index]
    return PairedComparison(
        num_pairs=delta.numel(),
        fraction_b_worse=float((delta > 0).double().mean()),
        fraction_tied=float((delta == 0).double().mean()),
        mean_delta=float(delta.mean()),
        mean_delta_ci=_percentile_interval(resampled.mean(dim=1), confidence),
        fraction_b_worse_ci=_percentile_interval((resampled > 0).double().mean(dim=1), confidence),
        num_dropped=int((~finite).sum()),
    )


def interpolated_ratio_ci(
    target: Sequence[tuple],
    lower: Sequence[tuple],
    upper: Sequence[tuple],
    weight: float,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
) -> tuple[float, float]:
    """Bootstrap CI of GenPPL(target) / (GenPPL(lower)^(1-w) · GenPPL(upper)^w): a sampler against a curve read
    between two of its points (log-GenPPL interpolated with weight w, as in the benchmark's equal-entropy table).

    Each series is given per seed as `(nll_sum, num_tokens)` per-sample vectors; a seed's GenPPL pools its tokens
    (exp Σ nll / Σ tokens) and a series' GenPPL is the mean over seeds, as in the benchmark tables. The resampling is
    stratified by seed and paired: within a seed the same sample indices are drawn for all three series, because
    sample i of every series shares its initial latent and random stream. The interpolation weight is held fixed (it
    comes from the entropies, whose seed-to-seed error is small next to GenPPL's).

    Args:
        target, lower, upper (sequence over seeds of `(nll_sum, num_tokens)`): the same seeds in the same order, the
            same number of samples per seed in all three.
        weight (`float`): w in [0, 1].
        num_resamples, confidence, generator: as in [`bootstrap_ci`].

    Returns:
        `(low, high)`.
    """
    if not 0 <= weight <= 1:
        raise ValueError(f"`weight` must be in [0, 1], got {weight}.")
    if not 0 < confidence < 1:
        raise ValueError(f"`confidence` must be in (0, 1), got {confidence}.")
    if not len(target) == len(lower) == len(upper) or not target:
        raise ValueError(f"The three series need the same seeds, got {len(target)}, {len(lower)}, {len(upper)}.")
    series = [
        [(_as_vector(nll, "nll_sum"), _as_vector(tokens, "num_tokens")) for nll, tokens in blocks]
        for blocks in (target, lower, upper)
    ]
    sizes = [nll.numel() for nll, _ in series[0]]
    for blocks in series:
        if [nll.numel() for nll, _ in blocks] != sizes or any(t.numel() != n.numel() for n, t in blocks):
            raise ValueError(f"Every series needs {sizes} paired samples per seed (the target's).")
    generator = _as_generator(generator)
    indices = [torch.randint(n, (num_resamples, n), generator=generator) for n in sizes]

    def log_gen_ppl(blocks: list) -> torch.Tensor:  # (num_resamples,)
        per_seed = [(nll[i].sum(1) / tokens[i].sum(1)).exp() for (nll, tokens), i in zip(blocks, indices, strict=True)]
        return torch.stack(per_seed).mean(0).log()

    log_target, log_lower, log_upper = (log_gen_ppl(blocks) for blocks in series)
    ratios = (log_target - (1 - weight) * log_lower - weight * log_upper).exp()
    return _percentile_interval(ratios, confidence)
