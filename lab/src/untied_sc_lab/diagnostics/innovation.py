"""The overlap energy E(m) of the self-conditioning input under each transform assignment.

Paper Section "The self-conditioning input should reduce its overlap with the latent" (sec:conditional_innovation),
eqs. (canonical_operator) K = P_m P_z P_m and (overlap_energy) E(m) = ½⟨m, K m⟩, and Appendix "Control transforms
with the same eigenvalues" (app:spectrum_protocol), eq. (weighted_projection_energy):

    E(m) = ½ Σ_{n ∈ I_k} Σ_i ρ_i² ⟨m_n, q_i⟩²,

with the overlap basis q_i and squared cosines ρ_i² of the pipeline's `sampler_statistics` (calibration/overlap.py).

As in Tables tab:spectrum_pairing / tab:spectrum_full with the solver correction disabled: the untied scheduler runs
with η_T = 0 and each transform assignment the package supports (`transform_assignment`: "overlap", "reversed",
"random"; same retention eigenvalues, assigned to other directions), from the same seeds. At every step k ≥ 1 with a
non-identity transform, with the raw input m_k = p_{k−1} and the transformed m̃_k = F_k m_k (the network's input),
Δ = m̃_k − m_k, per trajectory:

- alignment: cos(Δ, −∇E(m_k)), ∇E(m) = Σ_i ρ_i² ⟨m, q_i⟩ q_i per position;
- normalised decrease: (E(m̃_k) − E(m_k)) / RMS(Δ), RMS over positions and dimensions;

averaged over trajectories and steps. The official sampler's E(m_k) (no transform) is the reference row.
"""

from dataclasses import asdict, dataclass, field

import torch
from tqdm.auto import tqdm

from untied_sc.schedulers import preset_entry

from ..ablations import TRANSFORM_ASSIGNMENTS, ablation_scheduler_class
from .family import check_family
from .outputs import nfe_keyed


FAMILY_PRESETS = {"elf": "elf-b", "langflow": "langflow-owt"}
# Table tab:spectrum_pairing (ELF-B, 8 NFE, no solver correction): alignment, ΔE/RMS.
PAPER_TABLE = {"overlap": (0.94, -40.35e3), "reversed": (0.51, -22.94e3), "random": (0.74, -32.15e3)}


def overlap_energy(m: torch.Tensor, basis: torch.Tensor, rho_sq: torch.Tensor) -> torch.Tensor:
    """E(m) = ½ Σ_n Σ_i ρ_i² ⟨m_n, q_i⟩² per example (eq. (weighted_projection_energy)); m (B, L, D), float64."""
    coordinates = m.double() @ basis.double()  # ⟨m_n, q_i⟩, (B, L, r)
    return 0.5 * (coordinates.pow(2) * rho_sq.double()).sum((1, 2))


def overlap_energy_gradient(m: torch.Tensor, basis: torch.Tensor, rho_sq: torch.Tensor) -> torch.Tensor:
    """∇E(m) = K m = Σ_i ρ_i² ⟨m_n, q_i⟩ q_i at every position n (K of eq. (canonical_operator) in the basis Q)."""
    basis = basis.double()
    return ((m.double() @ basis) * rho_sq.double()) @ basis.T


