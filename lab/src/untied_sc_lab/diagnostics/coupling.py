"""The coupling experiment: does correlation across sampling steps change a fixed self-conditioning update?

Paper Section "Does correlation across sampling steps change a fixed self-conditioning update?" (sec:coupling_experiment)
and Appendix "Changing correlation while preserving each noise-level distribution" (app:coupling_protocol).

For every clean example y and correlation ρ, the official sampler's evaluation times t_0..t_{N−1} get successive
standardised Gaussian corruptions z_k = corrupt(y, t_k, ε_k) whose noises follow ε_k = ρ·ε_{k−1} + √(1 − ρ²)·ξ_k
(eq. (gaussian_coupling)): every ε_k is N(0, I), so each z_k has the training marginal, and only the dependence
between successive steps changes (ρ = 0: independent; ρ = 1: one noise for all steps). The fresh draws ξ_k are shared
by all ρ (paired comparisons). At step k ≥ 1 the same z_k and t_k go to

- the base model, no self-conditioning: v_base = f(z_k, t_k, ∅);
- the model with the carried prediction as its self-conditioning input: v_sc = f(z_k, t_k, p_{k−1}), where
  p_{k−1} is the previous step's v_sc (v_base at k = 0), as the sampler carries m_k = p_{k−1};
- the control with a preliminary prediction from the current state (training-style self-conditioning):
  v_ctrl = f(z_k, t_k, f(z_k, t_k, ∅)).

With d = v_sc − v_base and e = v_base − y, summed over examples, steps k ≥ 1, positions and dimensions:
α* = −Σ⟨e, d⟩ / Σ‖d‖² (the appendix's equation) and the risk ratio Σ‖e + d‖² / Σ‖e‖² (coefficient one vs zero).
"""

import math
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .bootstrap import BootstrapEstimate, percentile_interval
from .family import check_family, clean_prediction, corrupt, evaluation_times
from .outputs import nfe_keyed


PAPER_RHOS = (0.0, 0.25, 0.5, 0.75, 1.0)
# Table tab:coupling (ELF-B, 256 OpenWebText examples): ρ → (α*, risk ratio) at 8 and 16 NFE.
PAPER_TABLE = {
    8: {"alpha_star": [0.88, 0.79, 0.62, 0.45, 0.30], "risk_ratio": [0.92, 0.94, 0.97, 1.01, 1.07]},
    16: {"alpha_star": [0.78, 0.69, 0.55, 0.40, 0.35], "risk_ratio": [0.92, 0.94, 0.98, 1.05, 1.11]},
}


def coupled_noise(previous: torch.Tensor | None, fresh: torch.Tensor, rho: float) -> torch.Tensor:
    """
    ε_k = ρ·ε_{k−1} + √(1 − ρ²)·ξ_k (ε_0 = ξ_0): unit-variance noises with Corr(ε_{k−1}, ε_k) = ρ, eq.
    (gaussian_coupling) applied between successive steps.
    """
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"A correlation ρ must lie in [0, 1], got {rho}.")
    if previous is None:
        return fresh
    return rho * previous + math.sqrt(1.0 - rho * rho) * fresh


