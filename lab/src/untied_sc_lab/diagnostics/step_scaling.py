"""The step-average scaling experiment: C*_k is first order in the step width h_k, its latent contribution second.

Paper Section "The solver should approximate the step-average prediction" (sec:interval_prediction) and Appendix
"Reference averages over one solver step" (app:reference_experiments), with the step average of
eq. (interval_prediction), its expansion eq. (second_order_interval_expansion) and the endpoint of eq.
(exact_interval_endpoint).

The official sampler runs (`pipe.denoise` with the family's official scheduler). At every update step k, from the
step's network input z_k (ELF: after re-noising) and with its self-conditioning input m_k held fixed (the
conditional flow of eq. (conditional_flow)), a reference sub-trajectory splits [u_k, u_k + h_k] into S equal parts
in the solver coordinate u (ELF u = −log(1 − t); LangFlow u = −γ/2), steps through them with the family's own
(exponential) solver and evaluates the network at every node, the step's end included (S extra evaluations; p_0 = p_k
is the solver's own). The step average p̄_k of eq. (interval_prediction) integrates the piecewise-linear
interpolation of the node predictions (exact for a prediction linear in u), C*_k = p̄_k − p_k, and its contribution to
the endpoint of eq. (exact_interval_endpoint) is (1 − e^{−h_k})·C*_k. RMS over trajectories, positions, dimensions.

Two fits of log RMS against log h:

- within steps (the order of eq. (second_order_interval_expansion), the primary estimate): the same reference gives
  C*_k(h) for the nested widths h = h_k·m/S, m = S, S/2, S/4, … ≥ 2 (the first m substeps, same start and m_k); the
  slope is fitted with one intercept per step, so only the width varies;
- across steps: one point per step (full width) over every step of every NFE, the paper's "across 8, 16, and 32 NFE"
  (steps at different places of the trajectory: the slope also carries how fast p changes there).

Both with a bootstrap over trajectories (resampled within each pipeline call). Excluded: LangFlow's final evaluation
(it updates nothing), ELF's final step to t = 1 (infinite width in u), and any ELF step that ends above 1 − t_eps
(where the solver's velocity clamp departs from the exponential form).
"""

import math
from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from untied_sc.schedulers import ELFSolver, LangFlowSolver

from .bootstrap import BootstrapEstimate, percentile_interval
from .family import check_family, clean_prediction, official_scheduler, solver_time, time_of


# app:reference_experiments: ELF-B at 8, 16, 32 NFE, 32 substeps.
PAPER_EXPONENTS = {"correction": (1.04, [1.02, 1.05]), "latent_contribution": (2.02, [2.01, 2.04])}
PAPER_SUBSTEPS = 32


def step_average_weights(nodes: torch.Tensor) -> torch.Tensor:
    r"""
    Weights w_j of the step average p̄ = Σ_j w_j p_j (eq. (interval_prediction)) for a prediction interpolated
    linearly between its values p_j at the nodes 0 = s_0 < s_1 < … < s_S = h: with E(s) = e^{−(h−s)} and, on
    [a, b] = [s_j, s_{j+1}] of length δ,

        ∫_a^b E(s)·(b − s)/δ ds = (E(b) − E(a))/δ − E(a)      (to p_j),
        ∫_a^b E(s)·(s − a)/δ ds = E(b) − (E(b) − E(a))/δ      (to p_{j+1}),

    all divided by 1 − e^{−h}; Σ_j w_j = 1, and a linear p gets C* = a_1(h)·ṗ exactly (eq.
    (second_order_interval_expansion)).
    """
    nodes = torch.as_tensor(nodes, dtype=torch.float64)
    if nodes.ndim != 1 or len(nodes) < 2 or nodes[0] != 0 or (nodes.diff() <= 0).any():
        raise ValueError(f"Nodes must be 0 = s_0 < s_1 < … < s_S (at least two), got {nodes}.")
    h = nodes[-1]
    kernel = torch.exp(-(h - nodes))
    left, right, width = kernel[:-1], kernel[1:], nodes.diff()
    mass = right - left
    weights = torch.zeros_like(nodes)
    weights[:-1] += mass / width - left
    weights[1:] += right - mass / width
    return weights / -torch.expm1(-h)


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


