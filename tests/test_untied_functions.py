"""Tests of the pure untied self-conditioning functions (the library's transform and history directions, the lab's
correction functions) against direct, independent computations (SPEC §4.2–4.3)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from untied_sc.schedulers import (
    history_direction,
    masked_mean,
    masked_token_mean,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)
from untied_sc_lab.ablations.correction_functions import centre_tokens, combined_direction, moment_projection


F64 = torch.float64
LOW_PRECISION = (torch.float16, torch.bfloat16)


def randn(*shape, seed=0, dtype=F64, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator, dtype=F64) * scale).to(dtype)


def orthonormal_basis(dim, rank, seed=0):
    return torch.linalg.qr(randn(dim, rank, seed=seed))[0]


def random_mask(batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(batch, length, generator=generator) < 0.6


# --- Independent references: per sample, per token, with Python-level loops and float64 -------------------------


def reference_retention(rho_sq, a_hat, strength, eps_fp=0.01, global_scaling=True):
    b = [max(1.0 - a_hat * float(x), eps_fp) for x in rho_sq]
    g = math.prod(b) ** (1.0 / len(b)) if global_scaling else 1.0
    return torch.tensor([(g * bi) ** strength for bi in b], dtype=F64)


def reference_solver_direction(p, h, o, mask, eps=1e-12):
    g = torch.zeros_like(p, dtype=F64)
    for i in range(p.shape[0]):
        idx = mask[i]
        pi, hi, di = p[i, idx].double(), h[i, idx].double(), (p[i, idx] - o[i, idx]).double()
        norm_h, norm_d, norm_p = hi.norm(), di.norm(), pi.norm()
        if norm_h > eps * norm_p and norm_d > eps * norm_p:
            g[i, idx] = norm_h * di / norm_d
    return g


def reference_cosine_distance(h, g, mask):
    out = torch.zeros(h.shape[:2], dtype=F64)
    for i in range(h.shape[0]):
        for n in range(h.shape[1]):
            hn, gn = h[i, n].double(), g[i, n].double()
            if mask[i, n] and hn.norm() > 0 and gn.norm() > 0:
                out[i, n] = min(1.0, 1.0 - float(hn @ gn / (hn.norm() * gn.norm())))
    return out


def reference_moment_projection(u, mu, sigma, mask):
    out = torch.zeros_like(u, dtype=F64)
    for i in range(u.shape[0]):
        idx = mask[i]
        if not idx.any():
            continue
        active = u[i, idx].double()
        centred = active - active.sum(0) / active.shape[0]
        rms = (centred.square().sum() / centred.numel()).sqrt()
        out[i, idx] = mu.double() + (sigma * centred / rms if rms > 0 else 0.0)
    return out


def active_moments(x, mask):
    """Per-sample token mean and centred RMS over active positions, computed directly."""
    means, rms = [], []
    for i in range(x.shape[0]):
        active = x[i, mask[i]].double()
        mean = active.mean(0)
        means.append(mean)
        rms.append(((active - mean).square().mean()).sqrt())
    return means, rms


# --- retention: paper eq. (released_retention) --------------------------------------------------------------------


def test_retention_matches_hand_formula():
    rho_sq = torch.rand(16, generator=torch.Generator().manual_seed(1), dtype=F64)
    for a_hat, strength in [(0.7, 1.3), (0.25, 0.5), (1.0, 2.0)]:
        expected = reference_retention(rho_sq, a_hat, strength)
        torch.testing.assert_close(retention(rho_sq, a_hat, strength), expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
def test_retention_with_zero_strength_is_exactly_ones(dtype):
    rho_sq = torch.rand(7, generator=torch.Generator().manual_seed(2)).to(dtype)
    for a_hat in (0.0, 0.5, 1.0):
        ell = retention(rho_sq, a_hat, 0.0)
        assert ell.dtype == dtype and torch.equal(ell, torch.ones_like(rho_sq))


def test_retention_at_first_step_is_exactly_ones():
    # â_0 = 0 makes b = 1 and g = 1, so F_0 = I whatever λ_R is.
    rho_sq = torch.rand(9, generator=torch.Generator().manual_seed(3), dtype=F64)
    assert torch.equal(retention(rho_sq, 0.0, 1.7), torch.ones_like(rho_sq))


def test_retention_without_global_scaling_drops_geometric_mean():
    rho_sq = torch.rand(12, generator=torch.Generator().manual_seed(4), dtype=F64)
    a_hat, strength = 0.8, 1.5
    local = retention(rho_sq, a_hat, strength, global_scaling=False)
    torch.testing.assert_close(local, reference_retention(rho_sq, a_hat, strength, global_scaling=False))
    b = (1 - a_hat * rho_sq).clamp(min=0.01)
    g = b.prod() ** (1 / b.numel())
    torch.testing.assert_close(retention(rho_sq, a_hat, strength) / local, torch.full_like(b, float(g) ** strength))


def test_retention_is_nonincreasing_in_rho_sq():
    rho_sq = torch.linspace(0, 1, 33, dtype=F64)
    for global_scaling in (True, False):
        ell = retention(rho_sq, 0.95, 1.2, global_scaling=global_scaling)
        assert (ell[1:] <= ell[:-1]).all()


def test_retention_respects_floor():
    rho_sq = torch.tensor([1.0, 0.999, 0.5, 0.0], dtype=F64)
    eps_fp, strength = 0.05, 1.0
    local = retention(rho_sq, 1.0, strength, eps_fp=eps_fp, global_scaling=False)
    assert local[0] == pytest.approx(eps_fp) and local[1] == pytest.approx(eps_fp)
    # With g ≥ ε_fp and b ≥ ε_fp, ℓ ≥ ε_fp^{2λ}.
    assert (retention(rho_sq, 1.0, strength, eps_fp=eps_fp) >= eps_fp ** (2 * strength) * (1 - 1e-12)).all()


@pytest.mark.parametrize("a_hat", [0.0, 0.3, 0.6, 1.0])
def test_retention_full_rank_isotropic_geometry_dampens_uniformly(a_hat):
    # LangFlow: all ρ = 1, so b_i = b = max(1 − â, ε_fp), g = b and ℓ_i = b^{2λ_R} (isotropic dampening).
    strength = 0.8
    b = max(1 - a_hat, 0.01)
    ell = retention(torch.ones(768, dtype=F64), a_hat, strength)
    torch.testing.assert_close(ell, torch.full((768,), b ** (2 * strength), dtype=F64), rtol=1e-12, atol=0)


def test_retention_keeps_dtype_and_rejects_invalid_parameters():
    rho_sq = torch.rand(5, generator=torch.Generator().manual_seed(5))
    assert retention(rho_sq, 0.5, 1.0).dtype == torch.float32
    with pytest.raises(ValueError, match="strength"):
        retention(rho_sq, 0.5, -1.0)
    with pytest.raises(ValueError, match="eps_fp"):
        retention(rho_sq, 0.5, 1.0, eps_fp=0.0)


@pytest.mark.parametrize("global_scaling", [True, False])
def test_retention_of_a_batch_of_a_hat_is_one_row_per_sample(global_scaling):
    rho_sq = torch.rand(16, generator=torch.Generator().manual_seed(2), dtype=F64)
    a_hat = torch.tensor([0.0, 0.3, 0.95], dtype=torch.float32)  # the online δ̄ gives one â per sample
    batched = retention(rho_sq, a_hat, 1.7, global_scaling=global_scaling)
    assert batched.shape == (3, 16) and batched.dtype == F64
    for b in range(3):
        one = retention(rho_sq, a_hat[b].item(), 1.7, global_scaling=global_scaling)
        torch.testing.assert_close(batched[b], one, rtol=1e-15, atol=0)
    assert torch.equal(batched[0], torch.ones(16, dtype=F64))  # â = 0: F = I
    with pytest.raises(ValueError, match=r"shape \(B,\)"):
        retention(rho_sq, a_hat[:, None], 1.7)


# --- overlap_transform: paper eq. (released_self_conditioning) -----------------------------------------------------


def test_overlap_transform_equals_explicit_matrix():
    dim, rank = 8, 5
    q = orthonormal_basis(dim, rank, seed=6)
    ell = torch.rand(rank, generator=torch.Generator().manual_seed(7), dtype=F64)
    m = randn(3, 4, dim, seed=8)
    matrix = torch.eye(dim, dtype=F64) - q @ (torch.eye(rank, dtype=F64) - torch.diag(ell)) @ q.T
    torch.testing.assert_close(overlap_transform(m, q, ell), torch.einsum("ij,blj->bli", matrix, m))


def test_overlap_transform_is_symmetric_and_contracts():
    dim, rank = 8, 6
    q = orthonormal_basis(dim, rank, seed=9)
    ell = torch.rand(rank, generator=torch.Generator().manual_seed(10), dtype=F64)
    # Row j of the output is F e_j, i.e. column j of F.
    columns = overlap_transform(torch.eye(dim, dtype=F64)[None], q, ell)[0]
    torch.testing.assert_close(columns, columns.T)
    m = randn(4, 5, dim, seed=11)
    assert (overlap_transform(m, q, ell).norm(dim=-1) <= m.norm(dim=-1) * (1 + 1e-12)).all()


def test_overlap_transform_preserves_complement_and_scales_principal_directions():
    dim, rank = 8, 3
    q = orthonormal_basis(dim, rank, seed=12)
    ell = torch.tensor([0.1, 0.5, 0.9], dtype=F64)
    x = randn(1, 6, dim, seed=13)
    complement = x - (x @ q) @ q.T
    torch.testing.assert_close(overlap_transform(complement, q, ell), complement)
    principal = q.T[None]  # tokens q_1, q_2, q_3
    torch.testing.assert_close(overlap_transform(principal, q, ell), ell[None, :, None] * principal)


def test_overlap_transform_with_unit_retention_returns_input_unchanged():
    q = orthonormal_basis(8, 4, seed=14)
    m = randn(2, 3, 8, seed=15, dtype=torch.float32)
    assert overlap_transform(m, q, torch.ones(4, dtype=F64)) is m
    assert overlap_transform(m, q, retention(torch.rand(4), 0.0, 2.0)) is m  # F_0 = I


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_overlap_transform_computes_in_input_dtype(dtype):
    q = orthonormal_basis(8, 4, seed=16)
    ell = torch.tensor([0.2, 0.4, 0.6, 0.8], dtype=F64)
    m = randn(2, 3, 8, seed=17)
    out = overlap_transform(m.to(dtype), q, ell)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), overlap_transform(m, q, ell), rtol=0.05, atol=0.05)


def test_overlap_transform_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="basis"):
        overlap_transform(randn(1, 2, 8), orthonormal_basis(6, 3), torch.ones(3))
    with pytest.raises(ValueError, match="retention"):
        overlap_transform(randn(1, 2, 8), orthonormal_basis(8, 3), torch.ones(4))


def test_overlap_transform_with_one_retention_per_sample_transforms_each_sample_with_its_own():
    q = orthonormal_basis(8, 4, seed=18)
    ell = torch.rand(3, 4, generator=torch.Generator().manual_seed(19), dtype=F64)
    m = randn(3, 5, 8, seed=20)
    batched = overlap_transform(m, q, ell)
    for b in range(3):
        torch.testing.assert_close(batched[b : b + 1], overlap_transform(m[b : b + 1], q, ell[b]))
    with pytest.raises(ValueError, match="per-sample `retention` must have shape"):
        overlap_transform(m, q, ell[:2])


# --- history_direction: paper eq. (history_direction) --------------------------------------------------------------


def test_history_direction_is_gated_ema_residual():
    p, e = randn(2, 3, 4, seed=18), randn(2, 3, 4, seed=19)
    p_copy, e_copy = p.clone(), e.clone()
    torch.testing.assert_close(history_direction(p, e), p - e, rtol=0, atol=0)
    inactive = history_direction(p, e, active=False)
    assert torch.equal(inactive, torch.zeros_like(p))
    assert torch.equal(p, p_copy) and torch.equal(e, e_copy)


# --- solver_history_direction: paper eq. (solver_history_direction) ------------------------------------------------


def test_solver_history_direction_matches_direct_computation():
    p, h, o = randn(3, 5, 4, seed=20), randn(3, 5, 4, seed=21), randn(3, 5, 4, seed=22)
    mask = random_mask(3, 5, seed=23)
    mask[:, 0] = True
    expected = reference_solver_direction(p, h, o, mask)
    torch.testing.assert_close(solver_history_direction(p, h, o, mask), expected)
    torch.testing.assert_close(solver_history_direction(p, h, o), reference_solver_direction(p, h, o, mask | True))


def test_solver_history_direction_has_history_norm_and_points_along_prediction_minus_average():
    p, h, o = randn(2, 6, 5, seed=24), randn(2, 6, 5, seed=25), randn(2, 6, 5, seed=26)
    g = solver_history_direction(p, h, o)
    for i in range(2):
        assert g[i].norm() == pytest.approx(float(h[i].norm()), rel=1e-12)
        cosine = (g[i] * (p[i] - o[i])).sum() / (g[i].norm() * (p[i] - o[i]).norm())
        assert float(cosine) == pytest.approx(1.0, abs=1e-12)


def test_solver_history_direction_ignores_inactive_positions():
    p, h, o = randn(2, 6, 5, seed=27), randn(2, 6, 5, seed=28), randn(2, 6, 5, seed=29)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1]], dtype=torch.bool)
    g = solver_history_direction(p, h, o, mask)
    assert torch.equal(g[~mask], torch.zeros_like(g[~mask]))
    perturbed = [torch.where(mask[..., None], x, x + 100.0) for x in (p, h, o)]
    torch.testing.assert_close(solver_history_direction(*perturbed, mask), g)


def test_solver_history_direction_is_zero_for_degenerate_samples():
    p, h, o = randn(3, 4, 5, seed=30), randn(3, 4, 5, seed=31), randn(3, 4, 5, seed=32)
    h[0] = 0.0  # ‖H‖ = 0
    o[1] = p[1]  # ‖p − O‖ = 0
    g = solver_history_direction(p, h, o)
    assert torch.equal(g[:2], torch.zeros_like(g[:2]))
    assert g[2].norm() == pytest.approx(float(h[2].norm()))
    # No active position at all: zero, not NaN.
    assert torch.equal(solver_history_direction(p, h, o, torch.zeros(3, 4, dtype=torch.bool)), torch.zeros_like(p))


def test_solver_history_direction_threshold_is_relative_to_prediction_norm():
    p, o = randn(1, 4, 5, seed=33, scale=1e6), randn(1, 4, 5, seed=34, scale=1e6)
    direction = randn(1, 4, 5, seed=35)
    unit = direction / direction.norm()
    below, above = unit * 1e-13 * p.norm(), unit * 1e-11 * p.norm()
    assert torch.equal(solver_history_direction(p, below, o), torch.zeros_like(p))
    assert solver_history_direction(p, above, o).norm() == pytest.approx(float(above.norm()), rel=1e-9)


@pytest.mark.parametrize("scale", [1e30, 1e-30])
def test_solver_history_direction_survives_extreme_magnitudes(scale):
    p, h, o = (randn(2, 3, 4, seed=s, scale=scale, dtype=torch.float32) for s in (36, 37, 38))
    g = solver_history_direction(p, h, o)
    assert torch.isfinite(g).all()
    expected = reference_solver_direction(p, h, o, torch.ones(2, 3, dtype=torch.bool))
    torch.testing.assert_close(g.double() / scale, expected / scale, rtol=1e-5, atol=1e-6)


# --- combined_direction: paper eq. (combined_direction) ------------------------------------------------------------


def test_combined_direction_matches_formula():
    h, g = randn(2, 3, 4, seed=39), randn(2, 3, 4, seed=40)
    torch.testing.assert_close(combined_direction(h, g, 0.7, 0.4), h + 0.7 * 0.4 * (h - g))
    assert combined_direction(h, g, 0.0, 0.4) is h
    assert combined_direction(h, g, 0.7, 0.0) is h
    low = combined_direction(h.bfloat16(), g.bfloat16(), 0.7, 0.4)
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.double(), h + 0.28 * (h - g), rtol=0.02, atol=0.02)


# --- token_cosine_distance: δ̃ in paper eq. (reference_carrier) ---------------------------------------------------


def test_token_cosine_distance_matches_direct_computation():
    h, g = randn(3, 6, 5, seed=41), randn(3, 6, 5, seed=42)
    mask = random_mask(3, 6, seed=43)
    h[0, 1] = 0.0
    g[1, 2] = 0.0
    expected = reference_cosine_distance(h, g, mask)
    torch.testing.assert_close(token_cosine_distance(h, g, mask), expected)
    assert torch.equal(token_cosine_distance(h, g, mask)[~mask], torch.zeros(int((~mask).sum()), dtype=F64))


def test_token_cosine_distance_special_angles_and_range():
    e1, e2 = torch.eye(3, dtype=F64)[0], torch.eye(3, dtype=F64)[1]
    h = torch.stack([e1, e1, e1, e1, torch.zeros(3, dtype=F64)])[None]
    g = torch.stack([2 * e1, -e1, e2, e1 + e2, e1])[None]
    distance = token_cosine_distance(h, g)[0]
    # parallel → 0; antiparallel → min(1, 2) = 1; orthogonal → 1; 45° → 1 − 1/√2; zero vector → 0.
    torch.testing.assert_close(distance, torch.tensor([0.0, 1.0, 1.0, 1 - 2**-0.5, 0.0], dtype=F64))
    random = token_cosine_distance(randn(4, 8, 3, seed=44), randn(4, 8, 3, seed=45))
    assert ((random >= 0) & (random <= 1)).all()


# --- moment_projection: paper eq. (released_solver_correction) ----------------------------------------------------


def test_moment_projection_matches_direct_computation():
    u, mu = randn(3, 6, 4, seed=46), randn(4, seed=47)
    mask = random_mask(3, 6, seed=48)
    mask[0] = False
    mask[1, :2] = True
    torch.testing.assert_close(moment_projection(u, mu, 0.8, mask), reference_moment_projection(u, mu, 0.8, mask))


def test_moment_projection_has_target_mean_and_centred_rms_on_active_positions():
    u, mu = randn(3, 7, 5, seed=49, scale=3.0), randn(5, seed=50)
    mask = random_mask(3, 7, seed=51)
    mask[:, :2] = True
    out = moment_projection(u, mu, 0.35, mask)
    means, rms = active_moments(out, mask)
    for i in range(3):
        torch.testing.assert_close(means[i], mu)
        assert float(rms[i]) == pytest.approx(0.35, rel=1e-12)
    assert torch.equal(out[~mask], torch.zeros_like(out[~mask]))


def test_moment_projection_ignores_values_at_inactive_positions():
    u, mu = randn(2, 5, 3, seed=52), randn(3, seed=53)
    mask = torch.tensor([[1, 0, 1, 1, 0], [1, 1, 1, 0, 0]], dtype=torch.bool)
    perturbed = torch.where(mask[..., None], u, u + 1e3)
    torch.testing.assert_close(moment_projection(perturbed, mu, 0.5, mask), moment_projection(u, mu, 0.5, mask))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, F64])
def test_moment_projection_returns_mean_when_direction_is_constant_across_positions(dtype):
    # Three positions holding 0.1: sum/3 is not exactly 0.1 in floating point, yet C U must be exactly 0 here.
    u = torch.full((2, 3, 4), 0.1, dtype=dtype)
    u[1] = torch.tensor([0.3, -7.0, 1e-3, 5.0], dtype=dtype)
    mu = randn(4, seed=54, dtype=torch.float32)  # float32 → dtype rounds once, as inside the function
    out = moment_projection(u, mu, 2.0)
    assert torch.equal(out, mu.to(dtype).expand_as(out))


def test_moment_projection_without_active_positions_is_zero():
    out = moment_projection(randn(2, 3, 4, seed=55), randn(4, seed=56), 1.0, torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(out, torch.zeros(2, 3, 4, dtype=F64))


def test_moment_projection_accepts_per_sample_rms_and_extreme_scales():
    u, mu = randn(2, 4, 3, seed=57), randn(3, seed=58)
    out = moment_projection(u, mu, torch.tensor([0.5, 2.0], dtype=torch.float32))
    _, rms = active_moments(out, torch.ones(2, 4, dtype=torch.bool))
    assert [float(r) for r in rms] == pytest.approx([0.5, 2.0], rel=1e-12)
    for scale in (1e30, 1e-30):
        extreme = moment_projection((u * scale).float(), mu.float(), 0.5)
        assert torch.isfinite(extreme).all()
        torch.testing.assert_close(extreme.double(), moment_projection(u, mu, 0.5), rtol=1e-5, atol=1e-5)


# --- masked_token_mean ----------------------------------------------------------------------------------------------


def test_masked_token_mean_matches_mean_over_active_positions():
    x = randn(3, 6, 4, seed=59)
    mask = random_mask(3, 6, seed=60)
    mask[0] = False
    mask[1, 0] = True
    mean = masked_token_mean(x, mask)
    assert torch.equal(mean[0], torch.zeros(4, dtype=F64))
    for i in (1, 2):
        torch.testing.assert_close(mean[i], x[i, mask[i]].mean(0))
    torch.testing.assert_close(masked_token_mean(x), x.mean(1))
    big = (x * 1e37).float()  # the plain float32 sum of six such entries could overflow
    torch.testing.assert_close(masked_token_mean(big).double() / 1e37, x.mean(1), rtol=1e-5, atol=1e-6)


def test_masked_token_mean_of_one_value_per_token_is_one_value_per_sample():
    distance = randn(3, 6, seed=61).abs()  # e.g. the per-token cosine distances δ̃_k
    mask = random_mask(3, 6, seed=62)
    mask[0] = False
    mean = masked_token_mean(distance, mask)
    assert mean.shape == (3,) and mean[0] == 0
    for i in (1, 2):
        torch.testing.assert_close(mean[i], distance[i, mask[i]].mean())


def test_masked_mean_is_the_differentiable_mean_over_active_positions():
    losses = randn(3, 6, seed=65).abs().requires_grad_()  # e.g. per-token training losses
    mask = random_mask(3, 6, seed=66)
    mask[0] = False
    mask[1, 0] = True
    mean = masked_mean(losses, mask)
    assert mean.shape == (3,) and mean[0] == 0
    for i in (1, 2):
        torch.testing.assert_close(mean[i], losses[i, mask[i]].mean())
    mean.sum().backward()
    count = mask.sum(1, keepdim=True).clamp_min(1)
    torch.testing.assert_close(losses.grad, (mask / count).to(F64))  # nothing reaches the inactive positions
    x = randn(3, 6, 4, seed=67)
    torch.testing.assert_close(masked_mean(x, mask), masked_token_mean(x, mask))  # the same mean, not rescaled


def test_centre_tokens_subtracts_the_active_token_mean_and_zeroes_inactive_positions():
    x = randn(3, 6, 4, seed=63)
    mask = random_mask(3, 6, seed=64)
    mask[0] = False
    mask[1, 0] = True
    centred = centre_tokens(x, mask)
    assert torch.equal(centred[0], torch.zeros(6, 4, dtype=F64))
    for i in (1, 2):
        torch.testing.assert_close(centred[i, mask[i]], x[i, mask[i]] - x[i, mask[i]].mean(0))
        assert torch.equal(centred[i, ~mask[i]], torch.zeros_like(centred[i, ~mask[i]]))
    constant = randn(2, 1, 4, seed=65).expand(2, 6, 4) * 0.1  # 0.1 is inexact: a plain mean would leave residue
    assert torch.equal(centre_tokens(constant), torch.zeros(2, 6, 4, dtype=F64))
    assert centre_tokens(x.half()).dtype == torch.float32


# --- Properties over shapes, dtypes, masks and degenerate inputs ---------------------------------------------------

DTYPES = [torch.float32, F64, torch.bfloat16, torch.float16]
TOLERANCE = {torch.float32: 1e-4, F64: 1e-10, torch.bfloat16: 0.1, torch.float16: 0.02}


@st.composite
def problems(draw, dtype):
    batch, length, dim = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(1, 8))
    # float16 tops out at 65504: keep U = H + η_O Δu (H − G) of a 1e2-scale prediction well inside it.
    scales = [1.0, 1e2, 1e-3] + ([1e30, 1e-30] if dtype in (torch.float32, F64, torch.bfloat16) else [])
    return {
        "batch": batch,
        "length": length,
        "dim": dim,
        "rank": draw(st.integers(1, dim)),
        "dtype": dtype,
        "seed": draw(st.integers(0, 2**16)),
        "scale": draw(st.sampled_from(scales)),
        "mask": draw(st.sampled_from(["none", "random", "all_masked"])),
        "degenerate": draw(st.sampled_from(["none", "zero_history", "constant_direction", "prediction_is_average"])),
        "a_hat": draw(st.sampled_from([0.0, 0.37, 1.0])),
        "strength": draw(st.sampled_from([0.0, 0.5, 2.0])),
        "eta_o": draw(st.sampled_from([0.0, 1.0, 3.0])),
        "delta_u": draw(st.floats(0.0, 1.0)),
        "global_scaling": draw(st.booleans()),
    }


def build(problem):
    shape = (problem["batch"], problem["length"], problem["dim"])
    dtype, seed, scale = problem["dtype"], problem["seed"], problem["scale"]
    p, e, o = (randn(*shape, seed=seed + i, scale=scale) for i in range(3))
    if problem["degenerate"] == "prediction_is_average":
        o = p.clone()
    if problem["mask"] == "none":
        mask = None
    elif problem["mask"] == "all_masked":
        mask = torch.zeros(shape[:2], dtype=torch.bool)
    else:
        mask = random_mask(*shape[:2], seed=seed)
    return p.to(dtype), e.to(dtype), o.to(dtype), mask


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype).removeprefix("torch."))
@settings(max_examples=50, deadline=None, derandomize=True)
@given(data=st.data())
def test_property_full_step_is_finite_and_keeps_documented_fallbacks(dtype, data):
    problem = data.draw(problems(dtype))
    p, e, o, mask = build(problem)
    dtype, dim = problem["dtype"], problem["dim"]
    active = torch.ones(p.shape[:2], dtype=torch.bool) if mask is None else mask
    inputs = [x.clone() for x in (p, e, o)]

    # Retention and the SC transform.
    rho_sq = torch.rand(problem["rank"], generator=torch.Generator().manual_seed(problem["seed"]), dtype=F64)
    ell = retention(rho_sq, problem["a_hat"], problem["strength"], global_scaling=problem["global_scaling"])
    assert torch.isfinite(ell).all() and (ell > 0).all() and (ell <= 1 + 1e-12).all()
    if problem["strength"] == 0 or problem["a_hat"] == 0:
        assert torch.equal(ell, torch.ones_like(ell))
    q = orthonormal_basis(dim, problem["rank"], seed=problem["seed"])
    m_tilde = overlap_transform(p, q, ell)
    assert m_tilde.dtype == dtype and torch.isfinite(m_tilde).all()
    if torch.equal(ell, torch.ones_like(ell)):
        assert m_tilde is p
    elif problem["scale"] == 1.0:
        # Contraction: ‖F m‖ ≤ ‖m‖ per token (up to rounding in the input dtype).
        tol = TOLERANCE[dtype]
        assert (m_tilde.double().norm(dim=-1) <= p.double().norm(dim=-1) * (1 + tol) + tol).all()

    # The correction.
    h = history_direction(p, e, active=problem["degenerate"] != "zero_history")
    g = solver_history_direction(p, h, o, mask)
    u = combined_direction(h, g, problem["eta_o"], problem["delta_u"])
    if problem["degenerate"] == "constant_direction":
        u = u[:, :1].expand_as(u).clone()
    delta = token_cosine_distance(h, g, mask)
    mu = randn(dim, seed=problem["seed"] + 3).to(torch.float32)
    projection = moment_projection(u, mu, 0.7, mask)
    mean = masked_token_mean(projection, mask)

    for x in (h, g, u, delta, projection, mean):
        assert x.dtype == dtype and torch.isfinite(x).all()
    assert delta.shape == p.shape[:2] and ((delta >= 0) & (delta <= 1)).all()
    for x in (g, projection):
        assert torch.equal(x[~active], torch.zeros_like(x[~active]))
    assert torch.equal(delta[~active], torch.zeros_like(delta[~active]))
    if problem["degenerate"] in ("zero_history", "prediction_is_average"):
        assert torch.equal(g, torch.zeros_like(g)) and torch.equal(delta, torch.zeros_like(delta))
    for i in range(p.shape[0]):
        if not active[i].any():
            assert torch.equal(projection[i], torch.zeros_like(projection[i]))
            assert torch.equal(mean[i], torch.zeros_like(mean[i]))
            continue
        if problem["degenerate"] == "constant_direction":
            assert torch.equal(projection[i][active[i]], mu.to(dtype).expand(int(active[i].sum()), dim))
        # Π has token mean μ and centred RMS σ (or 0, when C U = 0) over the active positions.
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(mean[i].double(), mu.double(), rtol=tol, atol=tol)
        active_values = projection[i][active[i]].double()
        rms = float((active_values - active_values.mean(0)).square().mean().sqrt())
        centred_is_zero = problem["degenerate"] in ("zero_history", "constant_direction") or active[i].sum() == 1
        assert rms == (pytest.approx(0.0, abs=tol) if centred_is_zero else pytest.approx(0.7, rel=tol, abs=tol))

    for x, original in zip((p, e, o), inputs, strict=True):
        assert torch.equal(x, original)  # no in-place mutation


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dtype: str(dtype).removeprefix("torch."))
@settings(max_examples=50, deadline=None, derandomize=True)
@given(data=st.data())
def test_property_functions_match_float64_references(dtype, data):
    problem = data.draw(problems(dtype))
    p, e, o, mask = build(problem)
    if problem["dtype"] in LOW_PRECISION or problem["scale"] != 1.0:
        # Compare in float64 only: the references use plain sums, and low precision needs its own tolerance.
        p, e, o = p.double(), e.double(), o.double()
    active = torch.ones(p.shape[:2], dtype=torch.bool) if mask is None else mask
    tol = TOLERANCE[p.dtype]
    h = history_direction(p, e)
    g = solver_history_direction(p, h, o, mask)
    torch.testing.assert_close(g.double(), reference_solver_direction(p, h, o, active), rtol=tol, atol=tol)
    torch.testing.assert_close(
        token_cosine_distance(h, g, mask).double(), reference_cosine_distance(h, g, active), rtol=tol, atol=tol
    )
    u = combined_direction(h, g, problem["eta_o"], problem["delta_u"])
    mu = randn(problem["dim"], seed=problem["seed"] + 4)
    torch.testing.assert_close(
        moment_projection(u, mu, 1.3, mask).double(),
        reference_moment_projection(u, mu, 1.3, active),
        rtol=1e-3 if p.dtype == torch.float32 else tol,  # C U / RMS amplifies rounding when U is nearly constant
        atol=1e-3 if p.dtype == torch.float32 else tol,
    )
