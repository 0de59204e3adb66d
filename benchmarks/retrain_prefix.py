"""Does the documented training command reproduce a bundled model's run? Retrains its first steps and compares logs.

    python benchmarks/retrain_prefix.py runs/langflow-small --family langflow --steps 100

A full retrain costs the whole original budget (about two CPU hours per bundled model). Training is deterministic
(data order, noise levels and self-conditioning draws come from seeded generators; resume is bitwise, see
tests/test_training.py), so a from-scratch run with the same settings must log the same losses as the reference run
for as long as their learning-rate schedules agree: at every step of the warm-up (the schedule there does not depend
on the total step count), and at every step when the reference run used a fixed `--max-steps`. This script starts a
fresh run with the reference run's `config.json` (only the run folder, `max_steps` and `budget_minutes` changed),
stops it at step `--steps` (the schedule still runs to the reference's step count) and compares every logged row the two runs share. Bitwise equality needs the same
CPU kind and thread count; otherwise expect agreement to float rounding.
Writes benchmarks/results/<run>-retrain-prefix.md and .json.
"""

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from untied_sc.training.langflow import start_or_resume


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
    warmup = config["warmup_steps"]
    if config.get("max_steps") is None and args.steps > warmup:
        sys.exit(
            f"{run} fixed its step count from a wall-clock budget, so schedules agree only in the warm-up: "
            f"use --steps ≤ {warmup}."
        )
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        fresh_dir = Path(scratch) / "run"
        given = {key: value for key, value in config.items() if key not in FIXED_KEYS}
        # The reference's schedule: its own fixed count, or (budget runs) any count past the warm-up.
        given.update(run_dir=str(fresh_dir), max_steps=config.get("max_steps") or 10 * warmup, progress=False)
        if args.family == "elf":
            from untied_sc.training.elf import ELFTrainer as trainer_class
        else:
            from untied_sc.training.langflow import LangFlowTrainer as trainer_class
        start_or_resume(trainer_class, given, resume=False).train(stop_at_step=args.steps)
        rows = compare(read_log(run / "loss_log.jsonl"), read_log(fresh_dir / "loss_log.jsonl"))
    seconds = time.perf_counter() - began
    if not rows:
        sys.exit("The two logs share no step; is --steps at least the log interval?")
    worst = max((v["relative_difference"] for r in rows for k, v in r.items() if k != "step"), default=math.nan)
    name = run.name
    command_line = f"python benchmarks/retrain_prefix.py {args.run_dir} --family {args.family} --steps {args.steps}"
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}-retrain-prefix.json").write_text(
        json.dumps({"command": command_line, "seconds": seconds, "max_relative_difference": worst, "rows": rows})
    )
    keys = [k for k in COMPARED if k in rows[0]]
    lines = [
        f"# {name}: the first {args.steps} steps retrained from scratch",
        "",
        f"`{command_line}` ({seconds / 60:.1f} min). Largest relative difference over every logged value: "
        f"**{worst:.2e}**.",
        "",
        "| step | " + " | ".join(f"{k} (reference → retrained)" for k in keys) + " |",
        "|---:|" + "---|" * len(keys),
    ]
    for row in rows:
        cells = [f"{row[k]['reference']:.6g} → {row[k]['retrained']:.6g}" for k in keys if k in row]
        lines.append(f"| {row['step']} | " + " | ".join(cells) + " |")
    (out / f"{name}-retrain-prefix.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