def within_step_exponent(widths: list[torch.Tensor], values: list[torch.Tensor]) -> float:
    """
    The least-squares slope of log(values) against log(widths) with one intercept per group (a step): each group's
    logs are centred before the pooled fit, so only the width varies within what is compared.
    """
    xs, ys = [], []
    for width, value in zip(widths, values, strict=True):
        x, y = torch.as_tensor(width, dtype=torch.float64).log(), torch.as_tensor(value, dtype=torch.float64).log()
        xs.append(x - x.mean())
        ys.append(y - y.mean())
    x, y = torch.cat(xs), torch.cat(ys)
    if float((x * x).sum()) == 0:
        raise ValueError("Fitting an exponent needs at least two different widths within a step.")
    return float((x * y).sum() / (x * x).sum())


def nested_prefixes(substeps: int) -> list[int]:
    """m = S, S/2, S/4, … ≥ 2 (floored): the numbers of leading substeps whose widths h_k·m/S are compared."""
    prefixes, m = [], substeps
    while m >= 2 and m not in prefixes:
        prefixes.append(m)
        m //= 2
    return prefixes


@dataclass(frozen=True)
class MeasuredStep:
    """
    One measured step of one pipeline call.

    Args:
        nfe (`int`), call (`int`), step (`int`): where it was measured (ELF draws a new grid per call).
        width (`float`): its width h_k in the solver coordinate u.
        widths (`list[float]`): the nested widths h_k·m/S, one per prefix m, the full step first.
        correction_rms, latent_contribution_rms (`list[float]`): RMS of C*_k and of (1 − e^{−h})·C*_k over the
            call's trajectories, positions, dimensions, one per width.
    """

    nfe: int
    call: int
    step: int
    width: float
    widths: list[float]
    correction_rms: list[float]
    latent_contribution_rms: list[float]

    def to_json(self) -> dict:
        """The step as the JSON payload stores it: its fields, in their order."""
        return asdict(self)


@dataclass(frozen=True)
class ExcludedStep:
    """A step left out of the fits (`nfe`, `step`) and why (`reason`)."""

    nfe: int
    step: int
    reason: str

    def to_json(self) -> dict:
        """The step as the JSON payload stores it: its fields, in their order."""
        return asdict(self)


@dataclass
class StepScalingResult:
    """
    Output of [`step_scaling_experiment`].

    Args:
        nfe (`list[int]`), substeps (`int`), num_trajectories (`int`): what was measured.
        prefixes (`list[int]`): the nested substep counts m of the within-step fit.
        steps (`list[MeasuredStep]`): one row per measured step of one pipeline call.
        exponents (`dict[str, BootstrapEstimate]`): within steps, by quantity (`correction`,
            `latent_contribution`): the fitted exponent with its bootstrap interval over trajectories.
        pooled_exponents (`dict[str, BootstrapEstimate]`): the same across steps and NFEs (full widths).
        excluded (`list[ExcludedStep]`): steps left out, with the reason.
    """

    nfe: list[int]
    substeps: int
    num_trajectories: int
    prefixes: list[int] = field(default_factory=list)
    steps: list[MeasuredStep] = field(default_factory=list)
    exponents: dict[str, BootstrapEstimate] = field(default_factory=dict)
    pooled_exponents: dict[str, BootstrapEstimate] = field(default_factory=dict)
    excluded: list[ExcludedStep] = field(default_factory=list)

    def to_json(self) -> dict:
        """The result as the JSON payload stores it."""
        return {
            "nfe": list(self.nfe),
            "substeps": self.substeps,
            "num_trajectories": self.num_trajectories,
            "prefixes": list(self.prefixes),
            "steps": [step.to_json() for step in self.steps],
            "exponents": {key: fit.to_json("exponent") for key, fit in self.exponents.items()},
            "pooled_exponents": {key: fit.to_json("exponent") for key, fit in self.pooled_exponents.items()},
            "excluded": [step.to_json() for step in self.excluded],
        }


