"""Markdown tables and figures of the diagnostics' results, next to the paper's numbers where it reports them."""

from pathlib import Path

from ..evaluation.plots import pyplot as shared_pyplot
from .coupling import PAPER_TABLE as COUPLING_PAPER
from .coupling import CouplingResult
from .innovation import PAPER_TABLE as INNOVATION_PAPER
from .innovation import InnovationResult
from .step_scaling import PAPER_EXPONENTS, StepScalingResult


def pyplot():
    """matplotlib's pyplot, or a clear error saying how to install it (`evaluation.plots.pyplot`)."""
    return shared_pyplot("Drawing the diagnostics' figures")


def _number(value, digits: int = 3) -> str:
    return "–" if value is None or value != value else f"{value:.{digits}f}"


def _interval(ci) -> str:
    return "–" if not ci or any(v is None or v != v for v in ci) else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _header(title: str, model: str, command: str) -> list[str]:
    return [f"# {title}: {model}", "", f"Command: `{command}`", ""]


def coupling_markdown(result: CouplingResult, model: str, command: str) -> str:
    lines = _header("Coupling experiment", model, command)
    lines += [
        f"{result.num_examples} clean examples; α* = −Σ⟨e,d⟩/Σ‖d‖² along d = v_sc − v_base, risk ratio = R(1)/R(0) "
        "(paper app:coupling_protocol). Control: self-conditioning on a preliminary prediction from the current "
        "state. Paper: ELF-B, 256 OpenWebText examples (Table tab:coupling).",
        "",
    ]
    for n in result.nfe:
        paper = COUPLING_PAPER.get(n)
        lines += [
            f"## {n} NFE",
            "",
            "| ρ | α* | risk ratio | control α* | control risk ratio | paper α* | paper ratio |",
        ]
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for r, rho in enumerate(result.rhos):
            paper_alpha = paper_ratio = None
            if paper is not None and rho in (0.0, 0.25, 0.5, 0.75, 1.0):
                index = [0.0, 0.25, 0.5, 0.75, 1.0].index(rho)
                paper_alpha, paper_ratio = paper["alpha_star"][index], paper["risk_ratio"][index]
            lines.append(
                f"| {rho:.2f} | {_number(result.alpha_star[n][r])} | {_number(result.risk_ratio[n][r])} | "
                f"{_number(result.control_alpha_star[n][r])} | {_number(result.control_risk_ratio[n][r])} | "
                f"{_number(paper_alpha, 2)} | {_number(paper_ratio, 2)} |"
            )
        difference = result.paired_difference[n]
        lines += [
            "",
            f"Paired α*(ρ={result.rhos[0]:g}) − α*(ρ={result.rhos[-1]:g}): {_number(difference.value)}, "
            f"{difference.confidence:.0%} bootstrap interval {_interval(difference.ci)} "
            f"({difference.resamples} resamples over examples).",
            "",
        ]
    return "\n".join(lines)


