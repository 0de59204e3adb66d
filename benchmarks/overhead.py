"""What the untied sampler costs next to the official one: network time, scheduler share, retained throughput.

    python benchmarks/overhead.py --device cpu --batch-sizes 4 32 --output benchmarks/results/overhead-cpu.json
    python benchmarks/overhead.py --device cuda --batch-sizes 4 32 --output benchmarks/results/overhead-gpu.json

Two workloads, each at every batch size:

- `elf-b`: an ELF-B-shaped network (105M parameters, 12 layers, L = 1024, D = 512; random weights, random
  calibration statistics with the model's real overlap basis), 8 NFE, the paper's `elf-b` coefficients
  (η_R, η_T, η_O all > 0: every part of the untied step runs). `--elf-layers-by-batch 32:2` runs fewer layers at a
  batch size; the row then says so (the scheduler's work depends on B·L·D only, the network's on the layers).
- `langflow-small`: the bundled `hub_artifacts/langflow-small` (8.8M parameters, L = 128, D = 256) with its own
  untied config (`coefficients_by_steps`: at 8 NFE the SC transform only, at 16 and 32 the correction only, at 64
  both), at each of `--langflow-nfe`.

Per workload and batch size, in one run: every variant once as warm-up, then `--repeats` rounds (more for runs under
`--min-seconds`, see below) of, in rotating order,

- `network`: the network calls alone (N forward passes and ELF's decode pass, or LangFlow's clean prediction and
  argmax), on a fixed latent, with the self-conditioning input fed back as the pipeline does;
- `official`, `untied` (and `untied_reference`, `untied_compiled_step` when asked for): a whole sampling run as the
  pipeline's loop makes it (`set_timesteps`, initial latent, then `scale_model_input`, network, `step` per NFE, then
  the decode), timed end to end;
- the scheduler alone: the same calls to `set_timesteps`, `scale_model_input` and `step` with fixed random
  predictions in place of the network.

Reported (medians): network seconds; official scheduler share = scheduler alone / (network + scheduler alone);
untied retention end to end = official / untied; untied retention at the same network time =
(network + official scheduler) / (network + untied scheduler). End-to-end times on a shared CPU drift by several
percent between runs, more than the scheduler costs; the same-network-time figure does not. On a GPU the clock reads
wait for the queued kernels (`synchronize`) at the start and end of each timed run only, so the scheduler's kernels
overlap the network's as in the pipeline; the scheduler-alone loop measures its launch and kernel time together.

Writes a JSON (refuses to overwrite one unless `--overwrite`) and prints a markdown table.
"""

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from untied_sc import (
    ELFScheduler,
    ELFTransformerModel,
    LangFlowScheduler,
    LangFlowTransformerModel,
    UntiedSelfConditioningScheduler,
)
from untied_sc.calibration import overlap_basis_from_model
from untied_sc.schedulers.sampler_statistics import SamplerStatistics, StepStatistics
from untied_sc_lab.ablations import ablation_scheduler_class


REPO = Path(__file__).resolve().parents[1]
LANGFLOW_SMALL = REPO / "hub_artifacts" / "langflow-small"
ELF_SC_CFG_SCALE = 3.0


def build_elf(layers: int, max_length: int = 1024) -> tuple[ELFTransformerModel, SamplerStatistics]:
    """ELF-B-shaped network (random weights, non-zero flow head) and random statistics with its real basis."""
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
    return model, SamplerStatistics.build(model, "elf", q, rho_sq, (0.8, 0.9), steps)


