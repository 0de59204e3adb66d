"""The pure math of untied self-conditioning (docs/algorithm.md §3.1–§3.5; paper §4 and Appendix B).

Every function here is stateless: it takes the tensors of one step and returns a new tensor, never mutating its
inputs and never drawing random numbers. Chained, they are the test oracle of the untied step ([`untied_step`],
which computes the same quantities in few passes), the lab's direction controls, and the calibration's reference
recurrence (eq. (40)); whoever chains them holds the trajectory state (E_k, O_k, m_k).

Conventions shared by all functions:

- Predictions and corrections have shape (B, L, D): batch, positions, width.
- `mask` is an optional (B, L) bool tensor, True at *active* positions (docs/algorithm.md §3.5). `None` means all
  positions are active. The mask affects the correction only: G, the cosine distance and Π are zero at inactive
  positions, and every per-sample norm, mean and RMS runs over active positions only.
- Any float dtype and any device. Norms, means and RMS of float16/bfloat16 inputs are computed in float32 and the
  result is returned in the input's dtype.
- Scale-invariant quantities (directions, cosines, C U / RMS(C U)) are computed on tensors divided by their largest
  magnitude, so that squaring neither overflows nor underflows: finite inputs never give NaN/Inf, and an RMS or norm is
  zero only when the tensor is exactly zero.
"""

import torch

from .transform import compute_dtype as _compute_dtype
from .transform import overlap_transform, retention  # noqa: F401  (part of the functions of each quantity)


