"""The overlap basis: principal directions shared by the latent and self-conditioning input projections.

The latent z and the self-conditioning input m enter both networks through one learned projection of their
concatenation, which is the sum of two linear maps `W_z z + W_m m`. With P_z and P_m the orthogonal projectors onto
the row spaces of W_z and W_m, the paper's overlap operator is `K = P_m P_z P_m` (eq. (3)) and its
eigen-decomposition on the self-conditioning row space is `P_m P_z P_m Q = Q diag(ρ²)` (eq. (32)): the
columns of Q are the principal directions between the two row spaces and ρ_i the cosines of their principal angles.
Everything here is computed once per model, in float64, from frozen weights (docs/algorithm.md §4.1).
"""

import math
from dataclasses import dataclass

import torch


__all__ = [
    "OverlapBasis",
    "ProjectionGeometry",
    "effective_input_maps",
    "format_projection_geometry",
    "overlap_basis",
    "overlap_basis_from_model",
    "projection_geometry",
    "row_space_basis",
]

_SUPPORTED = "ELFTransformerModel or LangFlowTransformerModel"


def effective_input_maps(model: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    r"""
    The effective frozen input-projection matrices (W_z, W_m) of the latent and the self-conditioning input.

    Follows docs/algorithm.md §4.1 ("Effective input maps") and the paper's App. B.2 (input-projection geometry):

    - ELF: `x = proj2(proj1(W_sc [z, m] + b))`, so up to the bias the bottleneck sees `W_z z + W_m m` with
      `W_z = proj1.weight · W_sc[:, :D]` and `W_m = proj1.weight · W_sc[:, D:]`, each `(bottleneck_dim, D)`
      (128×512 for the released models).
    - LangFlow: `x = z + W_sc [z, m]`, so `W_z = I + W_sc[:, :D]` and `W_m = W_sc[:, D:]`, each `(D, D)`
      (768×768 for the released models).

    The products are formed in float64 from the stored weights, whatever the model's dtype or device; the results
    live on the CPU.

    Args:
        model ([`ELFTransformerModel`] or [`LangFlowTransformerModel`]): the frozen network.

    Returns:
        `tuple[torch.Tensor, torch.Tensor]`: `(W_z, W_m)`, float64, both of shape `(rows, D)`.

    Raises:
        `TypeError`: if `model` is neither an [`ELFTransformerModel`] nor a [`LangFlowTransformerModel`] (its
            `family` is neither "elf" nor "langflow").
        `ValueError`: if the LangFlow model was built without self-conditioning (`self_conditioning=False`).
    """
    family = getattr(model, "family", None)
    with torch.no_grad():
        if family == "elf":
            w_sc = model.self_cond_proj.weight.detach().to(device="cpu", dtype=torch.float64)
            w_b = model.text_proj.proj1.weight.detach().to(device="cpu", dtype=torch.float64)
            dim = w_sc.shape[0]
            return w_b @ w_sc[:, :dim], w_b @ w_sc[:, dim:]
        if family == "langflow":
            proj = getattr(model.backbone, "self_cond_proj", None)
            if not model.config.self_conditioning or proj is None:
                raise ValueError(
                    "This LangFlowTransformerModel has no self-conditioning input (config self_conditioning=False), "
                    "so it has no self-conditioning projection to compute an overlap basis from."
                )
            w_sc = proj.weight.detach().to(device="cpu", dtype=torch.float64)
            dim = w_sc.shape[0]
            return torch.eye(dim, dtype=torch.float64) + w_sc[:, :dim], w_sc[:, dim:].clone()
    raise TypeError(f"Expected an {_SUPPORTED}, got {type(model).__module__}.{type(model).__qualname__}.")


def row_space_basis(matrix: torch.Tensor) -> tuple[torch.Tensor, int, float]:
    r"""
    An orthonormal basis of the row space of `matrix`, with its numerical rank.

    The SVD is taken in float64. Following docs/algorithm.md §4.1, the numerical rank counts the singular values
    strictly greater than `max(shape) · eps · s_max`, with eps the float64 machine epsilon and s_max the largest
    singular value (the tolerance is 0 for a zero or empty matrix, whose rank is 0). The basis columns are the
    corresponding right singular vectors, so they span the row space used by the projectors P_z, P_m of eq. (3).

    Args:
        matrix (`torch.Tensor` of shape `(rows, D)`): the input-projection matrix.

    Returns:
        `tuple[torch.Tensor, int, float]`: `(V, rank, tolerance)` with `V` float64 of shape `(D, rank)` and
        orthonormal columns.
    """
    if matrix.ndim != 2:
        raise ValueError(f"Expected a 2-D matrix, got shape {tuple(matrix.shape)}.")
    matrix = matrix.detach().to(device="cpu", dtype=torch.float64)
    dim = matrix.shape[1]
    if matrix.numel() == 0:
        return torch.zeros(dim, 0, dtype=torch.float64), 0, 0.0
    _, singular_values, vh = torch.linalg.svd(matrix, full_matrices=False)
    s_max = float(singular_values[0])
    tolerance = max(matrix.shape) * torch.finfo(torch.float64).eps * s_max
    rank = int((singular_values > tolerance).sum())
    return vh[:rank].T.contiguous(), rank, tolerance


@dataclass
class OverlapBasis:
    r"""
    The principal-angle basis of eq. (32), `P_m P_z P_m Q = Q diag(ρ²)`, computed once per model.

    Args:
        basis (`torch.Tensor` of shape `(D, r)`): Q, float64 with orthonormal columns spanning row(W_m); r = rank W_m.
        rho_sq (`torch.Tensor` of shape `(r,)`): the squared cosines ρ_i², sorted descending, in [0, 1].
        rank_z (`int`): numerical rank of W_z.
        rank_m (`int`): numerical rank of W_m (= r).
        tolerance_z (`float`): the singular-value threshold used for W_z.
        tolerance_m (`float`): the singular-value threshold used for W_m.
        shape_z (`tuple[int, int]`): shape of W_z.
        shape_m (`tuple[int, int]`): shape of W_m.
    """

    basis: torch.Tensor
    rho_sq: torch.Tensor
    rank_z: int
    rank_m: int
    tolerance_z: float
    tolerance_m: float
    shape_z: tuple[int, int]
    shape_m: tuple[int, int]

    def __post_init__(self):
        if self.basis.ndim != 2 or self.rho_sq.ndim != 1 or self.basis.shape[1] != self.rho_sq.shape[0]:
            raise ValueError(
                f"basis must be (D, r) and rho_sq (r,), got {tuple(self.basis.shape)} and {tuple(self.rho_sq.shape)}."
            )

    @property
    def dim(self) -> int:
        """D, the width of the input space."""
        return self.basis.shape[0]

    @property
    def num_directions(self) -> int:
        """r, the number of principal directions (columns of Q)."""
        return self.basis.shape[1]

    @property
    def rho(self) -> torch.Tensor:
        """The cosines ρ_i = sqrt(ρ_i²), sorted descending."""
        return self.rho_sq.sqrt()

    def storage_tensors(self, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """
        `(Q, ρ²)` as contiguous CPU tensors of `dtype` (float32 by default), ready to be stored as buffers.

        Args:
            dtype (`torch.dtype`, defaults to `torch.float32`): the storage dtype.

        Returns:
            `tuple[torch.Tensor, torch.Tensor]`: Q of shape `(D, r)` and ρ² of shape `(r,)`.
        """
        return (
            self.basis.detach().to(device="cpu", dtype=dtype).contiguous(),
            self.rho_sq.detach().to(device="cpu", dtype=dtype).contiguous(),
        )


def overlap_basis(w_z: torch.Tensor, w_m: torch.Tensor) -> OverlapBasis:
    r"""
    The principal directions Q and squared cosines ρ² between row(W_z) and row(W_m) (eq. (32)).

    Follows docs/algorithm.md §4.1: V_z, V_m are orthonormal row-space bases ([`row_space_basis`]); the SVD
    `V_mᵀ V_z = U Σ Yᵀ` gives `Q = V_m U` and `ρ_i² = Σ_i²`. Q has r = rank W_m columns and spans all of row(W_m):
    when rank W_m > rank W_z the SVD is taken with a full U (an orthonormal basis of R^{rank W_m}), and the extra
    columns, which W_z does not see (`P_z q = 0`), get ρ² = 0 (zero padding). ρ² is clipped to [0, 1] and sorted
    descending (Q's columns permuted with it). Then `P_m P_z P_m Q = Q diag(ρ²)`, the eigen-decomposition of the
    overlap operator K of eq. (3) on the self-conditioning row space. Full-rank maps give Q spanning
    R^D and all ρ_i = 1.

    Q is unique only up to sign, and up to rotation within equal ρ; the sign of each column is fixed so that its
    entry of largest magnitude is positive. Compare transforms built from Q (Q diag(·) Qᵀ), not Q itself.

    Args:
        w_z (`torch.Tensor` of shape `(rows_z, D)`): the latent's effective input map.
        w_m (`torch.Tensor` of shape `(rows_m, D)`): the self-conditioning input's effective input map.

    Returns:
        [`OverlapBasis`]: Q and ρ² in float64, with the ranks, tolerances and shapes.
    """
    if w_z.ndim != 2 or w_m.ndim != 2 or w_z.shape[1] != w_m.shape[1]:
        raise ValueError(
            f"W_z and W_m must be 2-D with the same number of columns D, got {tuple(w_z.shape)} and "
            f"{tuple(w_m.shape)}."
        )
    v_z, rank_z, tolerance_z = row_space_basis(w_z)
    v_m, rank_m, tolerance_m = row_space_basis(w_m)
    if rank_m == 0 or rank_z == 0:
        u = torch.eye(rank_m, dtype=torch.float64)
        sigma = torch.zeros(0, dtype=torch.float64)
    else:
        u, sigma, _ = torch.linalg.svd(v_m.T @ v_z, full_matrices=True)
    rho_sq = torch.zeros(rank_m, dtype=torch.float64)
    rho_sq[: sigma.shape[0]] = sigma.square()
    rho_sq = rho_sq.clamp(0.0, 1.0)
    rho_sq, order = torch.sort(rho_sq, descending=True, stable=True)
    basis = v_m @ u[:, order]
    if basis.shape[1]:
        pivot = basis.abs().argmax(dim=0)
        signs = torch.sign(basis[pivot, torch.arange(basis.shape[1])])
        basis = basis * torch.where(signs == 0, torch.ones_like(signs), signs)
    return OverlapBasis(
        basis=basis.contiguous(),
        rho_sq=rho_sq,
        rank_z=rank_z,
        rank_m=rank_m,
        tolerance_z=tolerance_z,
        tolerance_m=tolerance_m,
        shape_z=tuple(w_z.shape),
        shape_m=tuple(w_m.shape),
    )


def overlap_basis_from_model(model: torch.nn.Module) -> OverlapBasis:
    r"""
    The overlap basis of a frozen network: [`overlap_basis`] of its [`effective_input_maps`].

    Implements eq. (32) from the model's input projections (docs/algorithm.md §4.1).

    Args:
        model ([`ELFTransformerModel`] or [`LangFlowTransformerModel`]): the frozen network.

    Returns:
        [`OverlapBasis`]: Q (D×r) and ρ² (r,) in float64.

    Raises:
        `TypeError`: for an unsupported model class. `ValueError`: for a LangFlow model without self-conditioning.
    """
    return overlap_basis(*effective_input_maps(model))


@dataclass
class ProjectionGeometry:
    r"""
    One row of the paper's Table 2 ("Effective input-projection geometry").

    Args:
        shape_z (`tuple[int, int]`): shape of W_z. shape_m (`tuple[int, int]`): shape of W_m.
        rank_z (`int`): rank of W_z. rank_m (`int`): rank of W_m (the number of ρ values).
        dim (`int`): D, the input width.
        rho_min (`float`), rho_med (`float`), rho_max (`float`): minimum, median and maximum of ρ_i (the median
            of an even count is the mean of the two middle values); NaN when there are no directions.
        mean_rho_sq (`float`): mean of ρ_i² (NaN when there are no directions).
        count_ge_0_9 (`int`): number of ρ_i ≥ 0.9. count_le_0_1 (`int`): number of ρ_i ≤ 0.1.
        full_rank (`bool`): both maps have rank D (then P_z = P_m = I and all ρ_i = 1, the paper's LangFlow row).
    """

    shape_z: tuple[int, int]
    shape_m: tuple[int, int]
    rank_z: int
    rank_m: int
    dim: int
    rho_min: float
    rho_med: float
    rho_max: float
    mean_rho_sq: float
    count_ge_0_9: int
    count_le_0_1: int
    full_rank: bool


def projection_geometry(basis: OverlapBasis) -> ProjectionGeometry:
    r"""
    The summary of the paper's Table 2 (App. B.2, input-projection geometry).

    Columns as in the paper: shape, rank, ρ_min, ρ_med, ρ_max, mean ρ_i², |ρ_i ≥ 0.9|, |ρ_i ≤ 0.1|, over the r
    principal cosines ρ_i = sqrt(ρ_i²) of eq. (32) (zero-padded ones included, docs/algorithm.md §4.1). The paper
    reports the ELF-B values, the sanity check of docs/algorithm.md §4.1 (ρ_med ≈ 0.59, ρ_max ≈ 0.96, 18 values ≥ 0.9).

    Args:
        basis ([`OverlapBasis`]): the overlap basis.

    Returns:
        [`ProjectionGeometry`]: the row.
    """
    rho = basis.rho_sq.detach().to(device="cpu", dtype=torch.float64).clamp(0.0, 1.0).sqrt()
    if rho.numel():
        ordered = rho.sort().values
        n = ordered.numel()
        median = float(ordered[n // 2]) if n % 2 else float(ordered[n // 2 - 1 : n // 2 + 1].mean())
        stats = (float(ordered[0]), median, float(ordered[-1]), float(rho.square().mean()))
    else:
        stats = (math.nan,) * 4
    return ProjectionGeometry(
        shape_z=tuple(basis.shape_z),
        shape_m=tuple(basis.shape_m),
        rank_z=basis.rank_z,
        rank_m=basis.rank_m,
        dim=basis.dim,
        rho_min=stats[0],
        rho_med=stats[1],
        rho_max=stats[2],
        mean_rho_sq=stats[3],
        count_ge_0_9=int((rho >= 0.9).sum()),
        count_le_0_1=int((rho <= 0.1).sum()),
        full_rank=basis.rank_z == basis.dim and basis.rank_m == basis.dim,
    )


def _shape(shape: tuple[int, int]) -> str:
    return f"{shape[0]}×{shape[1]}"


def format_projection_geometry(rows: dict[str, ProjectionGeometry]) -> str:
    r"""
    A Markdown table laid out like the paper's Table 2, one row per model.

    Columns: Model | Shape | Rank | ρ_min | ρ_med | ρ_max | Mean ρ² | #ρ≥0.9 | #ρ≤0.1 (three decimals, as in the
    paper). Shape and rank are shown once when W_z and W_m agree and as `W_z / W_m` otherwise. The paper prints
    "full rank; all ρ_i = 1" for LangFlow instead of the numbers; here the numbers are always printed and such rows
    get that note below the table.

    Args:
        rows (`dict[str, ProjectionGeometry]`): model name → its [`ProjectionGeometry`].

    Returns:
        `str`: the Markdown table (no trailing newline).
    """
    header = "| Model | Shape | Rank | ρ_min | ρ_med | ρ_max | Mean ρ² | #ρ≥0.9 | #ρ≤0.1 |"
    lines = [header, "|" + "|".join(["---"] + [":---:"] * 8) + "|"]
    notes = []
    for name, row in rows.items():
        shape = _shape(row.shape_z) if row.shape_z == row.shape_m else f"{_shape(row.shape_z)} / {_shape(row.shape_m)}"
        rank = str(row.rank_m) if row.rank_z == row.rank_m else f"{row.rank_z} / {row.rank_m}"
        values = [f"{v:.3f}" for v in (row.rho_min, row.rho_med, row.rho_max, row.mean_rho_sq)]
        lines.append(
            f"| {name} | {shape} | {rank} | " + " | ".join(values) + f" | {row.count_ge_0_9} | {row.count_le_0_1} |"
        )
        if row.full_rank:
            notes.append(f"{name}: full rank; all ρ_i = 1 (P_z = P_m = I).")
    return "\n".join(lines + ([""] + notes if notes else []))
