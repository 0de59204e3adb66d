"""The solver correction's functions of each quantity: U_k, the token centring C and Π_k (docs/algorithm.md §3.2,
§3.5; paper eqs. (10), (11)).

Chained with the library's H_k, G_k, δ̃_k, M_I ([`history_direction`], [`solver_history_direction`],
[`token_cosine_distance`], [`masked_token_mean`]) and the SC transform ([`retention`], [`overlap_transform`]), they
are the untied step written one quantity at a time: the oracle the library's [`untied_step`] is tested against
(the lab's schedulers with `reference_chain`), and the direction controls' Π_k. Each is stateless and exact on its
own, with the shapes, masks and dtypes of `untied_sc.schedulers`' history directions.
"""

import torch

from untied_sc.schedulers import active_mask, compute_dtype, sample_scale, zero_inactive


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
    dtype = compute_dtype(history.dtype)
    h = history.to(dtype)
    return (h + coefficient * (h - solver_direction.to(dtype))).to(history.dtype)


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
    active = active_mask(mask, x)
    dtype = compute_dtype(x.dtype)
    active_3d = active[..., None]
    values = zero_inactive(x, active, dtype)
    scale = sample_scale(values)
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
    active = active_mask(mask, direction)
    dtype = compute_dtype(direction.dtype)
    active_3d = active[..., None]
    u = zero_inactive(direction, active, dtype)
    u = u / sample_scale(u)  # Π is invariant to U's scale; this keeps the differences below finite
    centred = centre_tokens(u, active)
    count = active.sum(dim=1).to(dtype).clamp(min=1)[:, None, None]
    # Rescale so the largest entry is 1: the RMS is then ≥ 1/sqrt(n·D) or exactly 0, never a lost underflow.
    centred = centred / sample_scale(centred)
    rms_centred = torch.sqrt(centred.square().sum(dim=(1, 2), keepdim=True) / (count * u.shape[-1]))
    unit = centred / torch.where(rms_centred > 0, rms_centred, torch.ones_like(rms_centred))
    sigma = torch.as_tensor(rms, dtype=dtype, device=u.device)
    sigma = sigma.reshape(-1, 1, 1) if sigma.ndim == 1 else sigma
    projection = mean.to(device=u.device, dtype=dtype) + sigma * unit
    return torch.where(active_3d, projection, 0.0).to(direction.dtype)
