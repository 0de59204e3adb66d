"""Model cards of the bundled pipelines: `README.md` (data, size, steps, loss curve, GenPPL table) and `loss_curve.png`.

    python -m untied_sc_lab.training.model_card PIPELINE_DIR --run-dir RUN_DIR [--quality QUALITY_JSON]
        [--per-gamma PER_GAMMA_MD] [--train-command "..."] [--title "..."]

Everything in the card is read from files: the run's `loss_log.jsonl` (the curve), the pipeline's
`training_info.json` (size, steps, tokens, time), the corpus manifest, `benchmarks/model_quality.py`'s JSON (GenPPL
table) and `untied-sc train <family> evaluate`'s per-γ table. Nothing is typed in by hand.
"""

import argparse
import json
from pathlib import Path

from .corpus import DEFAULT_SOURCES


def _smooth(values: list[float], width: int = 20) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= width:
            total -= values[i - width]
        out.append(total / min(i + 1, width))
    return out


def _plot_series(axis, rows: list[dict], series: tuple[tuple[str, str], ...], smooth: bool, style: str = "-") -> None:
    """One line per (key, label) whose key every row has; training rows smoothed, validation rows as points."""
    for key, label in series:
        points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            steps, values = zip(*points, strict=True)
            axis.plot(
                steps, _smooth(list(values)) if smooth else values, style, label=label, linewidth=1.2, markersize=3
            )


def plot_loss_curve(log_path: str | Path, out_path: str | Path) -> Path:
    """Training and validation losses with and without self-conditioning vs step (training: moving average of 20 rows).

    LangFlow logs one cross-entropy (`loss_sc`, `loss_no_sc`, `val_loss_*`); ELF logs the velocity L2 of the
    denoiser rows (`l2_sc`, `l2_no_sc`, `val_vloss_*`) and the decoder CE (`ce`, `val_decode_ce`), drawn side by side.
    """
    from ..evaluation.plots import pyplot  # keeps this script's --help torch-free (evaluation loads torch)

    plt = pyplot("Drawing the training curves")
    rows = [json.loads(line) for line in Path(log_path).read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r]
    elf = any("l2_sc" in r for r in train)
    if elf:
        figure, (axis, decoder) = plt.subplots(1, 2, figsize=(9.6, 3.6), dpi=110)
        _plot_series(axis, train, (("l2_no_sc", "train, SC off"), ("l2_sc", "train, SC on")), smooth=True)
        _plot_series(
            axis,
            rows,
            (("val_vloss_no_sc", "validation, SC off"), ("val_vloss_sc", "validation, SC on")),
            False,
            "o--",
        )
        axis.set_ylabel("velocity loss (per dimension)")
        _plot_series(decoder, train, (("ce", "train"),), smooth=True)
        _plot_series(decoder, rows, (("val_decode_ce", "validation, clean latents"),), False, "o--")
        decoder.set_ylabel("decoder CE (nats/token)")
        axes = (axis, decoder)
    else:
        figure, axis = plt.subplots(figsize=(6.4, 3.6), dpi=110)
        _plot_series(axis, train, (("loss_no_sc", "train, SC off"), ("loss_sc", "train, SC on")), smooth=True)
        _plot_series(
            axis, rows, (("val_loss_no_sc", "validation, SC off"), ("val_loss_sc", "validation, SC on")), False, "o--"
        )
        axis.set_ylabel("loss (nats/token)")
        axes = (axis,)
    for each in axes:
        each.set_xlabel("step")
        each.grid(alpha=0.3)
        each.legend(fontsize=8)
    figure.tight_layout()
    out = Path(out_path)
    figure.savefig(out)
    plt.close(figure)
    return out


def _evaluator_name(recorded: str) -> str:
    """The evaluator named exactly; quality files before the exact name recorded "smollm2-135m (bfloat16)"."""
    from ..evaluation.evaluator import describe_evaluator  # keeps this script's --help torch-free

    name, _, dtype = recorded.partition(" (")
    return describe_evaluator(name, dtype.rstrip(")") or None) if name == "smollm2-135m" else recorded


def quality_table(quality: dict) -> str:
    """The GenPPL table of a `benchmarks/model_quality.py` result."""
    lines = ["| text | NFE | GenPPL | entropy (nats) | Rep-4 |", "|---|---:|---:|---:|---:|"]
    for row in quality["rows"]:
        lines.append(
            f"| {row['sampler']} | {row['nfe'] or ''} | {row['gen_ppl']:.1f} | {row['entropy_evaluator_ids']:.3f} "
            f"| {row['rep_4']:.3f} |"
        )
    return "\n".join(lines)