class Workload:
    """One model at one batch size and NFE: the network call, the decode, and the schedulers' arguments."""

    def __init__(
        self, name, model, official, untied, statistics, nfe, batch_size, device, notes="", generator_device="cpu"
    ):
        self.name, self.model, self.official, self.untied = name, model, official, untied
        # "cpu": the official CPU stream (drawn ahead on a GPU); "cuda": grid, z_0 and every draw on the GPU
        self.generator_device = torch.device(generator_device)
        self.statistics, self.nfe, self.batch_size, self.device, self.notes = (
            statistics,
            nfe,
            batch_size,
            device,
            notes,
        )
        self.family = official.family
        if self.family == "elf":
            self.latent_shape = (batch_size, model.config.max_length, model.config.latent_dim)
        else:
            self.latent_shape = (batch_size, model.config.max_length, model.config.hidden_size)

    def set_timesteps_kwargs(self, generator: torch.Generator) -> dict:
        if self.family == "elf":
            return {"generator": generator}
        return {"proposal": self.model.gumbel_parameters()}

    def network(self, model_input, t, self_conditioning):
        """(clean prediction, logits or None), as the pipeline's `_predict`."""
        if self.family == "elf":
            return self.model(model_input, t, self_conditioning, ELF_SC_CFG_SCALE).sample.float(), None
        logits = self.model(model_input, t, self_conditioning).logits
        return self.model.clean_prediction(logits), logits

    def decode(self, latents, logits):
        if self.family == "elf":
            return self.model(latents, 1.0, None, ELF_SC_CFG_SCALE, decoder_step_active=True).logits.argmax(-1)
        return logits.argmax(-1)

    def generator(self, seed: int) -> torch.Generator:
        return torch.Generator(self.generator_device).manual_seed(seed)

    def initial_latents(self, scheduler, generator):
        z = torch.randn(self.latent_shape, generator=generator, device=generator.device)
        return (z * scheduler.init_noise_sigma).to(self.device)


