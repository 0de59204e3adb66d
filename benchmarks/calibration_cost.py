"""Calibration cost at the paper's size, and held-out consistency.

    python benchmarks/calibration_cost.py elf-b-random --device cuda --dtype bfloat16 [--bank-size 2048] [--nfe 8]
    torchrun --standalone --nproc_per_node 2 benchmarks/calibration_cost.py elf-b-random --device cpu --layers 2 ...
    python benchmarks/calibration_cost.py PIPELINE_DIR [--nfe 8 16 32 64] [--bank-size 16]

`elf-b-random`: the whole `calibrate_pipeline` (overlap basis, ELF base scales, the two banks of every NFE) on an
ELF-B-shaped network with random weights (L = 1024; `--layers`/`--max-length` scale it down for a CPU run), timed
on `--device` with the network in `--dtype` (the statistics accumulate in float64; the base scales' finite
differences run in float32). The paper: 128 s on one H100 for ELF-B, 8 NFE, 2 × 2048 trajectories. Under torchrun
every process runs its share of each bank's batches (`untied_sc.calibration.reduction`), and the JSON (written by the
main process) records the number of processes, so 1- and N-process runs of the same bank give the speed-up.
Writes benchmarks/results/calibration_cost_elf_b_<device>_<dtype>_bank<N>_<P>proc.json; an existing file is kept
unless `--overwrite`. (benchmarks/results/calibration_cost_elf_b_random.json is a per-trajectory-step CPU timing, in
its own layout.)

A pipeline folder: seconds per calibrated NFE, and the relative error between the calibrated σ_k, μ_k and those of a
held-out bank (sampling error). Writes benchmarks/results/calibration_cost_<folder>.json.
"""

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from untied_sc import ELFPipeline, ELFScheduler, ELFTransformerModel
from untied_sc.calibration import calibrate_pipeline, trajectory_statistics
from untied_sc.calibration.calibrate import bank_seeds
from untied_sc.calibration.reduction import calibration_process_state, is_main_process, wait_for_everyone
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.sampler_statistics import num_update_steps


PAPER = {"paper_h100_elf_b_8_nfe_seconds": 128, "paper_trajectories_elf_b": "2 x 2048"}


class _Tokenizer:
    """Only what the pipeline's vocabulary check reads (calibration never decodes)."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.vocab_size


def elf_b_random_pipeline(layers: int, max_length: int) -> ELFPipeline:
    """ELF-B's shape with random weights (as benchmarks/overhead.py builds it), float32 on the CPU."""
    torch.manual_seed(0)
    model = ELFTransformerModel.from_preset("elf-b", num_layers=layers, max_length=max_length).eval()
    with torch.no_grad():  # the official init zeroes the flow head; give it weights so predictions are non-trivial
        model.final_layer.linear.weight.normal_(std=0.02)
    return ELFPipeline(model, ELFScheduler(), _Tokenizer(model.config.vocab_size))


def network_calls(args) -> dict[str, int]:
    """Trajectory-evaluations of the network: base scales (float32) and banks (`--dtype`)."""
    updates = num_update_steps("elf", args.base_scale_steps)
    # per trajectory: the first call, one per update step k < K_u − 1, and two perturbed calls for k = 1..K_u − 2
    per_base_trajectory = 1 + (updates - 1) + 2 * (updates - 2)
    return {
        "base_scales": args.base_scale_bank_size * per_base_trajectory,
        "banks": sum(2 * args.bank_size * num_update_steps("elf", n) for n in args.nfe),
    }


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cores = os.cpu_count()
    return f"cpu ({platform.processor() or platform.machine()}, {cores} cores, {torch.get_num_threads()} threads per process)"


