"""Does a from-scratch retrain with the documented command reach the bundled model's quality? Compares two full runs.

    python benchmarks/compare_runs.py runs/langflow-small runs/langflow-small-retrain --family langflow \
        --name langflow-small

`retrain_prefix.py` checks that a retrain follows the reference step by step at the start; this script checks the end:
the validation metrics both runs logged at the same steps (the last one they share, and the largest relative gap over
the last third of the shared evaluations), the training loss averaged over the last `--window` logged steps of each
run, and (LangFlow, with `--per-gamma`) the held-out cross-entropy per noise level γ of both final EMA models, with and
without self-conditioning. A retrain on another device, or one whose step count differs (a reference stopped by a
wall-clock budget), is not bitwise; "the same quality" is read as relative gaps of a few percent at most.
Writes benchmarks/results/<name>-retrain.md and .json.
"""

import argparse
import json
import shlex
import sys
import time
from pathlib import Path


TRAIN_KEYS = {"langflow": ("loss", "loss_sc", "loss_no_sc"), "elf": ("loss", "l2_sc", "l2_no_sc", "ce")}


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "loss_log.jsonl").read_text().splitlines() if line.strip()]


def relative_gap(reference: float, retrain: float) -> float:
    return (retrain - reference) / abs(reference)


def compare_validation(reference: list[dict], retrain: list[dict]) -> dict:
    """Validation metrics (`val_*`) at the evaluation steps both runs logged."""
    ref = {row["step"]: row for row in reference if any(k.startswith("val_") for k in row)}
    new = {row["step"]: row for row in retrain if any(k.startswith("val_") for k in row)}
    shared = sorted(set(ref) & set(new))
    if not shared:
        raise ValueError("The two runs logged no validation metrics at a common step; compare runs of one recipe.")
    keys = sorted(k for k in ref[shared[-1]] if k.startswith("val_") and k in new[shared[-1]])
    last_third = shared[len(shared) * 2 // 3 :]
    return {
        "shared_steps": len(shared),
        "last_shared_step": shared[-1],
        "final_steps": [max(ref), max(new)],
        "at_last_shared_step": {
            k: {"reference": ref[shared[-1]][k], "retrain": new[shared[-1]][k]}
            | {"relative_gap": relative_gap(ref[shared[-1]][k], new[shared[-1]][k])}
            for k in keys
        },
        "at_final_steps": {k: {"reference": ref[max(ref)][k], "retrain": new[max(new)][k]} for k in keys},
        "largest_gap_last_third": {
            k: max((relative_gap(ref[s][k], new[s][k]) for s in last_third), key=abs) for k in keys
        },
        "last_third_steps": [last_third[0], last_third[-1]],
    }


def compare_training(reference: list[dict], retrain: list[dict], keys: tuple[str, ...], window: int) -> dict:
    """Training losses averaged over each run's last `window` logged rows."""

    def tail_mean(rows: list[dict], key: str) -> float:
        values = [row[key] for row in rows if key in row][-window:]
        return sum(values) / len(values)

    return {
        k: {"reference": tail_mean(reference, k), "retrain": tail_mean(retrain, k)}
        | {"relative_gap": relative_gap(tail_mean(reference, k), tail_mean(retrain, k))}
        for k in keys
    }


def per_gamma(reference_dir: Path, retrain_dir: Path, windows: int) -> dict:
    """Held-out CE per γ of both runs' newest EMA snapshots (LangFlow), on the same validation windows."""
    from transformers import AutoTokenizer

    from untied_sc_lab.training.langflow import (
        DEFAULT_EVAL_GAMMAS,
        LangFlowTrainConfig,
        evaluate_per_gamma,
        fixed_windows,
        load_run_model,
        load_split_tokens,
    )

    result = {}
    for label, run_dir in (("reference", reference_dir), ("retrain", retrain_dir)):
        snapshot = max(run_dir.glob("ema-step*.pt"), key=lambda p: int(p.stem[8:]))
        model, _ = load_run_model(run_dir, snapshot)
        tokenizer = AutoTokenizer.from_pretrained(run_dir / "tokenizer")
        corpus = Path(LangFlowTrainConfig.corpus_dir)
        tokens = load_split_tokens(corpus / "validation.txt", tokenizer, LangFlowTrainConfig.token_cache_dir)
        rows = evaluate_per_gamma(
            model, fixed_windows(tokens, windows, model.config.max_length, seed=0), DEFAULT_EVAL_GAMMAS, seed=0
        )
        result[label] = {"snapshot": snapshot.name, "rows": rows}
    return result


def format_markdown(results: dict) -> str:
    val = results["validation"]
    lines = [
        f"# Full retrain of {results['name']}: reference {results['reference']} vs retrain {results['retrain']}",
        "",
        f"Validation metrics logged by both runs at {val['shared_steps']} common steps; final steps "
        f"{val['final_steps'][0]} (reference) and {val['final_steps'][1]} (retrain). Relative gap = (retrain − "
        "reference) / reference.",
        "",
        f"| metric | reference @ {val['last_shared_step']} | retrain @ {val['last_shared_step']} | gap | "
        f"largest gap, steps {val['last_third_steps'][0]}–{val['last_third_steps'][1]} | reference final | "
        "retrain final |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for k, row in val["at_last_shared_step"].items():
        final = val["at_final_steps"][k]
        lines.append(
            f"| {k} | {row['reference']:.4f} | {row['retrain']:.4f} | {row['relative_gap']:+.2%} | "
            f"{val['largest_gap_last_third'][k]:+.2%} | {final['reference']:.4f} | {final['retrain']:.4f} |"
        )
    lines += [
        "",
        f"Training loss, mean of each run's last {results['window']} logged rows:",
        "",
        "| loss | reference | retrain | gap |",
        "|---|---:|---:|---:|",
    ]
    for k, row in results["training"].items():
        lines.append(f"| {k} | {row['reference']:.4f} | {row['retrain']:.4f} | {row['relative_gap']:+.2%} |")
    if results.get("per_gamma"):
        ref, new = results["per_gamma"]["reference"], results["per_gamma"]["retrain"]
        gammas = [row["gamma"] for row in ref["rows"]]
        lines += [
            "",
            f"Held-out (validation) CE per γ in nats, {results['windows']} windows, of the EMA snapshots "
            f"{ref['snapshot']} (reference) and {new['snapshot']} (retrain):",
            "",
            "| γ | " + " | ".join(f"{g:g}" for g in gammas) + " |",
            "|---|" + "---:|" * len(gammas),
        ]
        for key, label in (("ce_no_sc", "no SC"), ("ce_sc", "SC")):
            lines.append(f"| reference, {label} | " + " | ".join(f"{r[key]:.3f}" for r in ref["rows"]) + " |")
            lines.append(f"| retrain, {label} | " + " | ".join(f"{r[key]:.3f}" for r in new["rows"]) + " |")
    lines += ["", f"Wall time {results['wall_seconds']:.1f} s. Command:", "", "```", results["command"], "```", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reference", type=Path, help="The bundled model's run folder.")
    parser.add_argument("retrain", type=Path, help="The retrain's run folder.")
    parser.add_argument("--family", choices=sorted(TRAIN_KEYS), required=True)
    parser.add_argument("--name", required=True, help="Model name of the output files.")
    parser.add_argument("--window", type=int, default=50, help="Logged rows averaged for the training loss.")
    parser.add_argument("--per-gamma", action="store_true", help="Also held-out CE per γ (LangFlow).")
    parser.add_argument("--windows", type=int, default=128, help="Validation windows of --per-gamma.")
    parser.add_argument("--output-dir", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    if args.per_gamma and args.family != "langflow":
        parser.error("--per-gamma evaluates LangFlow runs.")
    began = time.perf_counter()
    reference, retrain = read_rows(args.reference), read_rows(args.retrain)
    results = {
        "name": args.name,
        "reference": str(args.reference),
        "retrain": str(args.retrain),
        "window": args.window,
        "validation": compare_validation(reference, retrain),
        "training": compare_training(reference, retrain, TRAIN_KEYS[args.family], args.window),
        "windows": args.windows,
        "per_gamma": per_gamma(args.reference, args.retrain, args.windows) if args.per_gamma else None,
        "command": shlex.join(["python", "benchmarks/compare_runs.py", *sys.argv[1:]]),
    }
    results["wall_seconds"] = time.perf_counter() - began
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / f"{args.name}-retrain.json").write_text(json.dumps(results, indent=1) + "\n")
    markdown = format_markdown(results)
    (args.output_dir / f"{args.name}-retrain.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
