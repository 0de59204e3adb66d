"""The Gumbel proposal over γ: sampling, and fitting it to the measured per-γ loss curve ("information-uniform").

LangFlow samples the training noise level γ = −log SNR from a learned Gumbel(loc, scale) clamped at the quantile
cutoff c (γ ∈ [loc − scale·log(−log c), loc − scale·log c]), and samples at the quantiles of the same proposal.

The fit here makes the proposal's CDF follow the model's normalised cross-entropy curve,

    F(γ; loc, scale) = exp(−exp(−(γ − loc)/scale))  ≈  clip(CE(γ) / H_unigram, 0, 1),

so the density of training noise levels is proportional to dCE/dγ: every training example (and every sampling
step) covers an equal share of the information between "clean" (CE → 0) and "pure noise" (CE → H_unigram, the most a
model can do with no signal). Where the curve is flat (γ so low that the skip term alone decodes the token, or so
high that nothing beyond the unigram is recoverable) nothing can be learned and the density is small. CDCD's time
warping uses the same principle with a free-form monotone fit; LangFlow restricts it to a Gumbel.

The per-γ CE is an exponential moving average over training examples in fixed γ bins (`ProposalStats`).
"""

import math
from dataclasses import dataclass

import torch


EULER_GAMMA = 0.5772156649015329


def gumbel_range(loc: float, scale: float, cutoff: float) -> tuple[float, float]:
    """(γ_min, γ_max) of the clamped proposal."""
    return loc - scale * math.log(-math.log(cutoff)), loc - scale * math.log(cutoff)


def gumbel_entropy(scale: float) -> float:
    """Differential entropy of Gumbel(·, scale): log(scale) + Euler's constant + 1 (stored as `proposal.entropy`)."""
    return math.log(scale) + EULER_GAMMA + 1.0


def sample_gamma(batch_size: int, loc: float, scale: float, cutoff: float, generator: torch.Generator) -> torch.Tensor:
    """γ ~ Gumbel(loc, scale), by inverse CDF of u ~ U(c, 1 − c), then clamped to [γ_min, γ_max] (float32)."""
    u = torch.rand(batch_size, generator=generator, dtype=torch.float64) * (1 - 2 * cutoff) + cutoff
    gamma = loc - scale * torch.log(-torch.log(u))
    gamma_min, gamma_max = gumbel_range(loc, scale, cutoff)
    return gamma.clamp(gamma_min, gamma_max).float()


def gumbel_cdf(gamma: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return torch.exp(-torch.exp(-(gamma - loc) / scale))


@dataclass
class ProposalStats:
    """Exponential moving averages of the training loss in fixed γ bins (weights and weighted sums)."""

    low: float = 0.0
    high: float = 16.0
    num_bins: int = 64
    decay: float = 0.995

    def __post_init__(self):
        self.weight = torch.zeros(self.num_bins, dtype=torch.float64)
        self.total = torch.zeros(self.num_bins, dtype=torch.float64)

    @property
    def centers(self) -> torch.Tensor:
        width = (self.high - self.low) / self.num_bins
        return self.low + width * (torch.arange(self.num_bins, dtype=torch.float64) + 0.5)

    def update(self, gamma: torch.Tensor, loss: torch.Tensor) -> None:
        """Decays the averages once and adds the batch's per-example losses at their γ."""
        width = (self.high - self.low) / self.num_bins
        index = ((gamma.double() - self.low) / width).floor().long().clamp(0, self.num_bins - 1)
        self.weight.mul_(self.decay).index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
        self.total.mul_(self.decay).index_add_(0, index, loss.detach().double())

    def curve(self, min_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
        """(γ centres, mean loss) of the bins with at least `min_weight` of (decayed) examples."""
        keep = self.weight >= min_weight
        return self.centers[keep], self.total[keep] / self.weight[keep]

    def state_dict(self) -> dict:
        return {"config": (self.low, self.high, self.num_bins, self.decay), "weight": self.weight, "total": self.total}

    def load_state_dict(self, state: dict) -> None:
        self.low, self.high, self.num_bins, self.decay = state["config"]
        self.weight = state["weight"].clone()
        self.total = state["total"].clone()


def fit_gumbel_to_curve(
    gammas: torch.Tensor,
    losses: torch.Tensor,
    entropy: float,
    loc_range: tuple[float, float] = (0.5, 10.0),
    scale_range: tuple[float, float] = (0.3, 3.0),
    resolution: float = 0.01,
) -> tuple[float, float, float]:
    """
    Least-squares Gumbel CDF through the normalised loss curve clip(CE/entropy, 0, 1), by exhaustive grid search
    (deterministic).

    Returns:
        (loc, scale, rms error of the fit).
    """
    target = (losses.double() / entropy).clamp(0.0, 1.0)
    locs = torch.arange(loc_range[0], loc_range[1] + resolution / 2, resolution, dtype=torch.float64)
    scales = torch.arange(scale_range[0], scale_range[1] + resolution / 2, resolution, dtype=torch.float64)
    best = (math.inf, 0.0, 0.0)
    g = gammas.double()[None, :]
    for scale in scales:
        errors = ((gumbel_cdf(g, locs[:, None], scale) - target[None, :]) ** 2).mean(dim=1)
        error, index = errors.min(dim=0)
        if error.item() < best[0]:
            best = (error.item(), locs[index].item(), scale.item())
    return round(best[1], 6), round(best[2], 6), math.sqrt(best[0])
