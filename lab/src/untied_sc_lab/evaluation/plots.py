"""Plots of benchmark results (matplotlib, from the `eval` extra, imported lazily)."""

import os
from pathlib import Path

from .aggregates import Aggregates, DiversityCurves


MATPLOTLIB_INSTALL = 'pip install "untied-sc[eval]"'  # the wheel users' command; the message adds the checkout's


def pyplot(purpose: str = "Plotting benchmark results"):
    """matplotlib's pyplot on the Agg backend, or an `ImportError` saying that `purpose` needs it and how to install
    it (the package's figures: benchmarks, model cards, diagnostics)."""
    try:  # optional extra eval (matplotlib)
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            f"{purpose} needs matplotlib, which is not installed. Install the eval extra: "
            f'`{MATPLOTLIB_INSTALL}` (from a source checkout: `pip install -e ".[eval]"`), or `pip install matplotlib`.'
        ) from error
    return plt


def plot_benchmark(
    aggregates: Aggregates,
    curves: DiversityCurves,
    path: str | os.PathLike,
    *,
    knob: str,
    model: str,
    evaluator: str,
    protocol: str,
) -> Path:
    """Draws a [`run_sweep`] result to `path` (PNG, [`benchmark_figure`]) and returns the path."""
    plt = pyplot()
    figure = benchmark_figure(aggregates, curves, knob=knob, model=model, evaluator=evaluator, protocol=protocol)
    path = Path(path)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def benchmark_figure(
    aggregates: Aggregates, curves: DiversityCurves, *, knob: str, model: str, evaluator: str, protocol: str
):
    """The figure of a [`run_sweep`] result (its [`Aggregates`] and diversity curves; `knob` names the curves' knob,
    `model`, `evaluator` and `protocol` the axes): the paper's main-results figure and the GenPPL–entropy plane.

    Left: GenPPL vs NFE per sampler (mean ± SE over seeds, log-2 NFE axis), each point annotated with its entropy.
    Right: GenPPL vs entropy, every sampler's main runs as markers (one colour per NFE, or per sampler when there is
    one NFE; one shape per sampler; a sampler's NFEs joined by a faint line), so a GenPPL gain bought with lost
    entropy shows; with a diversity sweep, one curve per (sampler, NFE) over the knob values too, so samplers can be
    compared at equal entropy.
    """
    plt = pyplot()
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.8), squeeze=False)
    by_sampler = aggregates.by_sampler
    left = axes[0][0]
    for sampler, by_nfe in by_sampler.items():
        nfes = list(by_nfe)
        means = [aggregates.metric(sampler, n, "gen_ppl").mean for n in nfes]
        errors = [aggregates.metric(sampler, n, "gen_ppl").se or 0.0 for n in nfes]
        left.errorbar(nfes, means, yerr=errors, marker="o", capsize=3, label=sampler)
        for n, mean in zip(nfes, means, strict=True):
            entropy = aggregates.metric(sampler, n, "entropy").mean
            if entropy is not None and mean is not None:
                left.annotate(f"H={entropy:.2f}", (n, mean), textcoords="offset points", xytext=(4, 6), fontsize=7)
    all_nfe = sorted({n for by_nfe in by_sampler.values() for n in by_nfe})
    left.set_xscale("log", base=2)
    left.set_xticks(all_nfe, [str(n) for n in all_nfe])
    left.minorticks_off()
    left.set_xlabel("NFE")
    left.set_ylabel(f"GenPPL ({evaluator}, {protocol} protocol)")
    left.set_title(f"{model}: GenPPL vs NFE (entropy annotated)")
    left.legend(fontsize=7)
    left.grid(alpha=0.3)

    right = axes[0][1]
    # Several NFEs: one colour per NFE, one marker shape per sampler, so a sampler's point sits on the curve of its
    # own NFE. One NFE: the left panel's colour per sampler, so each frontier is told apart at a glance.
    nfe_order = sorted({n for by_nfe in (*curves.values(), *by_sampler.values()) for n in by_nfe})
    sampler_order = list(dict.fromkeys([*by_sampler, *curves]))

    def colour(sampler: str, nfe: int) -> str:
        index = sampler_order.index(sampler) if len(nfe_order) == 1 else nfe_order.index(nfe)
        return f"C{index % 10}"

    for sampler, by_nfe in curves.items():
        for nfe, points in by_nfe.items():
            swept = [p for p in points if p.value is not None and p.entropy.mean is not None]
            xs = [p.entropy.mean for p in swept]
            ys = [p.gen_ppl.mean for p in swept]
            label = f"{sampler} NFE {nfe} ({knob} sweep)"
            right.plot(xs, ys, marker=".", color=colour(sampler, nfe), label=label)
            for p, x, y in zip(swept, xs, ys, strict=True):
                right.annotate(f"{p.value:g}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=6)
    markers = "osD^v<>P*X"
    for index, (sampler, by_nfe) in enumerate(by_sampler.items()):
        marker = markers[index % len(markers)]
        stats = [
            (nfe, aggregates.metric(sampler, nfe, "entropy"), aggregates.metric(sampler, nfe, "gen_ppl"))
            for nfe in by_nfe
        ]
        drawn = [(nfe, x.mean, y.mean) for nfe, x, y in stats if x.mean is not None and y.mean is not None]
        right.plot([x for _, x, _ in drawn], [y for _, _, y in drawn], color="black", alpha=0.15, linewidth=0.8)
        for nfe, x, y in drawn:
            right.scatter(x, y, marker=marker, s=36, color=colour(sampler, nfe), edgecolors="black", zorder=3)
        right.scatter([], [], marker=marker, s=36, color="white", edgecolors="black", label=sampler)
    if len(nfe_order) > 1:  # the colour key
        for nfe in nfe_order:
            right.scatter([], [], marker="s", s=36, color=colour("", nfe), label=f"NFE {nfe}")
    right.set_xlabel("unigram entropy (nats)")
    right.set_ylabel("GenPPL")
    right.set_title(f"GenPPL vs entropy{f' ({knob} sweep)' if curves else ''}: lower right is better")
    right.legend(fontsize=6)
    right.grid(alpha=0.3)
    figure.tight_layout()
    return figure
