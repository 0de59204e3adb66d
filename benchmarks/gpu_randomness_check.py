"""Device-side randomness on a GPU: what reproduces what, and the official ELF scheduler's share of run time.

    PYTHONPATH=src:. python benchmarks/gpu_randomness_check.py --output benchmarks/results/gpu-randomness-h100.json

(a) A CPU generator on the GPU gives the CPU stream: the noise stream's draws (drawn ahead into pinned memory and
    copied without blocking) equal `torch.randn` on the CPU bit for bit at ELF-B shape, and the generator ends in the
    same state; a tiny ELF pipeline gives the CPU run's tokens and, within float tolerance for the network, its
    latents; on the GPU, draw-ahead on and off give bit-identical latents.
(b) A CUDA generator runs the pipeline, draws grid, z_0 and ε_k in the official CUDA order (one device stream), and
    reproduces itself for a seed.
(c) The official ELF scheduler's share of run time at ELF-B shape (random weights), batch 32, 8 NFE: the time inside
    `set_timesteps`, `scale_model_input` and `step`, with the device synchronised around each call (as in
    benchmarks/overhead.py), for a CPU generator with draw-ahead (the default), without it (inline draws) and
    for a CUDA generator. z_0 is drawn as the pipeline draws it and counts in the run, not in the scheduler.

Runs in well under a minute on an H100. `--device cpu` with a small `--batch-size`/`--max-length`/`--layers` runs
(a) and (c) on the CPU as a smoke test (CUDA parts are skipped); its numbers mean nothing.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "src"), str(ROOT)]

from untied_sc import ELFPipeline, ELFScheduler, ELFTransformerModel  # noqa: E402
from untied_sc.schedulers.noise import NoiseStream, draw_normal  # noqa: E402
from untied_sc.schedulers.scheduling_elf import elf_time_grid  # noqa: E402


TARGET_SHARE = 0.03  # the target: ≤ 3 % of the run inside the scheduler


def clock(device: torch.device) -> float:
    """perf_counter after the device's queued work has finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def tiny_pipeline(device: torch.device, draw_ahead: bool | None) -> ELFPipeline:
    from tests.tiny import tiny_tokenizer

    torch.manual_seed(0)
    model = ELFTransformerModel(
        latent_dim=16,
        max_length=12,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        intermediate_size=42,
        bottleneck_dim=8,
        vocab_size=40,
    ).eval()
    with torch.no_grad():
        model.final_layer.linear.weight.normal_(std=0.3)  # non-trivial predictions (the official init zeroes it)
    pipe = ELFPipeline(model, ELFScheduler(), tiny_tokenizer()).to(device)
    pipe.scheduler.draw_ahead = draw_ahead
    pipe.set_progress_bar_config(disable=True)
    return pipe


def check_cpu_generator(device: torch.device, shape: tuple[int, ...], num_draws: int) -> dict:
    """(a): the CPU stream on `device`, drawn ahead, equals the CPU draws; the pipeline matches its CPU run."""
    generator, reference = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
    stream = NoiseStream(generator, num_draws)
    noise_equal = True
    for _ in range(num_draws):
        drawn = stream.next(shape, device)
        noise_equal &= drawn.device.type == device.type and torch.equal(
            drawn.cpu(), torch.randn(shape, generator=reference)
        )
    state_equal = torch.equal(generator.get_state(), reference.get_state())

    runs, states = {}, {}
    for name, run_device, draw_ahead in (
        ("cpu", torch.device("cpu"), None),
        ("ahead", device, None),
        ("inline", device, False),
    ):
        pipe, generator = tiny_pipeline(run_device, draw_ahead), torch.Generator().manual_seed(12)
        runs[name] = pipe(batch_size=4, num_inference_steps=8, generator=generator, decode_temperature=1.0)
        states[name] = generator.get_state()
    latent_gap = (runs["ahead"].latents.cpu() - runs["cpu"].latents).abs().max().item()
    return {
        "noise_bit_identical_at_shape": list(shape),
        "noise_bit_identical": bool(noise_equal),
        "generator_state_equal_after_stream": bool(state_equal),
        "pipeline_tokens_equal_to_cpu_run": torch.equal(runs["ahead"].sequences.cpu(), runs["cpu"].sequences),
        "pipeline_max_abs_latent_gap_to_cpu_run": latent_gap,
        "pipeline_latents_bit_identical_draw_ahead_vs_inline_on_device": torch.equal(
            runs["ahead"].latents, runs["inline"].latents
        ),
        "generator_state_equal_after_pipeline": bool(
            torch.equal(states["ahead"], states["cpu"]) and torch.equal(states["inline"], states["cpu"])
        ),
    }


