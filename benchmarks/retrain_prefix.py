"""Does the documented training command reproduce a bundled model's run? Retrains its first steps and compares logs.

    python benchmarks/retrain_prefix.py runs/langflow-small --family langflow --steps 100

A full retrain costs the whole original budget. Training is deterministic (data order, noise levels and
self-conditioning draws come from seeded generators; resume is bitwise, see tests/test_training.py), so a
from-scratch run with the same settings must log the same losses as the reference run for as long as their
learning-rate schedules agree. This script starts a fresh run with the reference run's `config.json` (only the run
folder, `max_steps` and `budget_minutes` changed), stops it at step `--steps` (the schedule still runs to the
reference's step count) and compares every logged row the two runs share.

A reference that used a fixed `--max-steps` has the same schedule at every step. One that fixed its step count from a
wall-clock budget is retrained with its final count (the log's `total_steps`): the warm-up agrees exactly, later steps
only closely, since the reference's count moved until a third of its run. Bitwise equality needs the same device kind
(CPU model and thread count, or GPU model); otherwise expect agreement to float rounding.
Writes benchmarks/results/<run>-retrain-prefix.md and .json.
"""

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from untied_sc_lab.training.trainer import start_or_resume


COMPARED = ("loss", "loss_sc", "loss_no_sc", "l2_sc", "l2_no_sc", "ce", "grad_norm", "lr")
FIXED_KEYS = ("run_dir", "max_steps", "budget_minutes", "progress")


def read_log(path: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, path.read_text().splitlines()) if "loss" in row}


def compare(reference: dict[int, dict], fresh: dict[int, dict]) -> list[dict]:
    rows = []
    for step in sorted(set(reference) & set(fresh)):
        row = {"step": step}
        for key in COMPARED:
            a, b = reference[step].get(key), fresh[step].get(key)
            if a is None or b is None:
                continue
            row[key] = {"reference": a, "retrained": b, "relative_difference": abs(a - b) / max(abs(a), 1e-12)}
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="The reference run folder (config.json, loss_log.jsonl).")
    parser.add_argument("--family", choices=["langflow", "elf"], required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--output-dir", default="benchmarks/results")
    args = parser.parse_args()

    run = Path(args.run_dir)
    config = json.loads((run / "config.json").read_text())
    reference = read_log(run / "loss_log.jsonl")
    total_steps = config.get("max_steps") or reference[max(reference)].get("total_steps")
    if total_steps is None:
        sys.exit(f"{run}'s log records no total_steps: cannot rebuild its learning-rate schedule.")
    if config.get("max_steps") is None and args.steps > config["warmup_steps"]:
        print(
            f"{run} fixed its step count ({total_steps}) from a wall-clock budget: after the warm-up "
            f"({config['warmup_steps']} steps) expect close, not equal, values.",
            file=sys.stderr,
        )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        fresh_dir = Path(scratch) / "run"
        given = {key: value for key, value in config.items() if key not in FIXED_KEYS}
        given.update(run_dir=str(fresh_dir), max_steps=total_steps, progress=False)
        if args.family == "elf":
            from untied_sc_lab.training.elf import ELFTrainer as trainer_class
        else:
            from untied_sc_lab.training.langflow import LangFlowTrainer as trainer_class
        start_or_resume(trainer_class, given, resume=False).train(stop_at_step=args.steps)
        rows = compare(reference, read_log(fresh_dir / "loss_log.jsonl"))
    seconds = time.perf_counter() - began
    if not rows:
        sys.exit("The two logs share no step; is --steps at least the log interval?")
    command_line = f"python benchmarks/retrain_prefix.py {args.run_dir} --family {args.family} --steps {args.steps}"
    report = {"command": command_line, "seconds": seconds, "device": config.get("device", "cpu"), "rows": rows}
    print(write_report(report, run.name, config["warmup_steps"], Path(args.output_dir)))


def largest_difference(rows: list[dict], keys=COMPARED) -> float:
    return max((v["relative_difference"] for r in rows for k, v in r.items() if k in keys), default=math.nan)


def write_report(report: dict, name: str, warmup: int, out: Path) -> str:
    """Writes `<name>-retrain-prefix.json` and `.md`; returns the Markdown."""
    rows = report["rows"]
    report["max_relative_difference"] = largest_difference(rows)
    warm, later = [r for r in rows if r["step"] <= warmup], [r for r in rows if r["step"] > warmup]
    report["max_relative_difference_warmup"] = largest_difference(warm)
    report["max_relative_difference_loss_after_warmup"] = largest_difference(later, ("loss", "loss_sc", "loss_no_sc"))
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-retrain-prefix.json").write_text(json.dumps(report))
    steps = rows[-1]["step"]
    lines = [
        f"# {name}: the first {steps} steps retrained from scratch",
        "",
        f"`{report['command']}` ({report['seconds'] / 60:.1f} min on {report.get('device', 'cpu')}). Largest relative "
        f"difference over every logged value: **{report['max_relative_difference']:.2e}**; within the warm-up "
        f"(≤ {warmup} steps): **{report['max_relative_difference_warmup']:.2e}**.",
    ]
    if later:
        lines[-1] += (
            f" After it, the losses differ by at most **{report['max_relative_difference_loss_after_warmup']:.2e}**."
        )
    keys = [k for k in COMPARED if k in rows[0]]
    lines += [
        "",
        "| step | " + " | ".join(f"{k} (reference → retrained)" for k in keys) + " |",
        "|---:|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{row[k]['reference']:.6g} → {row[k]['retrained']:.6g}" for k in keys if k in row]
        lines.append(f"| {row['step']} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    (out / f"{name}-retrain-prefix.md").write_text(text)
    return text


if __name__ == "__main__":
    main()
