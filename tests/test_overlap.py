"""The overlap basis (SPEC §4.1, §4.7 item 7; paper eq. canonical_overlap and Table projection_geometry)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from untied_sc.calibration import (
    OverlapBasis,
    effective_input_maps,
    format_projection_geometry,
    overlap_basis,
    overlap_basis_from_model,
    projection_geometry,
    row_space_basis,
)
from untied_sc.models import ELFTransformerModel, LangFlowTransformerModel


HEADER = ("Model", "Shape", "Rank", "ρ_min", "ρ_med", "ρ_max", "Mean ρ²", "#ρ≥0.9", "#ρ≤0.1")


def _orthogonal(dim: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=torch.float64))
    return q * torch.sign(torch.diagonal(r))


def _mixed(rows: int, basis: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """A (rows, D) matrix whose row space is span(basis columns), not orthonormal: random full-rank left mixing."""
    mixing = torch.randn(rows, basis.shape[1], generator=gen, dtype=torch.float64)
    mixing = mixing @ torch.diag(torch.linspace(0.3, 5.0, basis.shape[1], dtype=torch.float64))
    return mixing @ basis.T


def _projector(matrix: torch.Tensor) -> torch.Tensor:
    """Orthogonal projector onto the row space, computed independently of the code under test (pseudo-inverse)."""
    return torch.linalg.pinv(matrix, rtol=1e-10) @ matrix


def _check_eigen_equation(basis: OverlapBasis, w_z: torch.Tensor, w_m: torch.Tensor, atol: float = 1e-6):
    q = basis.basis
    p_z, p_m = _projector(w_z), _projector(w_m)
    assert q.dtype == torch.float64 and basis.rho_sq.dtype == torch.float64
    torch.testing.assert_close(q.T @ q, torch.eye(q.shape[1], dtype=torch.float64), atol=atol, rtol=0)
    torch.testing.assert_close(q @ q.T, p_m, atol=atol, rtol=0)  # Q spans all of row(W_m)
    torch.testing.assert_close(p_m @ p_z @ p_m @ q, q * basis.rho_sq, atol=atol, rtol=0)  # eq. canonical_overlap
    assert torch.all(basis.rho_sq[:-1] >= basis.rho_sq[1:])
    assert torch.all((basis.rho_sq >= 0) & (basis.rho_sq <= 1))


def test_known_principal_angles_are_recovered():
    gen = torch.Generator().manual_seed(0)
    dim, r = 13, 4
    theta = torch.tensor([0.0, 0.3, 0.9, 1.4], dtype=torch.float64)
    eye = torch.eye(dim, dtype=torch.float64)
    v_z = eye[:, :r]
    v_m = eye[:, :r] * torch.cos(theta) + eye[:, r : 2 * r] * torch.sin(theta)
    rotation = _orthogonal(dim, gen)
    w_z = _mixed(7, rotation @ v_z, gen)
    w_m = _mixed(5, rotation @ v_m, gen)

    basis = overlap_basis(w_z, w_m)

    assert (basis.rank_z, basis.rank_m, basis.shape_z, basis.shape_m) == (r, r, (7, dim), (5, dim))
    assert basis.basis.shape == (dim, r)
    torch.testing.assert_close(basis.rho_sq, torch.cos(theta).square(), atol=1e-6, rtol=0)
    _check_eigen_equation(basis, w_z, w_m)
    # Each direction is the rotated v_m,i up to sign (distinct angles make Q unique up to sign).
    torch.testing.assert_close(
        (basis.basis.T @ rotation @ v_m).abs(), torch.eye(r, dtype=torch.float64), atol=1e-6, rtol=0
    )

    geometry = projection_geometry(basis)
    rho = torch.cos(theta)
    assert geometry.rho_max == pytest.approx(1.0, abs=1e-6)
    assert geometry.rho_min == pytest.approx(math.cos(1.4), abs=1e-6)
    assert geometry.rho_med == pytest.approx(float(rho[1:3].mean()), abs=1e-6)
    assert geometry.mean_rho_sq == pytest.approx(float(rho.square().mean()), abs=1e-6)
    assert (geometry.count_ge_0_9, geometry.count_le_0_1, geometry.full_rank) == (2, 0, False)


def test_rank_m_above_rank_z_is_zero_padded_and_spans_row_m():
    gen = torch.Generator().manual_seed(1)
    dim = 10
    theta = torch.tensor([0.2, 1.0], dtype=torch.float64)
    eye = torch.eye(dim, dtype=torch.float64)
    v_z = eye[:, :2]
    v_m = torch.cat([eye[:, :2] * torch.cos(theta) + eye[:, 4:6] * torch.sin(theta), eye[:, 8:10]], dim=1)
    rotation = _orthogonal(dim, gen)
    w_z = _mixed(6, rotation @ v_z, gen)
    w_m = _mixed(6, rotation @ v_m, gen)

    basis = overlap_basis(w_z, w_m)

    assert (basis.rank_z, basis.rank_m) == (2, 4)
    assert basis.basis.shape == (dim, 4)
    expected = torch.cat([torch.cos(theta).square(), torch.zeros(2, dtype=torch.float64)])
    torch.testing.assert_close(basis.rho_sq, expected, atol=1e-6, rtol=0)
    _check_eigen_equation(basis, w_z, w_m)
    assert projection_geometry(basis).count_le_0_1 == 2
    assert "2 / 4" in format_projection_geometry({"padded": projection_geometry(basis)})


def test_rank_z_above_rank_m_keeps_rank_m_directions():
    gen = torch.Generator().manual_seed(2)
    w_z = torch.randn(6, 9, generator=gen, dtype=torch.float64)
    w_m = torch.randn(3, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, 9, generator=gen, dtype=torch.float64)
    basis = overlap_basis(w_z, w_m)
    assert (basis.rank_z, basis.rank_m, basis.num_directions) == (6, 2, 2)
    _check_eigen_equation(basis, w_z, w_m)


def test_numerical_rank_ignores_tiny_singular_values():
    gen = torch.Generator().manual_seed(3)
    u, v = _orthogonal(5, gen), _orthogonal(7, gen)
    singular = torch.tensor([3.0, 1.0, 1e-9, 1e-17, 0.0], dtype=torch.float64)
    matrix = u @ torch.diag(singular) @ v[:, :5].T

    basis, rank, tolerance = row_space_basis(matrix)

    assert rank == 3
    assert tolerance == pytest.approx(7 * torch.finfo(torch.float64).eps * 3.0, rel=1e-9)
    assert basis.shape == (7, 3) and basis.dtype == torch.float64
    torch.testing.assert_close(basis @ basis.T, v[:, :3] @ v[:, :3].T, atol=1e-5, rtol=0)
    # A float32 input is promoted to float64; the zero matrix has rank 0 and tolerance 0.
    assert row_space_basis(matrix[:2].float())[0].dtype == torch.float64
    assert row_space_basis(torch.zeros(3, 4))[1:] == (0, 0.0)


def test_numerical_rank_deficient_maps_give_clean_padding():
    gen = torch.Generator().manual_seed(4)
    w_z = torch.randn(4, 2, generator=gen, dtype=torch.float64) @ torch.randn(2, 8, generator=gen, dtype=torch.float64)
    w_z = w_z + 1e-18 * torch.randn(4, 8, generator=gen, dtype=torch.float64)
    w_m = torch.randn(4, 8, generator=gen, dtype=torch.float64)
    basis = overlap_basis(w_z, w_m)
    assert (basis.rank_z, basis.rank_m) == (2, 4)
    assert torch.all(basis.rho_sq[2:] == 0)
    _check_eigen_equation(basis, w_z, w_m)


@settings(max_examples=25, deadline=None)
@given(
    dim=st.integers(1, 12),
    rows_z=st.integers(1, 12),
    rows_m=st.integers(1, 12),
    rank_z=st.integers(0, 12),
    rank_m=st.integers(0, 12),
    seed=st.integers(0, 2**16),
)
def test_eigen_equation_for_arbitrary_ranks(dim, rows_z, rows_m, rank_z, rank_m, seed):
    gen = torch.Generator().manual_seed(seed)

    def low_rank(rows, rank):
        rank = min(rank, rows, dim)
        left = torch.randn(rows, rank, generator=gen, dtype=torch.float64)
        return left @ torch.randn(rank, dim, generator=gen, dtype=torch.float64)

    w_z, w_m = low_rank(rows_z, rank_z), low_rank(rows_m, rank_m)
    basis = overlap_basis(w_z, w_m)
    assert basis.rank_z == min(rank_z, rows_z, dim) and basis.rank_m == min(rank_m, rows_m, dim)
    assert basis.basis.shape == (dim, basis.rank_m)
    _check_eigen_equation(basis, w_z, w_m)


def test_langflow_full_rank_geometry_is_isotropic():
    torch.manual_seed(0)
    model = LangFlowTransformerModel(
        vocab_size=40, hidden_size=32, cond_dim=16, num_layers=1, num_attention_heads=4, max_length=12
    )
    torch.nn.init.normal_(model.backbone.self_cond_proj.weight, std=0.05)

    w_z, w_m = effective_input_maps(model)
    w_sc = model.backbone.self_cond_proj.weight.double()
    z, m = torch.randn(3, 32, dtype=torch.float64), torch.randn(3, 32, dtype=torch.float64)
    torch.testing.assert_close(z @ w_z.T + m @ w_m.T, z + torch.cat([z, m], dim=-1) @ w_sc.T)  # x = z + W_sc[z, m]

    basis = overlap_basis_from_model(model)
    assert (basis.rank_z, basis.rank_m, basis.shape_z, basis.shape_m) == (32, 32, (32, 32), (32, 32))
    torch.testing.assert_close(basis.rho, torch.ones(32, dtype=torch.float64), atol=1e-6, rtol=0)
    eye = torch.eye(32, dtype=torch.float64)
    torch.testing.assert_close(basis.basis.T @ basis.basis, eye, atol=1e-10, rtol=0)
    torch.testing.assert_close(basis.basis @ basis.basis.T, eye, atol=1e-10, rtol=0)

    geometry = projection_geometry(basis)
    assert geometry.full_rank and (geometry.count_ge_0_9, geometry.count_le_0_1) == (32, 0)
    assert "full rank; all ρ_i = 1" in format_projection_geometry({"LangFlow": geometry})


def test_elf_network_and_elf_b_shaped_report():
    torch.manual_seed(0)
    model = ELFTransformerModel(
        latent_dim=64,
        bottleneck_dim=16,
        hidden_size=32,
        num_layers=1,
        num_attention_heads=4,
        intermediate_size=42,
        max_length=8,
        vocab_size=20,
    )
    w_z, w_m = effective_input_maps(model)
    assert w_z.shape == w_m.shape == (16, 64) and w_z.dtype == torch.float64
    z, m = torch.randn(3, 64), torch.randn(3, 64)
    with torch.no_grad():
        bias = model.text_proj.proj1(model.self_cond_proj.bias)
        expected = model.text_proj.proj1(model.self_cond_proj(torch.cat([z, m], dim=-1))) - bias
    torch.testing.assert_close((z.double() @ w_z.T + m.double() @ w_m.T).float(), expected, atol=1e-5, rtol=1e-5)
    tiny = overlap_basis_from_model(model)
    assert (tiny.rank_z, tiny.rank_m, tiny.basis.shape) == (16, 16, (64, 16))
    _check_eigen_equation(tiny, w_z, w_m)

    # The released ELF-B input shapes: self_cond_proj 1024 → 512, bottleneck proj1 512 → 128 (random weights).
    gen = torch.Generator().manual_seed(0)
    w_sc = torch.randn(512, 1024, generator=gen) / math.sqrt(1024)
    proj1 = torch.randn(128, 512, generator=gen) / math.sqrt(512)
    w_sc, proj1 = w_sc.double(), proj1.double()
    elf_b = overlap_basis(proj1 @ w_sc[:, :512], proj1 @ w_sc[:, 512:])
    assert (elf_b.rank_z, elf_b.rank_m, elf_b.shape_z, elf_b.shape_m) == (128, 128, (128, 512), (128, 512))
    assert elf_b.rho_sq.shape == (128,) and elf_b.basis.shape == (512, 128)
    torch.testing.assert_close(elf_b.basis.T @ elf_b.basis, torch.eye(128, dtype=torch.float64), atol=1e-10, rtol=0)
    q32, rho_sq32 = elf_b.storage_tensors()
    assert q32.dtype == rho_sq32.dtype == torch.float32 and q32.shape == (512, 128) and q32.is_contiguous()

    rows = {"tiny ELF (random)": projection_geometry(tiny), "ELF-B shapes (random)": projection_geometry(elf_b)}
    table = format_projection_geometry(rows)
    print(table)
    header = table.splitlines()[0]
    assert [cell.strip() for cell in header.strip("|").split("|")] == list(HEADER)
    assert "| ELF-B shapes (random) | 128×512 | 128 |" in table
    assert len(table.splitlines()) == 4  # header, rule, two rows; no full-rank note


def test_errors():
    model = LangFlowTransformerModel(
        vocab_size=40,
        hidden_size=32,
        cond_dim=16,
        num_layers=1,
        num_attention_heads=4,
        max_length=12,
        self_conditioning=False,
    )
    with pytest.raises(ValueError, match="self_conditioning=False"):
        effective_input_maps(model)
    with pytest.raises(ValueError, match="self_conditioning=False"):
        overlap_basis_from_model(model)
    with pytest.raises(TypeError, match="ELFTransformerModel or LangFlowTransformerModel"):
        effective_input_maps(torch.nn.Linear(4, 4))
    with pytest.raises(ValueError, match="same number of columns"):
        overlap_basis(torch.randn(3, 4), torch.randn(3, 5))
