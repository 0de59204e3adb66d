r"""The untied step (docs/algorithm.md §3.2-§3.4): Algorithm 1's arithmetic after the network call, in few passes.

[`untied_step`] is the one implementation of a step of Algorithm 1 (lines 3-6 of the paper's Algorithm 1, eqs. (6)-(13))
that the untied schedulers run: eagerly, or compiled (`torch.compile` of the same function, indexed by a step counter
on the device: [`untied_step_at`]). It reads a (B, L, D) tensor about fifteen times per step:

- H_k = p_k − E_k and d_k = p_k − O_k are the only differences formed; G_k = ‖H_k‖/‖d_k‖·d_k is never stored
  (g_b = ‖H_k‖/‖d_k‖ is one number per sample);
- C U_k = (1 + c)H_k − c·g_b·d_k − M_I(U_k), with c = η_O Δu_k and M_I(U_k) from the token sums of H_k and d_k,
  in two passes;
- Π_k: q_k = p_k + η_T μ_k + (η_T σ_k / RMS(C U_k))·C U_k in two passes;
- O and E with one `lerp` each; the SC transform F_k as one matrix product with the per-step operator prepared at
  `set_timesteps` (F_k itself when 2r ≥ D, else Q(I − diag ℓ_k) for m − (m Q(I − diag ℓ_k)) Qᵀ);
- every per-step number (κ_k, c_k, η_T σ_k, η_T μ_k, F_k) is a tensor prepared once per run on the prediction's
  device, so the step reads nothing back from the device and `torch.compile` traces it without specialising on a
  step's values.

The test oracle is the same step written one quantity at a time (the functions of [`history_directions`] and the
lab's `untied_sc_lab.ablations.correction_functions`, each exact on its own: rescaling by the largest magnitude before
squaring, shifting by one token before centring, `where` at every masked position), chained by the lab's schedulers
with `reference_chain` (tests/test_untied_step.py), and Algorithm 1 written out in float64
(tests/test_algorithm_reference.py).
The step agrees with the oracle within float rounding, with two documented exceptions, neither of which occurs in
sampling (predictions are O(1) and vary across positions):

- norms are taken without the oracle's rescaling, so entries beyond ~1e15 (float32 sums of squares overflow) or an
  H_k or p_k − O_k whose every entry is below ~1e-19 (they underflow) fall outside the agreement;
- C U_k is U_k minus its token mean, not shifted by one token first, so a U_k that is exactly constant across two or
  more active positions gives C U_k at rounding level (normalised to σ_k) rather than exactly 0 (Π_k = μ_k).

The step takes its inputs by name: the trajectory state E_k, O_k ([`UntiedState`]), the step's numbers
([`StepScalars`]), its tensors ([`StepOperators`]) and the run's switches ([`StepOptions`]); [`UntiedStepPlan`]
prepares all of them once per run.
"""

from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .transform import compute_dtype as _compute_dtype
from .transform import overlap_transform, retention


class StepScalars(NamedTuple):
    r"""
    The numbers of update step k, by name: in [`UntiedStepPlan`] each field holds the run's K_u values, a (K_u,)
    float64 tensor; the step gets step k's, 0-dim tensors in the compute dtype.

    Attributes:
        one_plus_c: 1 + c_k, with c_k = η_O Δu_k (0 when η_T = 0).
        c: c_k.
        kappa: κ_k, the solver's update share (O's averaging weight and â's factor).
        eta_sigma: η_T σ_k, the RMS of the correction.
        alpha: α, E's averaging weight.
        gate: 1[σ_k > 0] (the compiled step gates H_k with it; the eager step is told `active` instead).
    """

    one_plus_c: torch.Tensor | float
    c: torch.Tensor | float
    kappa: torch.Tensor | float
    eta_sigma: torch.Tensor | float
    alpha: torch.Tensor | float
    gate: torch.Tensor | float


class UntiedState(NamedTuple):
    """The averages the untied step carries from step to step: E_k and O_k, (B, L, D) (`None` when not tracked)."""

    ema: torch.Tensor | None = None
    solver_average: torch.Tensor | None = None


