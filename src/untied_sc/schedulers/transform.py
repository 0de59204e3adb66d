"""The SC transform F_k (docs/algorithm.md §3.1; paper eqs. (7), (34), (35)): the retention ℓ_k and m̃_k = F_k m_k.

Shared by the untied step ([`untied_step`]), the flow maps' untied scheduler and the lab's chained oracle.
"""

import torch


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for dtypes narrower than 32 bits (their sums of squares lose too much), else the dtype itself."""
    return torch.float32 if torch.finfo(dtype).bits < 32 else dtype


def retention(
    rho_sq: torch.Tensor,
    a_hat: float | torch.Tensor,
    strength: float,
    eps_fp: float = 0.01,
    global_scaling: bool = True,
) -> torch.Tensor:
    r"""
    Retention fractions ℓ_k of the SC transform. Paper eq. (34), docs/algorithm.md §3.1:

        b_{k,i} = max(1 − â_k ρ_i², ε_fp),
        g_k     = (∏_{i=1}^r b_{k,i})^{1/r}      (= exp(mean_i log b_{k,i}), over all r directions),
        ℓ_{k,i} = (g_k b_{k,i})^{λ_R},           λ_R = λ_R^(0)·η_R.

    With `global_scaling=False` the common factor g_k is dropped: ℓ_{k,i} = b_{k,i}^{λ_R} (the ablation of the paper's
    Table 10; docs/algorithm.md §3.6).

    Args:
        rho_sq (`torch.Tensor`): squared canonical cosines ρ_i² ∈ [0, 1], shape (r,).
        a_hat (`float` or `torch.Tensor` of shape `(B,)`): â_k = κ_{k−1}(1 − δ̄_{k−1}); 0 at the first step. A
            tensor gives one â per sample (the online δ̄ of docs/algorithm.md §3.6), all computed at once.
        strength (`float`): the effective exponent λ_R ≥ 0.
        eps_fp (`float`): the floor ε_fp ∈ (0, 1] that keeps every direction partly retained.
        global_scaling (`bool`): multiply b by the geometric mean g_k (True, the paper's sampler) or not.

    Returns:
        `torch.Tensor`: ℓ_k, shape (r,) for a float â or (B, r) for a tensor, in `rho_sq`'s dtype, on `rho_sq`'s
        device (a float â) or `a_hat`'s (a tensor); exactly ones of shape (r,) when `strength` is 0.
    """
    if strength < 0:
        raise ValueError(f"`strength` (λ_R = λ_R^(0)·η_R) must be ≥ 0, got {strength}; pass a nonnegative η_R.")
    if not 0 < eps_fp <= 1:
        raise ValueError(f"`eps_fp` must lie in (0, 1], got {eps_fp}.")
    if strength == 0:
        # F = I exactly: the sampler with η_R = 0 must reproduce the official one bit for bit.
        return torch.ones_like(rho_sq)
    per_sample = isinstance(a_hat, torch.Tensor)
    if per_sample and a_hat.ndim != 1:
        raise ValueError(f"A tensor `a_hat` must have shape (B,), one â per sample; got {tuple(a_hat.shape)}.")
    device = a_hat.device if per_sample else rho_sq.device
    # ℓ is r numbers per sample and step: float64 costs nothing, and MPS has no float64, so fall back to the CPU.
    work_device = torch.device("cpu") if device.type == "mps" else device
    rho_sq_64 = rho_sq.to(device=work_device, dtype=torch.float64)
    if per_sample:
        a_hat = a_hat.to(device=work_device, dtype=torch.float64)[:, None]
    b = (1.0 - a_hat * rho_sq_64).clamp(min=eps_fp)
    # The geometric mean in log space: the product of r ≈ 128–768 factors in (0, 1] would underflow.
    base = torch.exp(torch.log(b).mean(dim=-1, keepdim=True)) * b if global_scaling else b
    return base.pow(strength).to(device=device, dtype=rho_sq.dtype)


def overlap_transform(m: torch.Tensor, basis: torch.Tensor, retention: torch.Tensor) -> torch.Tensor:
    r"""
    The SC transform m̃_k = F_k m_k. Paper eqs. (7) and (35), docs/algorithm.md §3.1:

        F_k = I − Q (I − diag(ℓ_{k,1}, …, ℓ_{k,r})) Qᵀ,   i.e.   F_k m = m − Q((1 − ℓ_k) ⊙ (Qᵀ m))   per token.

    F_k keeps the orthogonal complement of span(Q) and multiplies direction q_i by ℓ_{k,i}. It acts on all positions
    (docs/algorithm.md §3.5). Computed in `m`'s dtype on `m`'s device.

    Args:
        m (`torch.Tensor`): the self-conditioning input m_k, shape (..., D), typically (B, L, D).
        basis (`torch.Tensor`): the overlap basis Q, shape (D, r), orthonormal columns.
        retention (`torch.Tensor`): ℓ_k from [`retention`]: shape (r,), one for all samples, or (B, r), one per
            sample of a (B, L, D) `m`.

    Returns:
        `torch.Tensor`: F_k m_k, shape and dtype of `m`. When a shared ℓ_k is all ones (F_k = I) this is `m` itself,
        so the η_R = 0 sampler passes the official tensor through untouched.
    """
    if basis.ndim != 2 or basis.shape[0] != m.shape[-1]:
        raise ValueError(f"`basis` must have shape (D, r) with D = {m.shape[-1]}, got {tuple(basis.shape)}.")
    rank = basis.shape[1]
    per_sample = retention.ndim == 2
    if per_sample and (m.ndim != 3 or tuple(retention.shape) != (m.shape[0], rank)):
        raise ValueError(
            f"A per-sample `retention` must have shape (B, r) = ({m.shape[0]}, {rank}) for a (B, L, D) `m`, got "
            f"{tuple(retention.shape)} for m of shape {tuple(m.shape)}."
        )
    if not per_sample and tuple(retention.shape) != (rank,):
        raise ValueError(
            f"`retention` must have shape (r,) = ({rank},) to match `basis`, got {tuple(retention.shape)}."
        )
    if not per_sample and bool((retention == 1).all()):
        return m
    q = basis.to(device=m.device, dtype=m.dtype)
    ell = retention.to(device=m.device, dtype=m.dtype)
    if per_sample:
        ell = ell[:, None, :]  # (B, 1, r): one ℓ per sample, shared by its positions
    return m - ((m @ q) * (1 - ell)) @ q.T
