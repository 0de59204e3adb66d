"""The step-average scaling experiment: C*_k is first order in the step width h_k, its latent contribution second.

Paper Section "The solver should approximate the step-average prediction" (sec:interval_prediction) and Appendix
"Reference averages over one solver step" (app:reference_experiments), with the step average of
eq. (interval_prediction) and the endpoint of eq. (exact_interval_endpoint).

The official sampler runs (`pipe.denoise` with the family's official scheduler). At every update step k, from the
step's network input z_k (ELF: after re-noising) and with its self-conditioning input m_k held fixed (the
conditional flow of eq. (conditional_flow)), a reference sub-trajectory splits [u_k, u_k + h_k] into S equal parts
in the solver coordinate u (ELF u = −log(1 − t); LangFlow u = −γ/2) and steps through them with the family's own
(exponential) solver, one network evaluation per substep. With p_j the substeps' predictions (p_0 = p_k, the
solver's single evaluation), the step average is p̄_k = Σ_j w_j p_j, the weights of eq. (interval_prediction) for a
prediction constant on each substep, C*_k = p̄_k − p_k, and its contribution to the endpoint of eq.
(exact_interval_endpoint) is (1 − e^{−h_k})·C*_k. Per step, RMS over trajectories, positions and dimensions; the
exponents are least-squares slopes of log RMS against log h_k over every step of every NFE, with a bootstrap over
trajectories (resampled within each pipeline call).

Excluded: LangFlow's final evaluation (it updates nothing) and ELF's final step to t = 1 (infinite width in u), and
any ELF step that ends above 1 − t_eps (where the solver's velocity clamp departs from the exponential form).
"""

import math
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from ..schedulers.solvers import ELFSolver, LangFlowSolver
from .family import check_family, clean_prediction, official_scheduler, solver_time, time_of


# app:reference_experiments: ELF-B at 8, 16, 32 NFE, 32 substeps.
PAPER_EXPONENTS = {"correction": (1.04, [1.02, 1.05]), "latent_contribution": (2.02, [2.01, 2.04])}
PAPER_SUBSTEPS = 32


def step_average_weights(widths: torch.Tensor) -> torch.Tensor:
    r"""
    Weights w_j of the step average p̄ = Σ_j w_j p_j for a prediction constant (p_j) on each substep of width
    h_j (eq. (interval_prediction), integrated piecewise): with h = Σ h_j and s_{j+1} = h_0 + … + h_j,

        w_j = e^{−(h − s_{j+1})}·(1 − e^{−h_j}) / (1 − e^{−h}),     Σ_j w_j = 1.
    """
    widths = widths.double()
    if widths.ndim != 1 or len(widths) == 0 or (widths <= 0).any():
        raise ValueError(f"Substep widths must be a non-empty 1-D tensor of positive numbers, got {widths}.")
    total = widths.sum()
    ends = widths.cumsum(0)
    return torch.exp(-(total - ends)) * (-torch.expm1(-widths)) / (-torch.expm1(-total))


def step_average_correction(predictions: list[torch.Tensor], weights: torch.Tensor) -> torch.Tensor:
    """C*_k = p̄_k − p_k (sec:interval_prediction) with p̄_k = Σ_j w_j p_j and p_k = p_0, in float64."""
    if len(predictions) != len(weights):
        raise ValueError(f"{len(predictions)} predictions but {len(weights)} weights.")
    average = sum(float(w) * p.double() for w, p in zip(weights, predictions, strict=True))
    return average - predictions[0].double()


def latent_contribution(correction: torch.Tensor, width: float) -> torch.Tensor:
    """(1 − e^{−h_k})·C*_k, the correction's share of the endpoint y_{k+1} (eq. (exact_interval_endpoint))."""
    return -math.expm1(-width) * correction


def fitted_exponent(widths: torch.Tensor, values: torch.Tensor) -> float:
    """The least-squares slope of log(values) against log(widths): the order p of values ∝ h^p."""
    x, y = torch.as_tensor(widths, dtype=torch.float64).log(), torch.as_tensor(values, dtype=torch.float64).log()
    if len(x) < 2 or float(x.var()) == 0:
        raise ValueError("Fitting an exponent needs at least two different step widths.")
    xc = x - x.mean()
    return float((xc * (y - y.mean())).sum() / (xc * xc).sum())


@dataclass
class StepScalingResult:
    """
    Output of [`step_scaling_experiment`].

    Args:
        nfe (`list[int]`), substeps (`int`), num_trajectories (`int`): what was measured.
        steps (`list[dict]`): one row per measured step of one pipeline call: `nfe`, `call` (ELF draws a new
            grid per call), `step`, `width` (h_k), `correction_rms`, `latent_contribution_rms` (RMS over the call's
            trajectories, positions, dimensions).
        exponents (`dict[str, dict]`): `correction` and `latent_contribution`: fitted `exponent`, bootstrap `ci`.
        excluded (`list[dict]`): steps left out, with the reason.
    """

    nfe: list[int]
    substeps: int
    num_trajectories: int
    steps: list[dict] = field(default_factory=list)
    exponents: dict[str, dict] = field(default_factory=dict)
    excluded: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _substep_solver(family: str, scheduler, k: int, substeps: int):
    """(the sub-solver on [u_k, u_k + h_k] split into `substeps` equal parts in u, h_k, substep widths) or None."""
    solver = scheduler.solver
    if family == "elf":
        start, end = solver.eval_times[k], solver.grid[k + 1]
        if end > 1.0 - solver.t_eps:
            return None
    else:
        start, end = solver.eval_time(k), solver.eval_time(k + 1)
    u0, u1 = solver_time(family, start), solver_time(family, end)
    width = u1 - u0
    times = [time_of(family, u0 + width * j / substeps) for j in range(substeps + 1)]
    times[0], times[-1] = start, end
    if family == "elf":
        sub = ELFSolver(times, sde_gamma=0.0, noise_scale=solver.noise_scale, t_eps=solver.t_eps)
    else:
        sub = LangFlowSolver(torch.tensor(times, dtype=torch.float32), solver.gamma_min, solver.gamma_max)
    widths = torch.tensor(
        [solver_time(family, b) - solver_time(family, a) for a, b in zip(times, times[1:], strict=False)]
    )
    return sub, width, widths