class StepOperators(NamedTuple):
    r"""
    The tensors of update step k, in the prediction's device (and dtype, or the compute dtype where noted).

    Attributes:
        eta_mean (`torch.Tensor` of shape `(D,)`, *optional*): η_T μ_k in the compute dtype (`None` when η_T = 0).
        transform (`torch.Tensor`, *optional*): F_{k+1} (D, D) or Q(I − diag ℓ) (D, r), per the options'
            `transform_kind`; `None` with `"matrix"`/`"low_rank"` means ℓ is all ones (m̃ = m).
        mask (`torch.Tensor` of shape `(B, L)`, *optional*): active positions (bool).
        basis, basis_t (`torch.Tensor`, *optional*): Q (D, r) and Qᵀ (r, D).
        rho_sq (`torch.Tensor`, *optional*): ρ² (r,), float64 (the online δ̄'s retention).
    """

    eta_mean: torch.Tensor | None = None
    transform: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    basis: torch.Tensor | None = None
    basis_t: torch.Tensor | None = None
    rho_sq: torch.Tensor | None = None


@dataclass(frozen=True)
class StepOptions:
    r"""
    The switches of a run's untied step (Python values: `torch.compile` specialises on them, once per run).

    Attributes:
        correct (`bool`): η_T > 0. online (`bool`): this trajectory's δ̄_k (H_k and G_k are formed even when η_T = 0).
        solver_direction (`bool`): G_k is formed (η_O > 0, or the online δ̄).
        routing (`str`): `"solver"`, `"self_conditioning"` or `"both"`.
        transform_kind (`str`, *optional*): `None` (η_R = 0), `"matrix"` (F_k, D × D, when 2r ≥ D), `"low_rank"`
            (Q(I − diag ℓ_k), D × r) or `"online"` (ℓ per sample, computed in the step).
        eps (`float`): the relative degeneracy threshold ε of G_k.
        strength, eps_fp, global_scaling: λ_R, ε_fp and the g_k switch of the online retention.
    """

    correct: bool
    online: bool
    solver_direction: bool
    routing: str
    transform_kind: str | None
    eps: float
    strength: float = 0.0
    eps_fp: float = 0.01
    global_scaling: bool = True

    @property
    def track_ema(self) -> bool:
        """E_{k+1} is formed: a later step reads H_k (the correction or the online δ̄)."""
        return self.correct or self.online

    @property
    def track_solver_average(self) -> bool:
        """O_{k+1} is formed: a later step reads G_k."""
        return self.track_ema and self.solver_direction


class UntiedStepOutput(NamedTuple):
    """
    What one untied step gives: q_k (the solver's input), m_{k+1} and m̃_{k+1} (the raw and the transformed
    self-conditioning input), the next state (E_{k+1}, O_{k+1}) and this trajectory's δ̄_k (B,) (online; else `None`).
    """

    solver_input: torch.Tensor
    raw_self_conditioning: torch.Tensor
    self_conditioning: torch.Tensor
    state: UntiedState
    cosine_distance: torch.Tensor | None


class StepTables(NamedTuple):
    """A run's per-step values stacked for the compiled step: [`StepScalars`] of (K_u,), η_T μ_k and F_k (or None)."""

    scalars: StepScalars
    eta_mean: torch.Tensor | None
    transform: torch.Tensor | None


