"""Throughput of untied vs official sampling on an ELF-B-sized network (random weights), in one run.

    python benchmarks/overhead.py [--steps 8] [--batch-size 4] [--repeats 3] [--layers 12] [--device cpu]

Both samplers run the same network, grid and latents; runs alternate (official, untied, ...) so that drifts in
machine load hit both alike. Retained throughput = official time / untied time (the paper reports 91-98%).
End-to-end times on a shared CPU drift by several percent between runs, more than the sampler's own cost, so the
time spent inside the scheduler (`set_timesteps`, `scale_model_input`, `step`) is also timed on its own, and the
retained throughput is reported both ways: end to end, and as (network + official scheduler) / (network + untied
scheduler) with the same network time. On a GPU every clock read waits for the queued kernels (`synchronize`), so
that the scheduler's kernels are charged to the scheduler.
Writes benchmarks/results/overhead.json (`--output` for another device).
"""

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from untied_sc import ELFScheduler, ELFTransformerModel, UntiedSelfConditioningScheduler
from untied_sc.calibration import overlap_basis_from_model
from untied_sc.schedulers.sampler_statistics import SamplerStatistics, StepStatistics


def build(layers: int, max_length: int) -> tuple[ELFTransformerModel, SamplerStatistics, int]:
    torch.manual_seed(0)
    model = ELFTransformerModel.from_preset("elf-b", num_layers=layers, max_length=max_length).eval()
    with torch.no_grad():  # the official init zeroes the flow head; give it weights so predictions are non-trivial
        model.final_layer.linear.weight.normal_(std=0.02)
    q, rho_sq = overlap_basis_from_model(model).storage_tensors()
    generator = torch.Generator().manual_seed(0)
    steps = {}
    for n in (8, 16, 32, 64):
        steps[n] = StepStatistics(
            mean=0.01 * torch.randn(n, q.shape[0], generator=generator),
            rms=0.1 + torch.rand(n, generator=generator),
            cosine_distance=torch.rand(n, generator=generator),
        )
    stats = SamplerStatistics.build(model, "elf", q, rho_sq, (0.8, 0.9), steps)
    return model, stats, sum(p.numel() for p in model.parameters())


def clock(device: torch.device) -> float:
    """perf_counter after the device's queued work has finished (GPU kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def sample(model, scheduler, stats, steps: int, batch_size: int, seed: int) -> tuple[float, float]:
    """(total seconds, seconds inside the scheduler) of one sampling run, decode pass included."""
    device = model.device
    generator = torch.Generator().manual_seed(seed)
    start = clock(device)
    in_scheduler = 0.0
    tick = clock(device)
    extra = {"statistics": stats} if stats is not None else {}
    scheduler.set_timesteps(steps, device=device, generator=generator, **extra)
    in_scheduler += clock(device) - tick
    shape = (batch_size, model.config.max_length, model.config.latent_dim)
    latents = (torch.randn(shape, generator=generator) * scheduler.init_noise_sigma).to(device)
    for t in scheduler.timesteps:
        tick = clock(device)
        model_input = scheduler.scale_model_input(latents, t)
        in_scheduler += clock(device) - tick
        prediction = model(model_input, t, scheduler.self_conditioning, 3.0).sample
        tick = clock(device)
        latents = scheduler.step(prediction, t, latents).prev_sample
        in_scheduler += clock(device) - tick
    model(latents, 1.0, None, 3.0, decoder_step_active=True).logits.argmax(-1)
    return clock(device) - start, in_scheduler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu", help="e.g. cuda; the network runs in float32 on it.")
    parser.add_argument("--output", default="benchmarks/results/overhead.json")
    args = parser.parse_args()

    device = torch.device(args.device)
    model, stats, parameters = build(args.layers, args.max_length)
    model.to(device)
    official = ELFScheduler()
    untied = UntiedSelfConditioningScheduler.from_config(official.config, coefficients="elf-b")
    sample(model, official, None, args.steps, args.batch_size, seed=0)  # warm-up
    times = {"official": [], "untied": []}
    scheduler_times = {"official": [], "untied": []}
    for repeat in range(args.repeats):
        for name, scheduler, stats_or_none in (("official", official, None), ("untied", untied, stats)):
            total, inside = sample(model, scheduler, stats_or_none, args.steps, args.batch_size, seed=repeat)
            times[name].append(total)
            scheduler_times[name].append(inside)
        print(
            f"repeat {repeat}: official {times['official'][-1]:.2f} s ({scheduler_times['official'][-1]:.3f} s in "
            f"scheduler), untied {times['untied'][-1]:.2f} s ({scheduler_times['untied'][-1]:.3f} s in scheduler)"
        )
    median = {name: statistics.median(values) for name, values in times.items()}
    median_scheduler = {name: statistics.median(values) for name, values in scheduler_times.items()}
    retained = median["official"] / median["untied"]
    network = median["official"] - median_scheduler["official"]
    retained_same_network = (network + median_scheduler["official"]) / (network + median_scheduler["untied"])
    result = {
        "network": f"ELF-B sized ({parameters / 1e6:.1f}M parameters, {args.layers} layers), random weights",
        "batch_size": args.batch_size,
        "sequence_length": args.max_length,
        "nfe": args.steps,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "seconds_per_run": times,
        "median_seconds": median,
        "samples_per_second": {name: args.batch_size / value for name, value in median.items()},
        "seconds_in_scheduler_per_run": scheduler_times,
        "median_seconds_in_scheduler": median_scheduler,
        "retained_throughput_end_to_end": retained,
        "retained_throughput_same_network_time": retained_same_network,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(
        f"Retained throughput: end to end {100 * retained:.2f}%, same network time {100 * retained_same_network:.3f}%"
    )


if __name__ == "__main__":
    main()