def samples_section(quality: dict) -> list[str]:
    """
    Markdown lines with the unedited samples that `benchmarks/model_quality.py` kept (`examples`) of the official
    sampler at its largest NFE and the untied sampler at its smallest; none for a result without them.
    """
    rows = [row for row in quality["rows"] if row.get("nfe") and row.get("examples")]
    official = [row for row in rows if row["sampler"] == "official (SC on)"]
    untied = [row for row in rows if row["sampler"] == "untied"]
    chosen = ([max(official, key=lambda row: row["nfe"])] if official else []) + (
        [min(untied, key=lambda row: row["nfe"])] if untied else []
    )
    if not chosen:
        return []
    lines = [
        "## Samples",
        "",
        "The first samples of the quality run above (same seeds for every sampler), unedited.",
        "",
    ]
    for row in chosen:
        lines += [f"**{row['sampler']}, {row['nfe']} steps**", ""]
        for text in row["examples"]:
            lines += ["```text", text.strip(), "```", ""]
    return lines


def write_model_card(
    pipeline_dir: str | Path,
    run_dir: str | Path,
    title: str,
    train_command: str,
    quality: str | Path | None = None,
    per_gamma: str | Path | None = None,
    corpus_manifest: str | Path = "data/corpus/manifest.json",
    notes: str = "",
    hardware: str | None = None,
) -> Path:
    """Writes `<pipeline_dir>/README.md` and `<pipeline_dir>/loss_curve.png`.

    `hardware` names what trained it (default: "2 CPU cores" for a CPU run, "one GPU" otherwise).
    """
    folder, run = Path(pipeline_dir), Path(run_dir)
    info = json.loads((folder / "training_info.json").read_text())
    plot_loss_curve(run / "loss_log.jsonl", folder / "loss_curve.png")
    config = info.get("config") or {}
    on_cpu = config.get("device", "cpu") == "cpu"
    hardware = hardware or ("2 CPU cores" if on_cpu else "one GPU")
    manifest_path = Path(corpus_manifest)
    sources, source_names = "", []
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        source_names = manifest.get("settings", {}).get("sources", [])
        sources = ", ".join(source_names)
    transformer_config = json.loads((folder / "transformer" / "config.json").read_text())
    family = "ELF" if "latent_dim" in transformer_config else "LangFlow"
    docs, data_target = (
        ("docs/training-elf.md", "make elf-data") if family == "ELF" else ("docs/training.md", "make data")
    )
    if source_names and tuple(source_names) != DEFAULT_SOURCES:  # `make data` builds the default set only
        data_target = f"untied-sc data build --sources {','.join(source_names)}"
    lines = [
        "---",
        "library_name: diffusers",
        "tags: [untied-sc, text-generation, continuous-diffusion, flow-matching]",
        "---",
        "",
        f"# {title}",
        "",
        f"A small {family} trained on {'CPU' if on_cpu else 'a GPU'} for the `untied-sc` package, so that the package "
        "runs offline and shows the",
        "untied self-conditioning sampler on a model trained here. It is far from the papers' checkpoints: read the",
        "limitations below before judging text quality.",
        "",
        "```python",
        f"from untied_sc import {family}Pipeline",
        "",  # as ruff formats it (it formats the Markdown's code blocks)
        f'pipe = {family}Pipeline.from_pretrained("hub_artifacts/{folder.name}")',
        "texts = pipe(batch_size=4, num_inference_steps=8).texts",
        "```",
        "",
        "## Training",
        "",
        f"- Data: {sources or 'see data/corpus/manifest.json'} (`{data_target}`, {docs}); train split only.",
        f"- Size: {info['parameters'] / 1e6:.2f}M parameters, stored as {info.get('dtype', 'float32')}.",
        f"- Steps: {info['step']:,} of batch {config.get('batch_size')} × {config.get('seq_len')} tokens "
        f"({(info.get('tokens_seen') or 0) / 1e6:.1f}M tokens seen), {(info.get('train_seconds') or 0) / 60:.1f} min "
        f"on {hardware}.",
        f"- Command: `{train_command}`.",
        "",
        "![loss curve](loss_curve.png)",
        "",
    ]
    if per_gamma is not None:
        lines += ["## Held-out loss per noise level", "", Path(per_gamma).read_text().strip(), ""]
    if quality is not None:
        data = json.loads(Path(quality).read_text())
        lines += [
            "## Generative perplexity",
            "",
            f"Evaluator: {_evaluator_name(data['evaluator'])}; {data['family']} protocol, {data['num_samples']} samples per row "
            f"(`{data['command']}`).",
            "",
            quality_table(data),
            "",
            *samples_section(data),
        ]
    if notes:
        lines += [notes.strip(), ""]
    out = folder / "README.md"
    out.write_text("\n".join(lines))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline")
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--title", required=True)
    parser.add_argument("--train-command", required=True)
    parser.add_argument("--quality")
    parser.add_argument("--per-gamma")
    parser.add_argument("--corpus-manifest", default="data/corpus/manifest.json")
    parser.add_argument("--notes-file")
    parser.add_argument("--hardware", help='What trained it, e.g. "one NVIDIA H200 GPU".')
    args = parser.parse_args(argv)
    notes = Path(args.notes_file).read_text() if args.notes_file else ""
    path = write_model_card(
        args.pipeline,
        args.run_dir,
        args.title,
        args.train_command,
        args.quality,
        args.per_gamma,
        args.corpus_manifest,
        notes,
        args.hardware,
    )
    print(f"Wrote {path}")


if __name__ == "__main__":
    main()
