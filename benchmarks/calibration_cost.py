"""Calibration cost and held-out consistency.

    python benchmarks/calibration_cost.py elf-b-random [--layers 12] [--batch-size 4] [--steps 8]
    python benchmarks/calibration_cost.py PIPELINE_DIR [--nfe 8 16 32 64] [--bank-size 16]

`elf-b-random`: seconds per trajectory-step of the reference recurrence (one network call plus the correction)
and of the ELF response-Gram measurement on an ELF-B-sized network (random weights, L = 1024) on this machine.
A pipeline folder: seconds per calibrated NFE, and the relative error between the calibrated σ_k, μ_k and those
of a held-out bank (sampling error). Writes benchmarks/results/calibration_cost*.json.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from untied_sc import ELFPipeline, ELFScheduler, ELFTransformerModel
from untied_sc.calibration import (
    calibrate_pipeline,
    elf_response_gram,
    overlap_basis_from_model,
    trajectory_statistics,
)
from untied_sc.calibration.calibrate import bank_seeds, run_updates
from untied_sc.calibration.reference import MomentAccumulator, reference_recurrence
from untied_sc.pipelines import load_pipeline


class _Tokenizer:
    """Only what the pipeline's vocabulary check reads (the benchmark never decodes)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size


def elf_b_random(args) -> dict:
    torch.manual_seed(0)
    model = ELFTransformerModel.from_preset("elf-b", num_layers=args.layers).eval()
    with torch.no_grad():
        model.final_layer.linear.weight.normal_(std=0.02)
    pipe = ELFPipeline(model, ELFScheduler(sde_gamma=2.0), _Tokenizer(model.config.vocab_size))
    scheduler = reference_recurrence("elf", 1.0, alpha=0.7)
    scheduler.accumulator = MomentAccumulator(args.steps, model.config.latent_dim)
    start = time.perf_counter()
    run_updates(pipe, scheduler, args.steps, torch.Generator().manual_seed(0), args.batch_size)
    reference = (time.perf_counter() - start) / (args.steps * args.batch_size)
    start = time.perf_counter()
    elf_response_gram(pipe, overlap_basis_from_model(model), [torch.Generator().manual_seed(1)], args.batch_size, 4)
    gram_steps = 2  # steps 1..K_u−2 of a 4-step trajectory, each with its 3 network calls
    gram = (time.perf_counter() - start) / (gram_steps * args.batch_size)
    return {
        "network": f"ELF-B sized, {args.layers} layers, random weights, L = 1024",
        "batch_size": args.batch_size,
        "threads": torch.get_num_threads(),
        "seconds_per_trajectory_step_reference": reference,
        "seconds_per_trajectory_step_response_gram": gram,
        "paper_h100_elf_b_8_nfe_seconds": 128,
        "paper_trajectories_elf_b": "2 x 2048 (4 x 1024)",
        "extrapolated_cpu_seconds_elf_b_8_nfe_paper_banks": reference * 8 * 4096,
    }


def pipeline_folder(args) -> dict:
    pipe = load_pipeline(args.pipeline)
    pipe.set_progress_bar_config(disable=True)
    result = {"pipeline": args.pipeline, "bank_size": args.bank_size, "nfe": {}}
    start = time.perf_counter()
    calibration = calibrate_pipeline(pipe, args.nfe, bank_size=args.bank_size, batch_size=args.batch_size)
    result["total_seconds"] = time.perf_counter() - start
    result["base_scale_seconds"] = calibration.base_scale_seconds
    for summary in calibration.summaries:
        n = summary.num_inference_steps
        step = calibration.statistics.for_steps(n)
        alpha = calibration.statistics.config.calibration_alpha[str(n)]
        held_mean, held_rms, held_distance = trajectory_statistics(
            pipe,
            n,
            calibration.statistics.base_correction_scale,
            alpha,
            bank_seeds(1000, 0, args.bank_size, args.batch_size),
            bank_seeds(1000, 1, args.bank_size, args.batch_size),
            progress=False,
        )
        active = step.rms > 0
        result["nfe"][str(n)] = {
            "seconds": summary.seconds,
            "active_steps": int(active.sum()),
            "rms_relative_error": ((held_rms - step.rms).abs() / step.rms)[active].tolist(),
            "mean_relative_error": ((held_mean - step.mean).norm(dim=1) / step.mean.norm(dim=1))[active].tolist(),
            "cosine_distance_abs_error": (held_distance - step.cosine_distance).abs()[active].tolist(),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--nfe", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--bank-size", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--output")
    args = parser.parse_args()
    result = elf_b_random(args) if args.pipeline == "elf-b-random" else pipeline_folder(args)
    name = "elf_b_random" if args.pipeline == "elf-b-random" else Path(args.pipeline).name
    output = Path(args.output or f"benchmarks/results/calibration_cost_{name}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