@dataclass
class UntiedStepPlan:
    r"""
    What `set_timesteps` prepares for the untied step of one run: every per-step value of the K_u update steps.

    Attributes:
        scalars ([`StepScalars`]): each number of every step by name, (K_u,) float64 tensors (1 + c_k, c_k, κ_k,
            η_T σ_k, α, 1[σ_k > 0]).
        eta_t (`float`): η_T. mean (`torch.Tensor` of shape `(K_u, D)`, *optional*): μ_k (`None` when η_T = 0).
        active (`list[bool]`): σ_k > 0 (H_k = 0 on the other steps).
        options ([`StepOptions`]): the run's switches.
        retention (`torch.Tensor` of shape `(K_u, r)`, float64, *optional*): ℓ of the transform that ends step k
            (â = κ_k(1 − δ̄_k)), for `"matrix"` and `"low_rank"`.
        identity (`list[bool]`): ℓ of step k is all ones: m̃ = m exactly, as [`overlap_transform`] returns it.
        basis (`torch.Tensor`, *optional*): Q (D, r). rho_sq (`torch.Tensor`, *optional*): ρ² (r,), float64.
        mask (`torch.Tensor`, *optional*): the (B, L) active positions.

    All tensors are put on the run's device by `set_timesteps`: the step itself never copies from the host.
    """

    scalars: StepScalars
    eta_t: float
    mean: torch.Tensor | None
    active: list[bool]
    options: StepOptions
    retention: torch.Tensor | None
    identity: list[bool]
    basis: torch.Tensor | None
    rho_sq: torch.Tensor | None
    mask: torch.Tensor | None = None
    _cast: dict = field(default_factory=dict, repr=False)

    @property
    def transform_kind(self) -> str | None:
        return self.options.transform_kind

    @property
    def trivial(self) -> bool:
        """No correction, no transform, no online δ̄: the official step (the η_R = η_T = 0 sampler)."""
        return not self.options.correct and not self.options.online and self.transform_kind is None

    def tensors(self, prediction: torch.Tensor) -> "RunTensors":
        """
        The plan's tensors for `prediction` ([`RunTensors`]): on its device, scalars and η_T μ in its compute dtype
        (float32 for 16-bit predictions), Q and the transform operators in its dtype. Made at the first step of a run
        (one batched product builds every F_k), then reused.
        """
        key = (prediction.device, prediction.dtype)
        if key not in self._cast:
            self._cast[key] = self._make_tensors(prediction.device, prediction.dtype)
        return self._cast[key]

    def _make_tensors(self, device: torch.device, dtype: torch.dtype) -> "RunTensors":
        compute = _compute_dtype(dtype)
        steps = len(self.active)
        # Nothing here copies from the host: a copy would wait for the queued network call (the first step's).
        columns = StepScalars(*(column.to(device=device, dtype=compute) for column in self.scalars))
        # The eager step takes each step's numbers as 0-dim tensors: no indexing left for the step.
        scalars = [StepScalars(*values) for values in zip(*(column.unbind(0) for column in columns), strict=True)]
        mean_table = None
        eta_mean = [None] * steps
        if self.mean is not None:  # η_T·μ_k rounded as the pure functions round it: μ_k in the compute dtype, ×η_T
            mean_table = self.eta_t * self.mean.to(device=device, dtype=compute)
            eta_mean = mean_table.unbind(0)
        basis = basis_t = rho_sq = transform_table = None
        transforms = [None] * steps
        if self.basis is not None:
            basis = self.basis.to(device=device, dtype=dtype)
            basis_t = basis.T.contiguous()
        if self.rho_sq is not None:
            rho_sq = self.rho_sq if device.type == "mps" else self.rho_sq.to(device)  # MPS has no float64
        mask = self.mask.to(device=device, dtype=torch.bool) if self.mask is not None else None
        if self.transform_kind in ("matrix", "low_rank"):
            damping = (1.0 - self.retention).to(device=device, dtype=dtype)  # 1 − ℓ_k, (K_u, r)
            scaled = basis[None] * damping[:, None, :]  # Q(I − diag ℓ_k), (K_u, D, r)
            if self.transform_kind == "matrix":  # F_k = I − Q(I − diag ℓ_k)Qᵀ
                eye = torch.eye(basis.shape[0], device=device, dtype=dtype)
                scaled = eye - scaled @ basis_t
            # Where ℓ = 1 the operator is exactly I (or 0): the compiled step applies it, the eager one skips it.
            transform_table = scaled
            transforms = [None if same else op for same, op in zip(self.identity, scaled.unbind(0), strict=True)]
        run_operators = StepOperators(mask=mask, basis=basis, basis_t=basis_t, rho_sq=rho_sq)
        operators = [
            run_operators._replace(eta_mean=mean, transform=transform)
            for mean, transform in zip(eta_mean, transforms, strict=True)
        ]
        return RunTensors(scalars, operators, StepTables(columns, mean_table, transform_table), run_operators)