def quadratic_risk_terms(
    base: torch.Tensor, modified: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    Per example (first axis): Σ⟨e, d⟩, Σ‖d‖², Σ‖e‖² with d = v_sc − v_base, e = v_base − y (app:coupling_protocol),
    in float64.
    """
    d = (modified.double() - base.double()).flatten(1)
    e = (base.double() - target.double()).flatten(1)
    return (e * d).sum(1), (d * d).sum(1), (e * e).sum(1)


def optimal_coefficient(sum_ed: torch.Tensor | float, sum_dd: torch.Tensor | float) -> float:
    """α* = −Σ⟨e, d⟩ / Σ‖d‖², the empirical quadratic-risk optimum of v(α) = v_base + α·d (app:coupling_protocol)."""
    sum_ed, sum_dd = float(sum_ed), float(sum_dd)
    if sum_dd == 0:
        return float("nan")  # d = 0: the self-conditioning input changes nothing, every α is optimal
    return -sum_ed / sum_dd


def risk_ratio(sum_ee: torch.Tensor | float, sum_ed: torch.Tensor | float, sum_dd: torch.Tensor | float) -> float:
    """R(1)/R(0) = Σ‖e + d‖² / Σ‖e‖² = (Σ‖e‖² + 2Σ⟨e, d⟩ + Σ‖d‖²) / Σ‖e‖² (coefficient one vs zero)."""
    sum_ee, sum_ed, sum_dd = float(sum_ee), float(sum_ed), float(sum_dd)
    return (sum_ee + 2 * sum_ed + sum_dd) / sum_ee


@dataclass
class CouplingResult:
    """
    Output of [`coupling_experiment`].

    Args:
        nfe (`list[int]`), rhos (`list[float]`), num_examples (`int`): what was measured.
        alpha_star (`dict[int, list[float]]`): NFE → α*(ρ) per ρ (summed over steps k ≥ 1).
        risk_ratio (`dict[int, list[float]]`): NFE → risk ratio per ρ.
        alpha_star_by_step (`dict[int, list[list[float]]]`): NFE → per ρ, α* of each step k = 1..N−1.
        control_alpha_star, control_risk_ratio (`dict[int, list[float]]`): the same for the control with a
            preliminary prediction from the current state.
        paired_difference (`dict[int, BootstrapEstimate]`): NFE → α*(first ρ) − α*(last ρ), with its bootstrap
            interval over examples.
    """

    nfe: list[int]
    rhos: list[float]
    num_examples: int
    alpha_star: dict[int, list[float]] = field(default_factory=dict)
    risk_ratio: dict[int, list[float]] = field(default_factory=dict)
    alpha_star_by_step: dict[int, list[list[float]]] = field(default_factory=dict)
    control_alpha_star: dict[int, list[float]] = field(default_factory=dict)
    control_risk_ratio: dict[int, list[float]] = field(default_factory=dict)
    paired_difference: dict[int, BootstrapEstimate] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The result as the JSON payload stores it: NFE keys as strings, in NFE order."""
        return {
            "nfe": list(self.nfe),
            "rhos": list(self.rhos),
            "num_examples": self.num_examples,
            "alpha_star": nfe_keyed(self.alpha_star),
            "risk_ratio": nfe_keyed(self.risk_ratio),
            "alpha_star_by_step": nfe_keyed(self.alpha_star_by_step),
            "control_alpha_star": nfe_keyed(self.control_alpha_star),
            "control_risk_ratio": nfe_keyed(self.control_risk_ratio),
            "paired_difference": nfe_keyed(self.paired_difference, lambda difference: difference.to_json("estimate")),
        }


def _paired_difference(
    terms: torch.Tensor, generator: torch.Generator, resamples: int, confidence: float
) -> BootstrapEstimate:
    """α*(ρ_first) − α*(ρ_last) from per-example terms (R, examples, 3), with a percentile bootstrap over examples."""

    def difference(rows: torch.Tensor) -> float:
        first, last = terms[0, rows].sum(0), terms[-1, rows].sum(0)
        return optimal_coefficient(first[0], first[1]) - optimal_coefficient(last[0], last[1])

    examples = terms.shape[1]
    estimate = difference(torch.arange(examples))
    draws = sorted(
        difference(torch.randint(examples, (examples,), generator=generator)) for _ in range(max(resamples, 0))
    )
    return BootstrapEstimate(estimate, percentile_interval(draws, confidence), confidence, resamples)


@torch.no_grad()
def coupling_experiment(
    pipe,
    clean: torch.Tensor,
    nfe: list[int],
    rhos: tuple[float, ...] = PAPER_RHOS,
    generator: torch.Generator | None = None,
    batch_size: int = 16,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    progress: bool = True,
) -> CouplingResult:
    """
    Runs the coupling experiment (module docstring) on `clean` latents.

    Args:
        pipe ([`LanguageFlowPipeline`]): the model (its transformer and scheduler config), on its device.
        clean (`torch.Tensor` of shape `(examples, length, dim)`): the clean targets y (LangFlow: E_norm[ids];
            ELF: the normalised encoder latents).
        nfe (`list[int]`): the NFEs whose evaluation times are used.
        rhos (`tuple[float, ...]`): the correlations ρ ∈ [0, 1].
        generator (`torch.Generator`, *optional*): every draw (ξ_k, ELF's time grids, the bootstrap), on the CPU.
        batch_size (`int`): examples per network call.
        bootstrap (`int`): resamples of the paired-difference interval (0: none).
        confidence (`float`): its level.
        progress (`bool`): a tqdm bar.
    """
    check_family(pipe)
    if clean.ndim != 3 or tuple(clean.shape[1:]) != tuple(pipe.latent_shape):
        raise ValueError(
            f"clean latents must have shape (examples, {', '.join(map(str, pipe.latent_shape))}), got "
            f"{tuple(clean.shape)}."
        )
    if not rhos or any(not 0.0 <= r <= 1.0 for r in rhos):
        raise ValueError(f"Correlations must be a non-empty list of numbers in [0, 1], got {list(rhos)}.")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    device = pipe.transformer.device
    examples = clean.shape[0]
    batches = [(start, min(start + batch_size, examples)) for start in range(0, examples, batch_size)]
    result = CouplingResult(nfe=list(nfe), rhos=[float(r) for r in rhos], num_examples=examples)
    bar = tqdm(total=len(nfe) * len(batches) * len(rhos), desc="coupling", disable=not progress)
    for n in nfe:
        # (ρ, step, example, [Σ⟨e,d⟩, Σ‖d‖², Σ‖e‖²]) for v_sc and for the control
        terms = torch.zeros(len(rhos), n, examples, 3, dtype=torch.float64)
        control = torch.zeros_like(terms)
        for start, stop in batches:
            target = clean[start:stop].to(device=device, dtype=torch.float32)
            times = evaluation_times(pipe, n, generator)  # ELF: one random grid per batch, as the sampler's
            fresh = torch.randn((n, *target.shape), generator=generator, dtype=torch.float32)
            for r, rho in enumerate(rhos):
                noise, carried = None, None
                for k, t in enumerate(times):
                    noise = coupled_noise(noise, fresh[k], rho)
                    latents = corrupt(pipe, target, t, noise.to(device))
                    timestep = torch.tensor(t, dtype=torch.float32, device=device)
                    base = clean_prediction(pipe, latents, timestep, None)
                    if k > 0:
                        modified = clean_prediction(pipe, latents, timestep, carried)
                        preliminary = clean_prediction(pipe, latents, timestep, base)
                        terms[r, k, start:stop] = torch.stack(quadratic_risk_terms(base, modified, target), 1).cpu()
                        control[r, k, start:stop] = torch.stack(
                            quadratic_risk_terms(base, preliminary, target), 1
                        ).cpu()
                        carried = modified
                    else:
                        carried = base
                bar.update()
        totals, control_totals = terms.sum((1, 2)), control.sum((1, 2))
        result.alpha_star[n] = [optimal_coefficient(s[0], s[1]) for s in totals]
        result.risk_ratio[n] = [risk_ratio(s[2], s[0], s[1]) for s in totals]
        result.control_alpha_star[n] = [optimal_coefficient(s[0], s[1]) for s in control_totals]
        result.control_risk_ratio[n] = [risk_ratio(s[2], s[0], s[1]) for s in control_totals]
        by_step = terms.sum(2)
        result.alpha_star_by_step[n] = [
            [optimal_coefficient(by_step[r, k, 0], by_step[r, k, 1]) for k in range(1, n)] for r in range(len(rhos))
        ]
        result.paired_difference[n] = _paired_difference(terms.sum(1), generator, bootstrap, confidence)
    bar.close()
    return result