def check_cuda_generator(device: torch.device) -> dict:
    """(b): a CUDA generator draws the official CUDA order and reproduces itself."""
    scheduler, generator = ELFScheduler(), torch.Generator(device).manual_seed(13)
    scheduler.set_timesteps(8, device=device, generator=generator)
    shape = (2, 12, 16)
    z0 = draw_normal(shape, generator, device) * scheduler.init_noise_sigma
    model_input = scheduler.scale_model_input(z0, scheduler.timesteps[0])
    replay = torch.Generator(device).manual_seed(13)
    grid = elf_time_grid(8, replay, scheduler.config.p_mean, scheduler.config.p_std).tolist()
    z0_replay = torch.randn(shape, generator=replay, device=device) * scheduler.init_noise_sigma
    eps = torch.randn(shape, generator=replay, device=device)
    order = grid == scheduler.solver.grid and torch.equal(z0, z0_replay)
    order = order and torch.equal(model_input, scheduler.solver.renoise(0, z0, eps))

    pipe = tiny_pipeline(device, None)
    runs = [
        pipe(
            batch_size=4,
            num_inference_steps=8,
            generator=torch.Generator(device).manual_seed(14),
            decode_temperature=1.0,
        )
        for _ in range(2)
    ]
    other = pipe(batch_size=4, num_inference_steps=8, generator=torch.Generator(device).manual_seed(15))
    return {
        "official_cuda_order_grid_z0_noise": bool(order),
        "reproducible_for_a_seed": torch.equal(runs[0].sequences, runs[1].sequences)
        and torch.equal(runs[0].latents, runs[1].latents),
        "another_seed_differs": not torch.equal(other.latents, runs[0].latents),
    }


@torch.no_grad()
def timed_run(model, scheduler, steps: int, batch_size: int, generator: torch.Generator) -> tuple[float, float]:
    """(total seconds, seconds inside the scheduler) of one official ELF run, z_0 and the decode pass included."""
    device = model.device
    start = clock(device)
    tick = clock(device)
    scheduler.set_timesteps(steps, device=device, generator=generator)
    inside = clock(device) - tick
    shape = (batch_size, model.config.max_length, model.config.latent_dim)
    latents = draw_normal(shape, generator, device) * scheduler.init_noise_sigma  # as `prepare_latents`
    for t in scheduler.timesteps:
        tick = clock(device)
        model_input = scheduler.scale_model_input(latents, t)
        inside += clock(device) - tick
        prediction = model(model_input, t, scheduler.self_conditioning, 3.0).sample
        tick = clock(device)
        latents = scheduler.step(prediction, t, latents).prev_sample
        inside += clock(device) - tick
    model(latents, 1.0, None, 3.0, decoder_step_active=True).logits.argmax(-1)
    return clock(device) - start, inside


def elf_b(device: torch.device, layers: int, max_length: int) -> ELFTransformerModel:
    """An ELF-B-sized network with random weights (a non-zero flow head, so that predictions are non-trivial)."""
    torch.manual_seed(0)
    model = ELFTransformerModel.from_preset("elf-b", num_layers=layers, max_length=max_length).eval()
    with torch.no_grad():
        model.final_layer.linear.weight.normal_(std=0.02)
    return model.to(device)


def time_scheduler(model: ELFTransformerModel, args) -> dict:
    """(c): the scheduler's share of run time, per way of drawing."""
    device = model.device
    modes = {"cpu_generator_draw_ahead": ("cpu", None), "cpu_generator_inline": ("cpu", False)}
    if device.type == "cuda":
        modes["cuda_generator"] = ("cuda", None)
    schedulers = {}
    for name, (_, draw_ahead) in modes.items():
        schedulers[name] = ELFScheduler()
        schedulers[name].draw_ahead = draw_ahead
    timed_run(model, schedulers["cpu_generator_draw_ahead"], args.steps, args.batch_size, torch.Generator())  # warm-up
    totals = {name: [] for name in modes}
    insides = {name: [] for name in modes}
    for repeat in range(args.repeats):  # alternate the modes so that drifts hit all alike
        for name, (generator_device, _) in modes.items():
            generator = torch.Generator(generator_device).manual_seed(repeat)
            total, inside = timed_run(model, schedulers[name], args.steps, args.batch_size, generator)
            totals[name].append(total)
            insides[name].append(inside)
        print(
            f"repeat {repeat}: "
            + ", ".join(f"{n} {totals[n][-1]:.3f} s ({insides[n][-1]:.3f} s in scheduler)" for n in modes)
        )
    result = {}
    for name in modes:
        total, inside = statistics.median(totals[name]), statistics.median(insides[name])
        result[name] = {
            "seconds_per_run": totals[name],
            "seconds_in_scheduler_per_run": insides[name],
            "median_seconds": total,
            "median_seconds_in_scheduler": inside,
            "scheduler_share": inside / total,
            "meets_target": inside / total <= TARGET_SHARE,
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="where to write the JSON report")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    device = torch.device(args.device)
    began = time.perf_counter()
    model = elf_b(device, args.layers, args.max_length)
    shape = (args.batch_size, args.max_length, model.config.latent_dim)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "shape": {"batch_size": args.batch_size, "sequence_length": args.max_length, "latent_dim": shape[2]},
        "nfe": args.steps,
        "network": f"ELF-B sized, {args.layers} layers, random weights",
        "target_scheduler_share": TARGET_SHARE,
        "a_cpu_generator_on_device": check_cpu_generator(device, shape, args.steps - 1),
    }
    print(json.dumps(report["a_cpu_generator_on_device"], indent=2))
    if device.type == "cuda":
        report["b_cuda_generator"] = check_cuda_generator(device)
        print(json.dumps(report["b_cuda_generator"], indent=2))
    report["c_official_scheduler_share"] = time_scheduler(model, args)
    report["seconds_for_this_check"] = time.perf_counter() - began
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    for name, numbers in report["c_official_scheduler_share"].items():
        print(
            f"{name}: {100 * numbers['scheduler_share']:.2f} % of {numbers['median_seconds']:.3f} s in the scheduler"
        )
    print(f"done in {report['seconds_for_this_check']:.1f} s; wrote {args.output}")


if __name__ == "__main__":
    main()