class RunTensors(NamedTuple):
    """
    A run's tensors on one device and dtype ([`UntiedStepPlan.tensors`]): per step, the eager step's
    [`StepScalars`] and [`StepOperators`]; for the compiled step, the [`StepTables`] and the [`StepOperators`]
    shared by all steps.
    """

    scalars: list[StepScalars]
    operators: list[StepOperators]
    tables: StepTables
    run_operators: StepOperators


def _cast(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` in `dtype`, without a call when it already is (each call costs dispatch time, even a no-op)."""
    return x if x.dtype == dtype else x.to(dtype)


def choose_transform_kind(rank: int, width: int) -> str:
    """`"matrix"` when 2r ≥ D (one product of width D costs less than two of width r), else `"low_rank"`."""
    return "matrix" if 2 * rank >= width else "low_rank"


def untied_step(
    prediction: torch.Tensor,
    state: UntiedState,
    scalars: StepScalars,
    operators: StepOperators,
    options: StepOptions,
    *,
    active: bool = True,
    gated: bool = False,
    out: dict[str, torch.Tensor] | None = None,
) -> UntiedStepOutput:
    r"""
    One update step of Algorithm 1 after the network call (docs/algorithm.md §3.4), without the solver update:
    the correction A_k (eqs. (9)-(11)), the routing (eq. (12)), E_{k+1} (eq. (6)), O_{k+1} (eq. (8)), the online
    δ̄_k and m̃_{k+1} = F_{k+1} m_{k+1} (eqs. (7), (13)).

    Without `out` it is pure: it returns new tensors and mutates no input (the form `torch.compile` traces). With
    `out`, (B, L, D) buffers of the caller's that no input aliases, it writes H_k (then C U_k), p_k − O_k, E_{k+1}
    and O_{k+1} into them instead of allocating (on a CPU, a fresh 8 MB tensor costs several times the arithmetic
    written into it); q_k and m̃_{k+1}, handed out to the caller, are always new tensors. Equal, within float
    rounding, to the oracle: [`history_direction`], [`solver_history_direction`], [`combined_direction`],
    [`moment_projection`], [`token_cosine_distance`], [`masked_token_mean`], [`retention`] and
    [`overlap_transform`] chained.

    Args:
        prediction (`torch.Tensor`): p_k, (B, L, D).
        state ([`UntiedState`]): E_k and O_k in p_k's dtype (`None` where not tracked).
        scalars ([`StepScalars`]): step k's numbers, 0-dim tensors in the compute dtype.
        operators ([`StepOperators`]): step k's tensors (η_T μ_k, the transform) and the run's (mask, Q, Qᵀ, ρ²).
        options ([`StepOptions`]): the run's switches.
        active (`bool`): σ_k > 0 (else H_k = 0: G_k = 0, C U_k = 0, Π_k = μ_k, δ̃_k = 0).
        gated (`bool`): H_k = `scalars.gate`·(p_k − E_k) with `active=True`, so that one traced graph serves every
            step; H_k = 0 then gives exactly what `active=False` gives.
        out (`dict`, *optional*): buffers `"history"` (p_k's dtype), `"difference"` (compute dtype), `"ema"` and
            `"solver_average"` (p_k's dtype), each (B, L, D); any may be missing. E_{k+1} and O_{k+1} are returned
            in theirs, so they must not be E_k or O_k themselves.

    Returns:
        [`UntiedStepOutput`]: q_k, m_{k+1}, m̃_{k+1}, the next [`UntiedState`] and the online δ̄_k.
    """
    p = prediction
    dtype = p.dtype
    compute = _compute_dtype(dtype)
    one_plus_c, c, kappa, eta_sigma, alpha = (
        scalars.one_plus_c,
        scalars.c,
        scalars.kappa,
        scalars.eta_sigma,
        scalars.alpha,
    )
    history_gate = scalars.gate if gated else None
    eta_mean, mask, transform = operators.eta_mean, operators.mask, operators.transform
    ema, solver_average = state.ema, state.solver_average
    correct, online, solver_direction, eps = options.correct, options.online, options.solver_direction, options.eps
    transform_kind = options.transform_kind
    length, width = p.shape[1], p.shape[2]
    buffers = out or {}

    def into(name: str, like_dtype: torch.dtype):
        """A preallocated buffer to write into (eager mode), or None: allocate (the compiled, functional form)."""
        buffer = buffers.get(name)
        return buffer if buffer is not None and buffer.dtype == like_dtype else None

    mask3 = mask[..., None] if mask is not None else None
    # Active positions per sample: a (B, 1, 1) tensor with a mask, else the number L.
    count = mask.sum(dim=1).to(compute).clamp(min=1)[:, None, None] if mask is not None else length
    corrected = p
    distance = None
    if (correct or online) and not active:
        # H_k = 0: G_k = 0, U_k = 0, Π_k = μ_k at active positions, δ̃_k = 0.
        if online:
            distance = torch.zeros(p.shape[0], dtype=dtype, device=p.device)
        if correct:
            correction = eta_mean if mask3 is None else torch.where(mask3, eta_mean, 0.0)
            corrected = _cast(_cast(p, compute) + correction, dtype)
    elif correct or online:
        # H_k = p_k − E_k (eqs. (9), (36)), formed in p_k's dtype as `history_direction` does (a buffer of its own: centred below).
        h = _cast(torch.sub(p, ema, out=into("history", dtype)), compute)
        if history_gate is not None:
            h = h.mul_(history_gate)
        pc = _cast(p, compute)
        if mask3 is not None:
            h = torch.where(mask3, h, 0.0)
        if solver_direction:
            d = torch.sub(pc, _cast(solver_average, compute), out=into("difference", compute))  # p_k − O_k
            pm = pc
            if mask3 is not None:
                d, pm = torch.where(mask3, d, 0.0), torch.where(mask3, pc, 0.0)
            if online:  # per-token sums first: the per-sample norms are their sums over positions
                token_h2, token_d2 = torch.linalg.vecdot(h, h), torch.linalg.vecdot(d, d)
                token_hd = torch.linalg.vecdot(h, d)
                norm_h = token_h2.sum(dim=1).sqrt()[:, None, None]
                norm_d = token_d2.sum(dim=1).sqrt()[:, None, None]
            else:
                norm_h = torch.linalg.vector_norm(h, dim=(1, 2), keepdim=True)
                norm_d = torch.linalg.vector_norm(d, dim=(1, 2), keepdim=True)
            threshold = eps * torch.linalg.vector_norm(pm, dim=(1, 2), keepdim=True)
            valid = (norm_h > threshold) & (norm_d > threshold)
            g = torch.where(valid, norm_h / norm_d, 0.0)  # G_k = g·d_k (eqs. (9), (37)); (B, 1, 1)
            if online:
                # δ̃_{k,n} = min{1, 1 − cos(H_n, G_n)} (below eq. (40)), and cos(H_n, g·d_n) = cos(H_n, d_n) for g > 0; 0 if degenerate.
                token_valid = (token_h2 > 0) & (token_d2 > 0) & valid[:, :, 0]
                cosine = token_hd / (token_h2 * token_d2).sqrt()
                tokens = torch.where(token_valid, (1 - cosine).clamp(0.0, 1.0), 0.0)
                distance = _cast(tokens.sum(dim=1) / (count[:, 0, 0] if mask is not None else count), dtype)
        if correct:
            # C U_k with U_k = (1 + c)H_k − c·g·d_k (eqs. (10), (38)): minus the active-position mean M_I(U_k), zero elsewhere; formed
            # in H_k's place when H_k has a buffer (it is not read again).
            sum_h = h.sum(dim=1, keepdim=True)
            in_place = h if out is not None else None
            if solver_direction:
                cg = c * g
                negative_mean = torch.addcmul(cg * d.sum(dim=1, keepdim=True), sum_h, one_plus_c, value=-1.0) / count
                centred = torch.addcmul(negative_mean, h, one_plus_c, out=in_place).addcmul_(d, cg, value=-1.0)
            elif mask is None:  # η_O = 0: U_k = H_k
                centred = torch.sub(h, sum_h, alpha=1 / count, out=in_place)
            else:
                centred = torch.sub(h, sum_h / count, out=in_place)
            if mask3 is not None:
                centred = torch.where(mask3, centred, 0.0)
            # Π_k (eq. (11)): η_T σ_k / RMS(C U_k), RMS = ‖C U_k‖ / sqrt(n·D); Π_k = μ_k where C U_k = 0.
            norm = torch.linalg.vector_norm(centred, dim=(1, 2), keepdim=True)
            scale = torch.where(norm > 0, eta_sigma * (count * width) ** 0.5 / norm, 0.0)
            if mask3 is None:  # p_k + A_k, A_k = η_T Π_k(U_k) = η_T μ_k + scale·C U_k; a new tensor (returned)
                corrected = torch.addcmul(pc, centred, scale).add_(eta_mean)
            else:
                corrected = torch.where(mask3, torch.addcmul(eta_mean, centred, scale), 0.0).add_(pc)
            corrected = _cast(corrected, dtype)
    # Routing (eq. (12)): the paper's sampler hands q_k = p_k + A_k to the solver and O, m_{k+1} = p_k.
    solver_input = p if options.routing == "self_conditioning" else corrected
    next_raw = p if options.routing == "solver" else corrected
    new_ema = new_average = None
    if options.track_ema:  # E_{k+1} = (1 − α)E_k + α p_k (eq. (6))
        new_ema = torch.lerp(ema, p, _cast(alpha, dtype), out=into("ema", dtype))
    if options.track_solver_average:  # O_{k+1} = (1 − κ_k)O_k + κ_k q_k (eq. (8))
        new_average = torch.lerp(solver_average, solver_input, _cast(kappa, dtype), out=into("solver_average", dtype))
    # m̃_{k+1} = F_{k+1} m_{k+1} (eqs. (7), (35)), the next network's self-conditioning input.
    if transform_kind == "online":
        a_hat = _cast(kappa, dtype) * (1 - distance)  # â_{k+1} = κ_k(1 − δ̄_k) (eq. (13)), one per sample
        ell = retention(operators.rho_sq, a_hat, options.strength, options.eps_fp, options.global_scaling)
        self_conditioning = overlap_transform(next_raw, operators.basis, ell.to(dtype))
    elif transform is None:
        self_conditioning = next_raw
    elif transform_kind == "matrix":
        self_conditioning = next_raw @ transform
    else:  # low rank: m − (m Q(I − diag ℓ)) Qᵀ, the subtraction inside the second product
        flat = next_raw.reshape(-1, width)
        self_conditioning = torch.addmm(flat, flat @ transform, operators.basis_t, alpha=-1.0).view(next_raw.shape)
    return UntiedStepOutput(solver_input, next_raw, self_conditioning, UntiedState(new_ema, new_average), distance)


def untied_step_at(
    step: torch.Tensor,
    prediction: torch.Tensor,
    state: UntiedState,
    tables: StepTables,
    operators: StepOperators,
    options: StepOptions,
) -> tuple[UntiedStepOutput, torch.Tensor]:
    r"""
    [`untied_step`] at update step `step` (a 0-dim int64 tensor on the prediction's device), reading that
    step's row of the per-run tables in the step itself; returns its output and `step + 1`.

    The form `torch.compile` gets (`UntiedSelfConditioningMixin.compile_step`): every input is the same tensor at
    every step (no per-step view whose storage offset or value a graph would specialise on), and the σ_k = 0 steps
    run through the same graph with H_k gated to 0, so a run compiles one graph per shape.

    Args:
        step (`torch.Tensor`): k, 0-dim int64.
        tables ([`StepTables`]): the [`StepScalars`] of every step ((K_u,) each), η_T μ_k (K_u, D) and F_k (K_u, D, D) or
            Q(I − diag ℓ_k) (K_u, D, r) (exactly I or 0 where ℓ_k = 1); the last two may be `None`.
        prediction, state, operators, options: as for [`untied_step`] (`operators` without the per-step
            `eta_mean` and `transform`, which come from `tables`).
    """
    index = step.reshape(1)  # index_select, not [step]: indexing with a tensor would read it back (`.item()`)
    scalars = StepScalars(*(column.index_select(0, index)[0] for column in tables.scalars))
    operators = operators._replace(
        eta_mean=tables.eta_mean.index_select(0, index)[0] if tables.eta_mean is not None else None,
        transform=tables.transform.index_select(0, index)[0] if tables.transform is not None else None,
    )
    return untied_step(prediction, state, scalars, operators, options, gated=True), step + 1
