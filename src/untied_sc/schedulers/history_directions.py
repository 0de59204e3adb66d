"""The history directions and the masked token means (docs/algorithm.md §3.2, §3.5, §4.3; paper App. B).

H_k (eq. (36)), G_k (eqs. (9), (37)), the per-token cosine distance δ̃_k (eq. (40)) and the token mean M_I
(eq. (41)), each a stateless function of one step's tensors: it returns a new tensor, never mutates its inputs and
never draws random numbers. The calibration's reference recurrence (eq. (40)) chains them; the untied step
([`untied_step`]) computes the same quantities in few passes, and is tested against them chained. The helpers
[`active_mask`], [`zero_inactive`] and [`sample_scale`] are the conventions below, for functions built on these.

Conventions shared by all functions:

- Predictions and corrections have shape (B, L, D): batch, positions, width.
- `mask` is an optional (B, L) bool tensor, True at *active* positions (docs/algorithm.md §3.5). `None` means all
  positions are active. The mask affects the correction only: G and the cosine distance are zero at inactive
  positions, and every per-sample norm and mean runs over active positions only.
- Any float dtype and any device. Norms and means of float16/bfloat16 inputs are computed in float32 and the
  result is returned in the input's dtype.
- Scale-invariant quantities (directions, cosines) are computed on tensors divided by their largest magnitude, so
  that squaring neither overflows nor underflows: finite inputs never give NaN/Inf, and a norm is zero only when the
  tensor is exactly zero.
"""

import torch

from .transform import compute_dtype


def active_mask(mask: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The (B, L) bool mask of active positions of a (B, L, D) tensor `x`; all True when `mask` is None (a shape
    that is not (B, L, D), or a mask of another (B, L), is refused)."""
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


def zero_inactive(x: torch.Tensor, active: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`x` in `dtype`, with inactive positions set to zero (`where`, not a product, so they cannot leak)."""
    return torch.where(active[..., None], x.to(dtype), 0.0)


def sample_scale(*tensors: torch.Tensor) -> torch.Tensor:
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
    active = active_mask(mask, prediction)
    dtype = compute_dtype(prediction.dtype)
    p, h, o = (zero_inactive(x, active, dtype) for x in (prediction, history, solver_average))
    # One common scale per sample keeps all three norms comparable and their squares within range.
    scale = sample_scale(p, h, o)
    p, h, o = p / scale, h / scale, o / scale
    difference = p - o
    norm_h, norm_d, norm_p = _sample_norm(h), _sample_norm(difference), _sample_norm(p)
    valid = (norm_h > eps * norm_p) & (norm_d > eps * norm_p)
    unit = difference / torch.where(valid, norm_d, torch.ones_like(norm_d))
    # (unit · ‖H_s‖) · scale: the first product is bounded by ‖H_s‖, so only a G entry that is itself too large overflows.
    g = torch.where(valid, unit * norm_h * scale, 0.0)
    return g.to(prediction.dtype)


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
    active = active_mask(mask, history)
    dtype = compute_dtype(history.dtype)
    h, g = zero_inactive(history, active, dtype), zero_inactive(solver_direction, active, dtype)
    # Cosine is scale invariant: normalising each token by its largest entry keeps the norms ≥ 1 or exactly 0.
    h, g = h / _token_scale(h), g / _token_scale(g)
    norm_h, norm_g = torch.linalg.vector_norm(h, dim=-1), torch.linalg.vector_norm(g, dim=-1)
    valid = (norm_h > 0) & (norm_g > 0)
    cosine = (h * g).sum(dim=-1) / torch.where(valid, norm_h * norm_g, torch.ones_like(norm_h))
    distance = torch.where(valid, (1 - cosine).clamp(0.0, 1.0), 0.0)
    return distance.to(history.dtype)


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
    active = active_mask(mask, x)
    dtype = compute_dtype(x.dtype)
    values = zero_inactive(x, active, dtype)
    scale = sample_scale(values)  # the sum of L large entries could overflow; the scaled mean cannot
    return (masked_mean(values / scale, active) * scale[:, :, 0]).to(x.dtype)