def _active_mask(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The (B, L) bool mask of active positions of a (B, L, D) tensor; all True when `mask` is None."""
    if x.ndim != 3:
        raise ValueError(
            f"Expected a (B, L, D) tensor, got shape {tuple(x.shape)}; add the missing batch/position axes."
        )
    if mask is None:
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    if tuple(mask.shape) != tuple(x.shape[:2]):
        raise ValueError(
            f"`mask` must have shape (B, L) = {tuple(x.shape[:2])} to match the (B, L, D) input, got {tuple(mask.shape)}."
        )
    return mask.to(device=x.device, dtype=torch.bool)


def _masked(x: torch.Tensor, active: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` in `dtype`, with inactive positions set to zero (`where`, not a product, so they cannot leak)."""
    return torch.where(active[..., None], x.to(dtype), 0.0)


def _sample_scale(*tensors: torch.Tensor) -> torch.Tensor:
    """Per-sample largest magnitude over (L, D) of all `tensors`, shape (B, 1, 1); 1 where all are zero."""
    scale = torch.stack([t.abs().amax(dim=(1, 2), keepdim=True) for t in tensors]).amax(dim=0)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _token_scale(x: torch.Tensor) -> torch.Tensor:
    """Per-token largest magnitude over D, shape (B, L, 1); 1 where the token vector is zero."""
    scale = x.abs().amax(dim=-1, keepdim=True)
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def _sample_norm(x: torch.Tensor) -> torch.Tensor:
    """Per-sample Frobenius norm over (L, D), shape (B, 1, 1)."""
    return torch.linalg.vector_norm(x, dim=(1, 2), keepdim=True)


def history_direction(prediction: torch.Tensor, ema: torch.Tensor, active: bool = True) -> torch.Tensor:
    r"""
    The EMA residual H_k. Paper eq. (36), docs/algorithm.md §3.2:

        H_k = 1[σ_k > 0] (p_k − E_k).

    The position mask is not applied here: G_k, the cosine distance and Π_k ignore inactive positions, so H_k's values
    there never reach the correction A_k.

    Args:
        prediction (`torch.Tensor`): p_k, shape (B, L, D).
        ema (`torch.Tensor`): E_k, the EMA of raw predictions (zeros at k = 0), broadcastable to `prediction`.
        active (`bool`): the step gate 1[σ_k > 0].

    Returns:
        `torch.Tensor`: H_k, shape and dtype of `prediction`; zeros when the step is inactive.
    """
    if not active:
        return torch.zeros_like(prediction)
    return (prediction - ema).to(prediction.dtype)


def solver_history_direction(
    prediction: torch.Tensor,
    history: torch.Tensor,
    solver_average: torch.Tensor,
    mask: torch.Tensor | None = None,
    eps: float = 1e-12,
) -> torch.Tensor:
    r"""
    The solver-history direction G_k, rescaled samplewise to ‖H_k‖. Paper eq. (37), the same as
    eq. (9); docs/algorithm.md §3.2 and §3.5:

        G_k = ‖H_k‖_F (p_k − O_k) / ‖p_k − O_k‖_F   if ‖H_k‖_F > ε‖p_k‖_F and ‖p_k − O_k‖_F > ε‖p_k‖_F,   else 0,

    per sample, with every Frobenius norm over the active positions × D. The paper's absolute ε is made relative to
    ‖p_k‖ [choice, docs/algorithm.md §3.5], so that the test does not depend on the latent's scale.

    Args:
        prediction (`torch.Tensor`): p_k, shape (B, L, D).
        history (`torch.Tensor`): H_k from [`history_direction`], shape (B, L, D).
        solver_average (`torch.Tensor`): O_k, the running average of predictions handed to the solver, (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.
        eps (`float`): the relative degeneracy threshold ε.

    Returns:
        `torch.Tensor`: G_k, shape and dtype of `prediction`; zero at inactive positions and for degenerate samples.
    """
    active = _active_mask(mask, prediction)
    dtype = _compute_dtype(prediction.dtype)
    p, h, o = (_masked(x, active, dtype) for x in (prediction, history, solver_average))
    # One common scale per sample keeps all three norms comparable and their squares within range.
    scale = _sample_scale(p, h, o)
    p, h, o = p / scale, h / scale, o / scale
    difference = p - o
    norm_h, norm_d, norm_p = _sample_norm(h), _sample_norm(difference), _sample_norm(p)
    valid = (norm_h > eps * norm_p) & (norm_d > eps * norm_p)
    unit = difference / torch.where(valid, norm_d, torch.ones_like(norm_d))
    # (unit · ‖H_s‖) · scale: the first product is bounded by ‖H_s‖, so only a G entry that is itself too large overflows.
    g = torch.where(valid, unit * norm_h * scale, 0.0)
    return g.to(prediction.dtype)


def combined_direction(
    history: torch.Tensor, solver_direction: torch.Tensor, eta_o: float, delta_u: float
) -> torch.Tensor:
    r"""
    The combined correction direction U_k. Paper eq. (10), the same as
    eq. (38); docs/algorithm.md §3.2:

        U_k = H_k + η_O Δu_k (H_k − G_k).

    Args:
        history (`torch.Tensor`): H_k, shape (B, L, D).
        solver_direction (`torch.Tensor`): G_k, shape (B, L, D).
        eta_o (`float`): the disagreement weight η_O ≥ 0.
        delta_u (`float`): the normalised step width Δu_k ∈ [0, 1].

    Returns:
        `torch.Tensor`: U_k, shape and dtype of `history`; `history` itself when η_O Δu_k = 0 (U_k = H_k exactly).
    """
    coefficient = eta_o * delta_u
    if coefficient == 0:
        return history
    dtype = _compute_dtype(history.dtype)
    h = history.to(dtype)
    return (h + coefficient * (h - solver_direction.to(dtype))).to(history.dtype)


def token_cosine_distance(
    history: torch.Tensor, solver_direction: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""
    The per-token clipped cosine distance between H_k and G_k. Paper eq. (40) (the δ̃ below it) and eq. (41),
    whose token mean δ̄_k gates the dampening in eq. (13); docs/algorithm.md §4.3 (and §3.6, the online δ̄):

        δ̃_{k,n} = min{1, 1 − cos(H_{k,n}, G_{k,n})}   over the D axis, for active n with H_{k,n} ≠ 0 and G_{k,n} ≠ 0,
        δ̃_{k,n} = 0                                   otherwise (degenerate token or inactive position).

    Rounding can push cos slightly above 1; the result is clamped to [0, 1].

    Args:
        history (`torch.Tensor`): H_k (or H̃_k in calibration), shape (B, L, D).
        solver_direction (`torch.Tensor`): G_k (or G̃_k), shape (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: δ̃_k, shape (B, L), in `history`'s dtype, values in [0, 1].
    """
    active = _active_mask(mask, history)
    dtype = _compute_dtype(history.dtype)
    h, g = _masked(history, active, dtype), _masked(solver_direction, active, dtype)
    # Cosine is scale invariant: normalising each token by its largest entry keeps the norms ≥ 1 or exactly 0.
    h, g = h / _token_scale(h), g / _token_scale(g)
    norm_h, norm_g = torch.linalg.vector_norm(h, dim=-1), torch.linalg.vector_norm(g, dim=-1)
    valid = (norm_h > 0) & (norm_g > 0)
    cosine = (h * g).sum(dim=-1) / torch.where(valid, norm_h * norm_g, torch.ones_like(norm_h))
    distance = torch.where(valid, (1 - cosine).clamp(0.0, 1.0), 0.0)
    return distance.to(history.dtype)


def centre_tokens(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    The token centring C_I x = x − M_I(x), per sample and channel over the active positions I
    (docs/algorithm.md §3.2; the C of paper eqs. (11), (41), (42)); zero at inactive positions.

    Computed after subtracting one active token (the first) from all, which leaves C_I x unchanged mathematically but
    makes it exactly zero when x is constant across the active positions; and on x divided by its largest magnitude
    per sample, so the sum over positions cannot overflow.

    Args:
        x (`torch.Tensor`): shape (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: C_I x, shape (B, L, D), in float32 for float16/bfloat16 `x`, else in `x`'s dtype.
    """
    active = _active_mask(mask, x)
    dtype = _compute_dtype(x.dtype)
    active_3d = active[..., None]
    values = _masked(x, active, dtype)
    scale = _sample_scale(values)
    values = values / scale
    first = active.to(torch.uint8).argmax(dim=1)
    reference = values.gather(1, first[:, None, None].expand(-1, 1, values.shape[-1]))
    shifted = torch.where(active_3d, values - reference, 0.0)
    count = active.sum(dim=1).to(dtype).clamp(min=1)[:, None, None]
    return torch.where(active_3d, shifted - shifted.sum(dim=1, keepdim=True) / count, 0.0) * scale


def moment_projection(
    direction: torch.Tensor, mean: torch.Tensor, rms: float | torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    r"""
    The moment-matched correction Π_k(U_k). Paper eq. (11), docs/algorithm.md §3.2 and §3.5:

        Π_k(U) = μ_k + σ_k C U / RMS(C U),

    per sample, where C subtracts the per-channel token mean over active positions (sum/n), and
    RMS(C U) = sqrt(‖C U‖_F² / (n·D)) over active positions × D. Then M_I(Π) = μ_k and RMS_I(C Π) = σ_k
    (paper eq. (42), App. B.5). The correction is A_k = η_T Π_k(U_k) (done by the caller).

    Degenerate cases: Π = μ_k where RMS(C U) = 0 exactly; Π = 0 at inactive positions; a sample with no active
    position is all zeros. C U is [`centre_tokens`]'s, exactly zero when U is constant across positions.

    Args:
        direction (`torch.Tensor`): U_k, shape (B, L, D).
        mean (`torch.Tensor`): μ_k, shape (D,) (anything broadcastable to (B, L, D)).
        rms (`float` or `torch.Tensor`): σ_k ≥ 0, a scalar or a (B,) tensor.
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: Π_k(U_k), shape and dtype of `direction`.
    """
    active = _active_mask(mask, direction)
    dtype = _compute_dtype(direction.dtype)
    active_3d = active[..., None]
    u = _masked(direction, active, dtype)
    u = u / _sample_scale(u)  # Π is invariant to U's scale; this keeps the differences below finite
    centred = centre_tokens(u, active)
    count = active.sum(dim=1).to(dtype).clamp(min=1)[:, None, None]
    # Rescale so the largest entry is 1: the RMS is then ≥ 1/sqrt(n·D) or exactly 0, never a lost underflow.
    centred = centred / _sample_scale(centred)
    rms_centred = torch.sqrt(centred.square().sum(dim=(1, 2), keepdim=True) / (count * u.shape[-1]))
    unit = centred / torch.where(rms_centred > 0, rms_centred, torch.ones_like(rms_centred))
    sigma = torch.as_tensor(rms, dtype=dtype, device=u.device)
    sigma = sigma.reshape(-1, 1, 1) if sigma.ndim == 1 else sigma
    projection = mean.to(device=u.device, dtype=dtype) + sigma * unit
    return torch.where(active_3d, projection, 0.0).to(direction.dtype)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """
    The per-sample mean of `values`, shape (B, L) or (B, L, D), over the positions where `mask` (B, L) is set; zero
    for a sample with none. A plain sum/count in `values`' dtype, differentiable: for values of moderate size, such
    as per-token training losses. [`masked_token_mean`] is the overflow-safe mean built on it, for any magnitude.
    """
    weights = mask.to(values.dtype).reshape(*mask.shape, *(1,) * (values.ndim - 2))
    return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)


def masked_token_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    The per-sample token mean over active positions, M_I(x). Paper eq. (41) (μ_k is the bank average of
    M_I(Ũ_k), δ̄_k that of M_I(δ̃_k)); docs/algorithm.md §4.3 and §3.5:

        M_I(x) = (1/|I|) Σ_{n ∈ I} x_n.

    Args:
        x (`torch.Tensor`): shape (B, L, D), or (B, L) for one value per token (e.g. the cosine distances δ̃_k).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: shape (B, D) (or (B,) for a (B, L) `x`) in `x`'s dtype; zeros for a sample with no active
        position.
    """
    if x.ndim == 2:
        return masked_token_mean(x[..., None], mask)[:, 0]
    active = _active_mask(mask, x)
    dtype = _compute_dtype(x.dtype)
    values = _masked(x, active, dtype)
    scale = _sample_scale(values)  # the sum of L large entries could overflow; the scaled mean cannot
    return (masked_mean(values / scale, active) * scale[:, :, 0]).to(x.dtype)