def plot_coupling(result: CouplingResult, model: str, path: Path) -> None:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for i, n in enumerate(result.nfe):
        color = f"C{i}"
        left.plot(result.rhos, result.alpha_star[n], "o-", color=color, label=f"{n} NFE")
        right.plot(result.rhos, result.risk_ratio[n], "o-", color=color, label=f"{n} NFE")
        right.plot(result.rhos, result.control_risk_ratio[n], "x:", color=color, label=f"{n} NFE, control")
    left.set(xlabel="correlation ρ", ylabel="α* (MSE-optimal coefficient)", title=f"{model}: optimal coefficient")
    right.axhline(1.0, color="grey", lw=0.8)
    right.set(xlabel="correlation ρ", ylabel="risk ratio, coefficient 1 vs 0", title="fixed coefficient one")
    left.legend()
    right.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def step_scaling_markdown(result: StepScalingResult, model: str, command: str) -> str:
    lines = _header("Step-average scaling", model, command)
    lines += [
        f"{result.num_trajectories} official-sampler trajectories per NFE ({', '.join(map(str, result.nfe))}), "
        f"{result.substeps} reference substeps per solver step. C*_k = p̄_k − p_k (eq. interval_prediction), latent "
        "contribution (1 − e^{−h})·C*_k (eq. exact_interval_endpoint). Within steps: slope of log RMS against log h "
        f"over the nested widths of m = {', '.join(map(str, result.prefixes))} substeps, one intercept per step. "
        "Across steps: one point per step (full width) over all steps and NFEs. Paper (app:reference_experiments): "
        "ELF-B, 8/16/32 NFE, 32 substeps, 128 trajectories.",
        "",
        "| quantity | fit | fitted exponent | interval | paper | paper interval |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for key, label in (("correction", "C*_k"), ("latent_contribution", "(1 − e^{−h})·C*_k")):
        paper, paper_ci = PAPER_EXPONENTS[key]
        for fit, exponents in (("within steps", result.exponents), ("across steps", result.pooled_exponents)):
            fitted = exponents[key]
            lines.append(
                f"| {label} | {fit} | {_number(fitted.value)} | {_interval(fitted.ci)} | {paper:.2f} | "
                f"{_interval(paper_ci)} |"
            )
    lines += [
        "",
        "| NFE | call | step | h_k | RMS C*_k (m = "
        + ", ".join(map(str, result.prefixes))
        + ") | RMS latent contribution |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for row in result.steps:
        corrections = ", ".join(f"{v:.3g}" for v in row.correction_rms)
        contributions = ", ".join(f"{v:.3g}" for v in row.latent_contribution_rms)
        lines.append(f"| {row.nfe} | {row.call} | {row.step} | {row.width:.4f} | {corrections} | {contributions} |")
    if result.excluded:
        lines += [
            "",
            "Excluded steps: " + "; ".join(f"{e.nfe} NFE step {e.step} ({e.reason})" for e in result.excluded),
        ]
    return "\n".join(lines) + "\n"


def plot_step_scaling(result: StepScalingResult, model: str, path: Path) -> None:
    plt = pyplot()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for axis, key, label, exponent in (
        (left, "correction_rms", "C*_k", "correction"),
        (right, "latent_contribution_rms", "(1 − e^{−h})·C*_k", "latent_contribution"),
    ):
        for i, n in enumerate(result.nfe):
            rows = [row for row in result.steps if row.nfe == n]
            for j, row in enumerate(rows):  # one line per step: its nested widths
                values = getattr(row, key)
                axis.loglog(row.widths, values, "-", color=f"C{i}", alpha=0.35, lw=0.8)
                axis.loglog(row.widths[:1], values[:1], "o", color=f"C{i}", label=f"{n} NFE" if j == 0 else None)
        within, pooled = result.exponents[exponent].value, result.pooled_exponents[exponent].value
        axis.set(
            xlabel="width h (solver coordinate u)",
            ylabel=f"RMS {label}",
        )
        axis.set_title(f"{label}: slope {within:.2f} within steps, {pooled:.2f} across steps", fontsize=10)
        axis.legend(fontsize=8)
    figure.suptitle(f"{model}: step-average correction against step width (lines: nested widths of one step)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def innovation_markdown(result: InnovationResult, model: str, command: str) -> str:
    lines = _header("Overlap energy E(m) by transform assignment", model, command)
    lines += [
        f"{result.num_trajectories} trajectories per configuration, untied sampler with η_T = 0 (no solver "
        "correction), same seeds. E(m) = ½ Σ_n Σ_i ρ_i²⟨m_n, q_i⟩² (eq. weighted_projection_energy); alignment = "
        "cos(Δ, −∇E); ΔE/RMS = (E(m̃) − E(m))/RMS(Δ), Δ = m̃ − m, over the trajectory-steps whose transform acts "
        "(paper Table tab:spectrum_pairing: ELF-B, 8 NFE).",
        "",
    ]
    low, high = result.rho_sq_range
    lines += [f"Overlap spectrum: ρ_i² from {low:.3g} to {high:.3g}."]
    if high - low < 1e-6:
        lines[-1] += (
            " Every ρ_i² is the same, so the assignments permute equal numbers: they are one transform, and Δ is "
            "parallel to ∇E (alignment 1)."
        )
    lines.append("")
    for n in result.nfe:
        lines += [
            f"## {n} NFE (η_R = {result.eta_r[n]:g})",
            "",
            "| configuration | mean E(m) | mean E(m̃) | alignment | ΔE/RMS | steps | paper alignment | paper ΔE/RMS |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for row in result.rows[n]:
            paper = INNOVATION_PAPER.get(row.configuration) if n == 8 else None
            lines.append(
                f"| {row.configuration} | {_number(row.energy, 4)} | {_number(row.energy_transformed, 4)} | "
                f"{_number(row.alignment)} | {_number(row.normalized_decrease, 4)} | {row.transformed_steps} | "
                f"{_number(paper[0], 2) if paper else '–'} | {_number(paper[1], 0) if paper else '–'} |"
            )
        lines.append("")
    return "\n".join(lines)


def plot_innovation(result: InnovationResult, model: str, path: Path) -> None:
    plt = pyplot()
    figure, axes = plt.subplots(1, len(result.nfe), figsize=(5 * len(result.nfe), 4), squeeze=False)
    for axis, n in zip(axes[0], result.nfe, strict=True):
        for configuration, energies in result.by_step[n].items():
            axis.plot(range(1, len(energies) + 1), energies, "o-", label=configuration)
        axis.set(xlabel="step k", ylabel="mean E of the network's SC input", title=f"{model}, {n} NFE")
        axis.set_yscale("log")
        axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