def _substep_solver(family: str, scheduler, k: int, substeps: int):
    """(the sub-solver on [u_k, u_k + h_k] split into `substeps` equal parts in u, its times, node offsets in u)."""
    solver = scheduler.solver
    if family == "elf":
        start, end = solver.eval_times[k], solver.grid[k + 1]
        if end > 1.0 - solver.t_eps:
            return None
    else:
        start, end = solver.eval_time(k), solver.eval_time(k + 1)
    u0, u1 = solver_time(family, start), solver_time(family, end)
    times = [time_of(family, u0 + (u1 - u0) * j / substeps) for j in range(substeps + 1)]
    times[0], times[-1] = start, end
    if family == "elf":
        sub = ELFSolver(times, sde_gamma=0.0, noise_scale=solver.noise_scale, t_eps=solver.t_eps)
    else:
        sub = LangFlowSolver(torch.tensor(times, dtype=torch.float32), solver.gamma_min, solver.gamma_max)
    nodes = torch.tensor([solver_time(family, t) - solver_time(family, times[0]) for t in times], dtype=torch.float64)
    return sub, times, nodes


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
        nfe (`list[int]`): NFEs of the official sampler's trajectories.
        num_trajectories (`int`): trajectories per NFE.
        substeps (`int`): S ≥ 4, reference substeps per solver step (the paper: 32); the within-step fit compares
            the widths of m = S, S/2, … ≥ 2 substeps.
        generator (`torch.Generator`, *optional*): every draw (the trajectories, the bootstrap), on the CPU.
        batch_size (`int`): trajectories per pipeline call.
        bootstrap (`int`), confidence (`float`): the exponents' percentile bootstrap over trajectories.
        progress (`bool`): a tqdm bar.
    """
    family = check_family(pipe)
    if not isinstance(substeps, int) or substeps < 4:
        raise ValueError(f"substeps must be an integer ≥ 4 (two nested widths of ≥ 2 substeps), got {substeps!r}.")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    prefixes = nested_prefixes(substeps)
    result = StepScalingResult(nfe=list(nfe), substeps=substeps, num_trajectories=num_trajectories, prefixes=prefixes)
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
                if family == "elf" and k == updates - 1:
                    excluded.add((n, k, "final step to t = 1 (infinite width in u)"))
                    return None
                plan = _substep_solver(family, scheduler, k, substeps)
                if plan is None:
                    excluded.add((n, k, "ends above 1 − t_eps"))
                    return None
                sub, times, nodes = plan
                latents, predictions = step.model_input, [step.prediction]
                for j in range(substeps):
                    latents = sub.update(j, latents, predictions[-1])
                    timestep = torch.tensor(times[j + 1], dtype=torch.float32, device=latents.device)
                    predictions.append(clean_prediction(pipe, latents, timestep, step.self_conditioning))
                widths, corrections, contributions = [], [], []
                for m in prefixes:
                    width = float(nodes[m])
                    correction = step_average_correction(predictions[: m + 1], step_average_weights(nodes[: m + 1]))
                    widths.append(width)
                    corrections.append(correction.pow(2).flatten(1).mean(1).cpu())
                    contributions.append(latent_contribution(correction, width).pow(2).flatten(1).mean(1).cpu())
                rows.append(
                    {
                        "nfe": n,
                        "call": call,
                        "step": k,
                        "widths": widths,
                        "correction": torch.stack(corrections),  # (prefixes, trajectories) mean squares
                        "contribution": torch.stack(contributions),
                    }
                )
                return None

            pipe.denoise(size, n, generator, scheduler=scheduler, step_callback=measure, progress=False)
            bar.update()
    bar.close()
    if not rows:
        raise ValueError("No step could be measured; use more NFEs.")
    result.excluded = [ExcludedStep(n, k, why) for n, k, why in sorted(excluded)]
    for row in rows:
        result.steps.append(
            MeasuredStep(
                nfe=row["nfe"],
                call=row["call"],
                step=row["step"],
                width=row["widths"][0],
                widths=row["widths"],
                correction_rms=row["correction"].mean(1).sqrt().tolist(),
                latent_contribution_rms=row["contribution"].mean(1).sqrt().tolist(),
            )
        )
    widths = [torch.tensor(row["widths"], dtype=torch.float64) for row in rows]
    full_widths = torch.stack([w[0] for w in widths])
    for name, key in (("correction", "correction"), ("contribution", "latent_contribution")):
        squares = [row[name] for row in rows]  # per row: (prefixes, trajectories) mean squares

        def rms(draw: bool, squares=squares) -> list[torch.Tensor]:
            picked = squares
            if draw:
                picked = [s[:, torch.randint(s.shape[1], (s.shape[1],), generator=generator)] for s in squares]
            return [s.mean(1).sqrt() for s in picked]

        within, pooled = [], []
        for draw in [False] + [True] * max(bootstrap, 0):
            values = rms(draw)
            within.append(within_step_exponent(widths, values))
            pooled.append(fitted_exponent(full_widths, torch.stack([v[0] for v in values])))
        for target, draws in ((result.exponents, within), (result.pooled_exponents, pooled)):
            target[key] = BootstrapEstimate(
                draws[0], percentile_interval(draws[1:], confidence), confidence, bootstrap
            )
    return result
