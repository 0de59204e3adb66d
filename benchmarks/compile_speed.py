"""What `pipe.compile_network()` buys: sampling throughput with the compiled network against the eager one.

    nice -n 10 python benchmarks/compile_speed.py hub_artifacts/langflow-small --device cpu --threads 1 \
        --batch-size 4 --nfe 8 --repeats 5 --output benchmarks/results/compile-cpu-langflow-small.json

Two copies of the pipeline run the same seeded call (official scheduler, `output_type="seq"`): one eager, one after
`compile_network(mode=--mode)` (inductor, unless `--backend`). The first call of each is timed apart (the compiled
one compiles there); then `--repeats` rounds run both, the starting side alternating. Reported: the first calls'
seconds, samples per wall-clock and per process-CPU second per side (median, min, max), the speed-ups (per-round
ratios), and how far the compiled samples are from the eager ones (largest |Δ| of the final latents, share of equal
tokens: inductor rounds otherwise). A new `TORCHINDUCTOR_CACHE_DIR` measures a cold compile; inductor's on-disk cache
makes a later process's compile shorter.
`--mode reduce-overhead` on `--device cuda` measures CUDA graphs. Writes a JSON (refused over an existing one unless
`--overwrite`).
"""

import argparse
import datetime
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
from overhead import device_description, git_commit

from untied_sc.pipelines import load_pipeline


def timed_call(pipe, args, device: torch.device):
    """One sampling call, its wall-clock seconds (on a GPU, the queued kernels included) and this process's CPU
    seconds (steadier on a shared machine; inductor's compile workers, other processes, are not counted)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start, cpu_start = time.perf_counter(), time.process_time()
    output = pipe(
        batch_size=args.batch_size,
        num_inference_steps=args.nfe,
        generator=torch.Generator().manual_seed(args.seed),
        output_type="seq",
    )
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return output, {"wall": time.perf_counter() - start, "cpu": time.process_time() - cpu_start}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline", help="a pipeline folder (or Hub repo id)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if args.output is not None and args.output.exists() and not args.overwrite:
        sys.exit(f"{args.output} exists; pass --overwrite to replace it, or choose another --output.")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    pipes = {}
    for side in ("eager", "compiled"):
        pipes[side] = load_pipeline(args.pipeline).to(device)
        pipes[side].set_progress_bar_config(disable=True)
    pipes["compiled"].compile_network(mode=args.mode, backend=args.backend)
    first, outputs = {}, {}
    for side, pipe in pipes.items():
        outputs[side], first[side] = timed_call(pipe, args, device)
    seconds = {clock: {"eager": [], "compiled": []} for clock in ("wall", "cpu")}
    for round_index in range(args.repeats):
        order = ("eager", "compiled") if round_index % 2 == 0 else ("compiled", "eager")
        for side in order:
            for clock, value in timed_call(pipes[side], args, device)[1].items():
                seconds[clock][side].append(value)

    eager, compiled = outputs["eager"], outputs["compiled"]
    result = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, *sys.argv]),
        "commit": git_commit(),
        **device_description(device),
        "pipeline": args.pipeline,
        "batch_size": args.batch_size,
        "nfe": args.nfe,
        "mode": args.mode,
        "backend": args.backend,
        "first_call_seconds": first,
        **{
            f"samples_per_{clock}_second": {
                side: spread([args.batch_size / value for value in values]) for side, values in sides.items()
            }
            for clock, sides in seconds.items()
        },
        **{
            f"speedup_{clock}": spread([e / c for e, c in zip(sides["eager"], sides["compiled"], strict=True)])
            for clock, sides in seconds.items()
        },
        "max_abs_latent_difference": (compiled.latents - eager.latents).abs().max().item(),
        "equal_tokens": (compiled.sequences == eager.sequences).float().mean().item(),
    }
    print(json.dumps(result, indent=2))
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