def clock(device: torch.device) -> float:
    """perf_counter after the device's queued work has finished (GPU kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


@torch.no_grad()
def time_sampling(w: Workload, scheduler, statistics, seed: int) -> float:
    """One whole sampling run as the pipeline's loop makes it, decode included: seconds."""
    start = clock(w.device)
    generator = w.generator(seed)
    extra = {"statistics": statistics} if statistics is not None else {}
    scheduler.set_timesteps(w.nfe, device=w.device, **w.set_timesteps_kwargs(generator), **extra)
    latents = w.initial_latents(scheduler, generator)
    logits = None
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        prediction, logits = w.network(model_input, t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
    w.decode(latents, logits)
    return clock(w.device) - start


@torch.no_grad()
def time_network(w: Workload, timesteps: torch.Tensor, seed: int) -> float:
    """The network calls of one run alone (same inputs' shapes, self-conditioning fed back), decode included."""
    start = clock(w.device)
    latents = w.initial_latents(w.official, w.generator(seed))
    self_conditioning = logits = None
    for t in timesteps:
        self_conditioning, logits = w.network(latents, t, self_conditioning)
    w.decode(latents, logits)
    return clock(w.device) - start


@torch.no_grad()
def time_scheduler(w: Workload, scheduler, statistics, predictions: list[torch.Tensor], seed: int) -> float:
    """The scheduler's calls of one run alone (`set_timesteps`, `scale_model_input`, `step`), fixed predictions."""
    generator = w.generator(seed)
    latents = w.initial_latents(scheduler, w.generator(seed + 1))
    extra = {"statistics": statistics} if statistics is not None else {}
    start = clock(w.device)
    scheduler.set_timesteps(w.nfe, device=w.device, **w.set_timesteps_kwargs(generator), **extra)
    for i, t in enumerate(scheduler.timesteps):
        scheduler.scale_model_input(latents, t)
        latents = scheduler.step(predictions[i % len(predictions)], t, latents).prev_sample
    return clock(w.device) - start


def measure(w: Workload, variants: dict, args) -> dict:
    """Warm-up, then alternating timed rounds of every variant; the scheduler alone per scheduler variant."""
    device = w.device
    probe = w.generator(0)
    w.official.set_timesteps(w.nfe, device=device, **w.set_timesteps_kwargs(probe))
    timesteps = w.official.timesteps.clone()
    predictions = [
        torch.randn(w.latent_shape, generator=torch.Generator().manual_seed(i)).to(device) for i in (1, 2, 3)
    ]
    runs = {"network": lambda seed: time_network(w, timesteps, seed)}
    alone = {}
    for name, (scheduler, stats) in variants.items():
        runs[name] = lambda seed, s=scheduler, st=stats: time_sampling(w, s, st, seed)
        alone[name] = lambda seed, s=scheduler, st=stats: time_scheduler(w, s, st, predictions, seed)

    warmup = {}
    for name, run in runs.items():  # warm-up (and any compilation)
        warmup[name] = [run(1000 + i) for i in range(args.warmup)]
    for run in alone.values():
        run(1000)
    slowest = max(max(v) if v else 0.0 for v in warmup.values()) or 1.0
    repeats = max(args.repeats, min(args.max_repeats, math.ceil(args.min_seconds / slowest)))
    seconds = {name: [] for name in runs}
    names = list(runs)
    for r in range(repeats):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:  # rotating order: drifts in machine load hit every variant
            seconds[name].append(runs[name](r))
    scheduler_seconds = {name: [] for name in alone}
    scheduler_rounds = 0
    spent_start = time.perf_counter()
    while scheduler_rounds < max(repeats, 3) or (
        time.perf_counter() - spent_start < args.min_seconds and scheduler_rounds < 50
    ):
        for name, run in alone.items():
            scheduler_seconds[name].append(run(scheduler_rounds))
        scheduler_rounds += 1

    profiles = {}
    if args.profile and w.name in args.profile_models:
        for name, run in alone.items():
            profiles[name] = profile_run(lambda run=run: run(0), device)
    median = {name: statistics.median(v) for name, v in seconds.items()}
    median_scheduler = {name: statistics.median(v) for name, v in scheduler_seconds.items()}
    network = median["network"]
    official_scheduler = median_scheduler["official"]
    result = {
        "model": w.name,
        "notes": w.notes,
        "batch_size": w.batch_size,
        "nfe": w.nfe,
        "latent_shape": list(w.latent_shape[1:]),
        "parameters_millions": round(sum(p.numel() for p in w.model.parameters()) / 1e6, 1),
        "untied_coefficients": w.untied.resolve_coefficients(w.nfe),
        "repeats": repeats,
        "warmup_seconds": warmup,
        "seconds_per_run": seconds,
        "scheduler_alone_seconds_per_run": scheduler_seconds,
        "median_seconds": median,
        "median_scheduler_alone_seconds": median_scheduler,
        "network_seconds": network,
        "official_scheduler_share": official_scheduler / (network + official_scheduler),
        "official_scheduler_share_end_to_end": (median["official"] - network) / median["official"],
    }
    if profiles:
        result["scheduler_alone_profile"] = profiles
    for name in variants:
        if name == "official":
            continue
        result[f"{name}_retention_end_to_end"] = median["official"] / median[name]
        result[f"{name}_retention_same_network_time"] = (network + official_scheduler) / (
            network + median_scheduler[name]
        )
    return result


def profile_run(run, device: torch.device, top: int = 15) -> dict:
    """One scheduler-alone run under torch.profiler: its most expensive ops by device (GPU) or CPU self time."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
    events = prof.key_averages()
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    rows = sorted(events, key=lambda e: getattr(e, key, 0.0), reverse=True)[:top]
    return {
        "sorted_by": key,
        "total_self_cpu_ms": sum(e.self_cpu_time_total for e in events) / 1e3,
        "total_self_device_ms": sum(getattr(e, "self_device_time_total", 0.0) for e in events) / 1e3,
        "ops": [
            {
                "name": e.key,
                "count": e.count,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
                "self_device_ms": getattr(e, "self_device_time_total", 0.0) / 1e3,
            }
            for e in rows
        ],
    }


def schedulers_for(w_official, untied_config: dict, statistics, args) -> dict:
    """The variants: official, untied (the untied step), and the chained functions and compiled step when asked for."""
    official = w_official
    variants = {"official": (official, None)}
    untied = UntiedSelfConditioningScheduler.from_config(official.config, **untied_config)
    variants["untied"] = (untied, statistics)
    if args.with_reference_step:
        reference = ablation_scheduler_class(untied.family).from_config(official.config, **untied_config)
        reference.reference_chain = True
        variants["untied_reference"] = (reference, statistics)
    if args.with_compiled_step:
        compiled = UntiedSelfConditioningScheduler.from_config(official.config, **untied_config).compile_step()
        variants["untied_compiled_step"] = (compiled, statistics)
    return variants


def layers_at(batch_size: int, args) -> int:
    for item in args.elf_layers_by_batch:
        batch, layers = (int(x) for x in item.split(":"))
        if batch == batch_size:
            return layers
    return args.elf_layers


def device_description(device: torch.device) -> dict:
    info = {
        "device_type": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "machine": platform.machine(),
    }
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    else:
        info["device"] = "cpu"
    try:
        model_names = [
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")
        ]
        info["cpu"] = model_names[0].split(":", 1)[1].strip() if model_names else platform.processor()
        info["cpu_cores_visible"] = os.cpu_count()
    except OSError:
        info["cpu"] = platform.processor()
    return info


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "src"], cwd=REPO, capture_output=True, text=True)
        return (
            out.stdout.strip() + (" (src modified)" if dirty.stdout.strip() else "") if out.returncode == 0 else None
        )
    except (OSError, subprocess.SubprocessError):
        return None


def table(results: list[dict], device: str) -> str:
    lines = [
        f"Device: {device}. Retention = official throughput kept by the untied sampler; medians.",
        "",
        "| model | batch | NFE | network s | official s | untied s | official scheduler share | untied retention, "
        "end to end | untied retention, same network time |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        model = r["model"] + (f" ({r['notes']})" if r["notes"] else "")
        m = r["median_seconds"]
        lines.append(
            f"| {model} | {r['batch_size']} | {r['nfe']} | {r['network_seconds']:.3f} | {m['official']:.3f} | "
            f"{m['untied']:.3f} | {100 * r['official_scheduler_share']:.2f} % | "
            f"{100 * r['untied_retention_end_to_end']:.1f} % | {100 * r['untied_retention_same_network_time']:.2f} % |"
        )
    extra = [
        k
        for k in ("untied_reference", "untied_compiled_step")
        if any(f"{k}_retention_end_to_end" in r for r in results)
    ]
    for name in extra:
        lines += [
            "",
            f"{name}: retention end to end / same network time per row: "
            + ", ".join(
                f"{r['model']} b{r['batch_size']} n{r['nfe']}: {100 * r[f'{name}_retention_end_to_end']:.1f} % / "
                f"{100 * r[f'{name}_retention_same_network_time']:.2f} %"
                for r in results
                if f"{name}_retention_end_to_end" in r
            ),
        ]
    return "\n".join(lines)


def report(results: list[dict], args, device: torch.device, started: float, load_start) -> dict:
    return {
        "benchmark": "untied vs official sampler: network time, official scheduler share, untied retention",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        **device_description(device),
        "load_average_start_end": [load_start, os.getloadavg() if hasattr(os, "getloadavg") else None],
        "generator_device": args.generator_device,
        "total_seconds": time.perf_counter() - started,
        "complete": len(results) == expected_rows(args),
        "definitions": {
            "network_seconds": "the network calls of one run alone (N forward passes + ELF decode / LangFlow argmax)",
            "official_scheduler_share": "scheduler alone / (network + scheduler alone), official scheduler",
            "retention_end_to_end": "official seconds per run / untied seconds per run (medians, whole runs)",
            "retention_same_network_time": "(network + official scheduler alone) / (network + untied scheduler alone)",
        },
        "results": results,
    }


def expected_rows(args) -> int:
    rows = len(args.batch_sizes) if "elf-b" in args.models else 0
    if "langflow-small" in args.models:
        rows += len(args.langflow_batch_sizes or args.batch_sizes) * len(args.langflow_nfe)
    return rows


def write(output: Path, content: dict) -> None:
    """Written after every row, so that an interrupted run keeps what it measured (`complete` says which)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(content, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (networks run in float32).")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 32])
    parser.add_argument(
        "--models", nargs="+", default=["elf-b", "langflow-small"], choices=["elf-b", "langflow-small"]
    )
    parser.add_argument("--elf-nfe", type=int, default=8)
    parser.add_argument("--elf-layers", type=int, default=12)
    parser.add_argument(
        "--elf-layers-by-batch",
        nargs="*",
        default=[],
        metavar="BATCH:LAYERS",
        help="fewer ELF layers at a batch size (labelled in the results), e.g. 32:2",
    )
    parser.add_argument("--langflow-nfe", type=int, nargs="+", default=[8, 32])
    parser.add_argument(
        "--langflow-batch-sizes",
        type=int,
        nargs="+",
        default=None,
        help="LangFlow-small's batch sizes (default: --batch-sizes)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds at least")
    parser.add_argument("--max-repeats", type=int, default=15)
    parser.add_argument("--min-seconds", type=float, default=1.0, help="repeat short runs up to this many seconds")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--with-reference-step", action="store_true", help="also time the unfused reference step")
    parser.add_argument("--with-compiled-step", action="store_true", help="also time the torch.compile'd fused step")
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="record the top ops of one scheduler-alone run per variant (default: on for cuda, ELF-B rows only)",
    )
    parser.add_argument("--profile-models", nargs="+", default=["elf-b"], choices=["elf-b", "langflow-small"])
    parser.add_argument(
        "--generator-device",
        default="cpu",
        choices=["cpu", "cuda"],
        help="where the runs' generators draw: cpu (the official CPU stream, drawn ahead on a GPU) or cuda (a device "
        "stream: grid, z_0 and every re-noising draw on the GPU)",
    )
    parser.add_argument("--output", default="benchmarks/results/overhead.json")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()

    output = Path(args.output)
    if output.exists() and not args.overwrite:
        sys.exit(f"{output} exists; pass --overwrite to replace it, or another --output.")
    device = torch.device(args.device)
    if args.profile is None:
        args.profile = device.type == "cuda"
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no GPU.")
    if args.generator_device == "cuda" and device.type != "cuda":
        sys.exit("--generator-device cuda needs --device cuda.")
    started = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None
    results = []

    if "elf-b" in args.models:
        built = {}
        for batch_size in args.batch_sizes:
            layers = layers_at(batch_size, args)
            if layers not in built:
                model, stats = build_elf(layers)
                built[layers] = (model.to(device), stats.to(device))
            model, stats = built[layers]
            official = ELFScheduler()
            variants = schedulers_for(official, {"coefficients": "elf-b"}, stats, args)
            notes = "" if layers == 12 else f"{layers} of ELF-B's 12 layers"
            w = Workload(
                "elf-b",
                model,
                official,
                variants["untied"][0],
                stats,
                args.elf_nfe,
                batch_size,
                device,
                notes,
                args.generator_device,
            )
            results.append(measure(w, variants, args))
            write(output, report(results, args, device, started, load_start))
            print(f"[{time.perf_counter() - started:.0f} s] elf-b batch {batch_size}", flush=True)

    if "langflow-small" in args.models:
        # The folder's components, loaded one by one: what the pipeline holds, without the pipeline machinery.
        model = LangFlowTransformerModel.from_pretrained(LANGFLOW_SMALL / "transformer").to(device).eval()
        stats = SamplerStatistics.from_pretrained(LANGFLOW_SMALL / "sampler_statistics").to(device)
        config = LangFlowScheduler.load_config(LANGFLOW_SMALL / "scheduler")
        for batch_size in args.langflow_batch_sizes or args.batch_sizes:
            for nfe in args.langflow_nfe:
                official = LangFlowScheduler.from_config(config)
                variants = schedulers_for(official, {}, stats, args)
                w = Workload("langflow-small", model, official, variants["untied"][0], stats, nfe, batch_size, device)
                results.append(measure(w, variants, args))
                write(output, report(results, args, device, started, load_start))
                print(
                    f"[{time.perf_counter() - started:.0f} s] langflow-small batch {batch_size} nfe {nfe}", flush=True
                )

    final = report(results, args, device, started, load_start)
    write(output, final)
    info = final
    print(table(results, f"{info['device']} ({info['threads']} threads, torch {info['torch']})"))
    print(f"\nWrote {output} in {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