def elf_b_random(args, state) -> dict:
    pipe = elf_b_random_pipeline(args.layers, args.max_length)
    parameters = sum(p.numel() for p in pipe.transformer.parameters())
    start, cpu_start = time.perf_counter(), time.process_time()
    result = calibrate_pipeline(
        pipe,
        args.nfe,
        bank_size=args.bank_size,
        batch_size=args.batch_size,
        base_scale_steps=args.base_scale_steps,
        base_scale_bank_size=args.base_scale_bank_size,
        progress=not args.no_progress,
        device=args.device if state is None else state.device,
        dtype=getattr(torch, args.dtype),
        process_state=state,
        generator_device=args.generator_device,
    )
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    calls = network_calls(args)
    trajectories = sum(s.trajectories for s in result.summaries)
    return {
        "network": f"ELF-B shaped ({parameters / 1e6:.1f}M parameters, {args.layers} layers), random weights, "
        f"L = {args.max_length}",
        "device": device_name(torch.device(result.device)),
        "dtype": result.dtype,
        "base_scale_dtype": "float32",
        "processes": result.num_processes,
        "generator_device": result.generator_device,
        "batch_size": args.batch_size,
        "bank_size": args.bank_size,
        "trajectories": trajectories,
        "nfe": args.nfe,
        "base_scale_bank_size": args.base_scale_bank_size,
        "base_scale_steps": args.base_scale_steps,
        "network_trajectory_calls": calls,
        "seconds": {
            "base_scales": result.base_scale_seconds,
            "per_nfe": {str(s.num_inference_steps): s.seconds for s in result.summaries},
            "calibration": result.total_seconds,
            "wall_with_overlap_basis_and_copy": wall,
            "main_process_cpu": cpu,  # CPU time of this process (on a shared machine, wall time includes waiting)
        },
        "trajectories_per_second": trajectories / sum(s.seconds for s in result.summaries),
        "base_scales": result.statistics.base_scales.tolist(),
        "load_average": list(os.getloadavg()),
        **PAPER,
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


def default_output(args, processes: int) -> Path:
    if args.pipeline != "elf-b-random":
        return Path(f"benchmarks/results/calibration_cost_{Path(args.pipeline).name}.json")
    device = "cpu" if torch.device(args.device or "cpu").type == "cpu" else "cuda"
    shape = "" if (args.layers, args.max_length) == (12, 1024) else f"_{args.layers}l_L{args.max_length}"
    name = f"calibration_cost_elf_b{shape}_{device}_{args.dtype}_bank{args.bank_size}_{processes}proc.json"
    return Path("benchmarks/results") / name


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", help="`elf-b-random`, or a pipeline folder.")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--nfe", type=int, nargs="+", default=None, help="Default: 8 (elf-b-random), else 8 16 32 64.")
    parser.add_argument("--bank-size", type=int, default=None, help="Default: 2048 (elf-b-random), else 16.")
    parser.add_argument("--base-scale-bank-size", type=int, default=32)
    parser.add_argument("--base-scale-steps", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=None, help="Default: 64 (elf-b-random), else 4.")
    parser.add_argument("--device", default=None, help="cpu or cuda (under torchrun: each process its own).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--generator-device", default="cpu", choices=["cpu", "cuda"], help="Where the draws are made.")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--output")
    parser.add_argument("--overwrite", action="store_true", help="Replace an existing results file.")
    args = parser.parse_args()
    random = args.pipeline == "elf-b-random"
    args.nfe = args.nfe or ([8] if random else [8, 16, 32, 64])
    args.bank_size = args.bank_size or (2048 if random else 16)
    args.batch_size = args.batch_size or (64 if random else 4)

    state = calibration_process_state(args.device) if random else None
    output = Path(args.output) if args.output else default_output(args, 1 if state is None else state.num_processes)
    if output.exists() and not args.overwrite:
        raise SystemExit(f"{output} exists; pass --overwrite to replace it, or choose another --output.")
    result = elf_b_random(args, state) if random else pipeline_folder(args)
    if is_main_process(state):
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        print(f"Wrote {output}")
    wait_for_everyone(state)


if __name__ == "__main__":
    main()