def alignment(modification: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """cos(Δ, −∇E) per example (app:spectrum_protocol's "Alignment"); NaN where either is zero."""
    a, b = modification.double().flatten(1), -gradient.double().flatten(1)
    norms = a.norm(dim=1) * b.norm(dim=1)
    return torch.where(norms > 0, (a * b).sum(1) / norms, torch.full_like(norms, float("nan")))


def normalized_energy_decrease(
    energy_before: torch.Tensor, energy_after: torch.Tensor, modification: torch.Tensor
) -> torch.Tensor:
    """(E(m̃) − E(m)) / RMS(Δ) per example (app:spectrum_protocol's ΔE/RMS); NaN where Δ = 0."""
    rms = modification.double().flatten(1).pow(2).mean(1).sqrt()
    change = energy_after.double() - energy_before.double()
    return torch.where(rms > 0, change / rms, torch.full_like(rms, float("nan")))


@dataclass(frozen=True)
class InnovationRow:
    """
    One configuration's measurements at one NFE (`None` where no trajectory-step was measured).

    Args:
        configuration (`str`): `official` or a transform assignment.
        energy (`float`, *optional*): mean E(m_k) of the raw inputs.
        energy_transformed (`float`, *optional*): mean E(m̃_k) over the trajectory-steps whose transform acts.
        alignment (`float`, *optional*): mean cos(Δ, −∇E) over them.
        normalized_decrease (`float`, *optional*): mean (E(m̃_k) − E(m_k)) / RMS(Δ) over them.
        transformed_steps (`int`): how many trajectory-steps with Δ ≠ 0 the means run over.
    """

    configuration: str
    energy: float | None
    energy_transformed: float | None
    alignment: float | None
    normalized_decrease: float | None
    transformed_steps: int

    def to_json(self) -> dict:
        """The row as the JSON payload stores it: its fields, in their order."""
        return asdict(self)


@dataclass
class InnovationResult:
    """
    Output of [`innovation_experiment`].

    Args:
        nfe (`list[int]`), num_trajectories (`int`), eta_r (`dict[int, float]`): what was measured (η_R per NFE).
        rows (`dict[int, list[InnovationRow]]`): NFE → one row per configuration (`official`, then each
            assignment).
        by_step (`dict[int, dict[str, list[float]]]`): NFE → configuration → mean E of the network's input at
            each step k ≥ 1.
        rho_sq_range (`list[float]`): the smallest and largest ρ_i² of the overlap basis (equal: every assignment
            is the same transform).
    """

    nfe: list[int]
    num_trajectories: int
    rho_sq_range: list[float] = field(default_factory=list)
    eta_r: dict[int, float] = field(default_factory=dict)
    rows: dict[int, list[InnovationRow]] = field(default_factory=dict)
    by_step: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def to_json(self) -> dict:
        """The result as the JSON payload stores it: NFE keys as strings, in NFE order."""
        return {
            "nfe": list(self.nfe),
            "num_trajectories": self.num_trajectories,
            "rho_sq_range": list(self.rho_sq_range),
            "eta_r": nfe_keyed(self.eta_r),
            "rows": nfe_keyed(self.rows, lambda rows: [row.to_json() for row in rows]),
            "by_step": nfe_keyed(self.by_step),
        }


def _mean(values: list[torch.Tensor]) -> float | None:
    stacked = torch.cat(values) if values else torch.empty(0)
    stacked = stacked[~stacked.isnan()]
    return float(stacked.mean()) if len(stacked) else None


@torch.no_grad()
def innovation_experiment(
    pipe,
    nfe: list[int],
    num_trajectories: int = 16,
    assignments: tuple[str, ...] = TRANSFORM_ASSIGNMENTS,
    eta_r: float | None = None,
    generator: torch.Generator | None = None,
    batch_size: int = 16,
    progress: bool = True,
) -> InnovationResult:
    """
    Measures E(m) along trajectories of the untied sampler with η_T = 0 under each transform assignment (module
    docstring).

    Args:
        pipe ([`LanguageFlowPipeline`]): the model, on its device, with `sampler_statistics` calibrated at `nfe`.
        nfe (`list[int]`): NFEs.
        num_trajectories (`int`): trajectories per NFE and configuration (the same seeds for all configurations).
        assignments (`tuple[str, ...]`): transform assignments to compare.
        eta_r (`float`, *optional*): η_R of the transform (default: the family's paper preset, ELF-B or LangFlow OWT,
            at each NFE).
        generator (`torch.Generator`, *optional*): the seeds of the batches, drawn once and shared by every
            configuration.
        batch_size (`int`): trajectories per pipeline call.
        progress (`bool`): a tqdm bar.
    """
    family = check_family(pipe)
    statistics = pipe.sampler_statistics
    if statistics is None:
        raise ValueError(
            "E(m) needs the overlap basis of the pipeline's sampler statistics, and this pipeline has none: "
            f"calibrate it first (`untied-sc calibrate PIPELINE_DIR --nfe {' '.join(map(str, nfe))}`)."
        )
    unknown = [a for a in assignments if a not in TRANSFORM_ASSIGNMENTS]
    if unknown:
        raise ValueError(f"Unknown transform assignments {unknown}; choose from {list(TRANSFORM_ASSIGNMENTS)}.")
    for n in nfe:
        statistics.for_steps(n)  # a clear error before any work when an NFE is not calibrated
    if eta_r is not None and not eta_r > 0:
        raise ValueError(f"eta_r must be > 0 (the transform must act), got {eta_r}.")
    if generator is None:
        generator = torch.Generator().manual_seed(0)
    device = pipe.transformer.device
    basis, rho_sq = statistics.basis.to(device), statistics.rho_sq.to(device)
    scheduler_cls = ablation_scheduler_class(family)  # the transform assignments are ablation switches
    sizes = [min(batch_size, num_trajectories - s) for s in range(0, num_trajectories, batch_size)]
    configurations = ["official", *assignments]
    result = InnovationResult(
        nfe=list(nfe), num_trajectories=num_trajectories, rho_sq_range=[float(rho_sq.min()), float(rho_sq.max())]
    )
    bar = tqdm(total=len(nfe) * len(sizes) * len(configurations), desc="innovation", disable=not progress)
    for n in nfe:
        strength = eta_r if eta_r is not None else preset_entry(FAMILY_PRESETS[family], n)[1]["eta_r"]
        result.eta_r[n] = strength
        seeds = torch.randint(2**62, (len(sizes),), generator=generator).tolist()
        rows: list[InnovationRow] = []
        by_step: dict[str, list[float]] = {}
        for configuration in configurations:
            overrides = {"eta_r": 0.0 if configuration == "official" else strength, "eta_t": 0.0, "eta_o": 0.0}
            if configuration != "official":
                overrides["transform_assignment"] = configuration
            scheduler = scheduler_cls.from_config(pipe.scheduler.config, alpha=1.0, coefficients=None, **overrides)
            records = {name: [] for name in ("energy", "energy_transformed", "alignment", "decrease")}
            step_energy = torch.zeros(n, dtype=torch.float64)
            step_count = torch.zeros(n, dtype=torch.float64)
            for seed, size in zip(seeds, sizes, strict=True):
                state = {"previous": None}

                def record(step, state=state, records=records, step_energy=step_energy, step_count=step_count):
                    raw, transformed = state["previous"], step.self_conditioning
                    state["previous"] = step.prediction
                    if raw is None or transformed is None:
                        return None
                    before = overlap_energy(raw, basis, rho_sq)
                    after = overlap_energy(transformed, basis, rho_sq)
                    step_energy[step.index] += after.sum().cpu()
                    step_count[step.index] += len(after)
                    records["energy"].append(before.cpu())
                    modification = transformed.double() - raw.double()
                    changed = modification.flatten(1).abs().amax(1) > 0
                    if changed.any():
                        records["energy_transformed"].append(after[changed].cpu())
                        gradient = overlap_energy_gradient(raw, basis, rho_sq)
                        records["alignment"].append(alignment(modification, gradient)[changed].cpu())
                        records["decrease"].append(
                            normalized_energy_decrease(before, after, modification)[changed].cpu()
                        )
                    return None

                pipe.denoise(
                    size,
                    n,
                    torch.Generator().manual_seed(seed),
                    scheduler=scheduler,
                    statistics=statistics,
                    step_callback=record,
                    progress=False,
                )
                bar.update()
            rows.append(
                InnovationRow(
                    configuration=configuration,
                    energy=_mean(records["energy"]),
                    energy_transformed=_mean(records["energy_transformed"]),
                    alignment=_mean(records["alignment"]),
                    normalized_decrease=_mean(records["decrease"]),
                    transformed_steps=int(sum(len(v) for v in records["alignment"])),
                )
            )
            by_step[configuration] = (step_energy[1:] / step_count[1:].clamp(min=1)).tolist()
        result.rows[n] = rows
        result.by_step[n] = by_step
    bar.close()
    return result