@torch.no_grad()
def step_scaling_experiment(
    pipe,
    nfe: list[int],
    num_trajectories: int = 16,
    substeps: int = PAPER_SUBSTEPS,
    generator: torch.Generator | None = None,
    batch_size: int = 16,
    bootstrap: int = 1000,
    confidence: float = 0.95,
    progress: bool = True,
) -> StepScalingResult:
    """
    Runs the step-average scaling experiment (module docstring).

    Args:
        pipe ([`LanguageFlowPipeline`]): the model, on its device.
        nfe (`list[int]`): NFEs of the official sampler's trajectories (at least two different step widths in all).
        num_trajectories (`int`): trajectories per NFE.
        substeps (`int`): S ≥ 2, reference substeps per solver step (the paper: 32).
        generator (`torch.Generator`, *optional*): every draw (the trajectories, the bootstrap), on the CPU.
        batch_size (`int`): trajectories per pipeline call.
        bootstrap (`int`), confidence (`float`): the exponents' percentile bootstrap over trajectories.
        progress (`bool`): a tqdm bar.
    """
    family = check_family(pipe)
    if not isinstance(substeps, int) or substeps < 2:
        raise ValueError(f"substeps must be an integer ≥ 2, got {substeps!r}.")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    result = StepScalingResult(nfe=list(nfe), substeps=substeps, num_trajectories=num_trajectories)
    rows: list[dict] = []  # one per measured step of one pipeline call (ELF draws a new grid per call)
    excluded: set[tuple[int, int, str]] = set()
    batches = [min(batch_size, num_trajectories - s) for s in range(0, num_trajectories, batch_size)]
    bar = tqdm(total=len(nfe) * len(batches), desc="step scaling", disable=not progress)
    for n in nfe:
        for call, size in enumerate(batches):
            scheduler = official_scheduler(pipe)

            def measure(step, n=n, call=call, scheduler=scheduler):
                k, updates = step.index, scheduler.solver.num_update_steps
                if k >= updates:
                    return None  # LangFlow's final evaluation updates nothing
                plan = _substep_solver(family, scheduler, k, substeps)
                if family == "elf" and k == updates - 1:
                    excluded.add((n, k, "final step to t = 1 (infinite width in u)"))
                    return None
                if plan is None:
                    excluded.add((n, k, "ends above 1 − t_eps"))
                    return None
                sub, width, widths = plan
                latents, predictions = step.model_input, [step.prediction]
                for j in range(substeps - 1):
                    latents = sub.update(j, latents, predictions[-1])
                    timestep = torch.tensor(sub.eval_time(j + 1), dtype=torch.float32, device=latents.device)
                    predictions.append(clean_prediction(pipe, latents, timestep, step.self_conditioning))
                correction = step_average_correction(predictions, step_average_weights(widths))
                contribution = latent_contribution(correction, width)
                rows.append(
                    {
                        "nfe": n,
                        "call": call,
                        "step": k,
                        "width": width,
                        "correction": correction.pow(2).flatten(1).mean(1).cpu(),
                        "contribution": contribution.pow(2).flatten(1).mean(1).cpu(),
                    }
                )
                return None

            pipe.denoise(size, n, generator, scheduler=scheduler, step_callback=measure, progress=False)
            bar.update()
    bar.close()
    if not rows:
        raise ValueError("No step could be measured; use more NFEs.")
    result.excluded = [{"nfe": n, "step": k, "reason": why} for n, k, why in sorted(excluded)]
    widths = torch.tensor([row["width"] for row in rows], dtype=torch.float64)
    for row in rows:
        result.steps.append(
            {
                "nfe": row["nfe"],
                "call": row["call"],
                "step": row["step"],
                "width": row["width"],
                "correction_rms": float(row["correction"].mean().sqrt()),
                "latent_contribution_rms": float(row["contribution"].mean().sqrt()),
            }
        )
    for name, key in (("correction", "correction"), ("contribution", "latent_contribution")):
        squares = [row[name] for row in rows]  # per row: (trajectories,) mean squares

        def rms(draw: bool, squares=squares) -> torch.Tensor:
            picked = [s[torch.randint(len(s), (len(s),), generator=generator)] if draw else s for s in squares]
            return torch.stack([s.mean() for s in picked]).sqrt()

        estimate = fitted_exponent(widths, rms(False))
        draws = sorted(fitted_exponent(widths, rms(True)) for _ in range(max(bootstrap, 0)))
        ci = None
        if draws:
            ci = [
                draws[int(math.floor((1 - confidence) / 2 * (len(draws) - 1)))],
                draws[int(math.ceil((1 + confidence) / 2 * (len(draws) - 1)))],
            ]
        result.exponents[key] = {"exponent": estimate, "ci": ci, "confidence": confidence, "resamples": bootstrap}
    return result
