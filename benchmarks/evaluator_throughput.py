"""Evaluator scoring throughput (samples/s) on the same samples, for one source tree against another.

Each configuration runs in a fresh process with its own `PYTHONPATH` (so an older checkout's `untied_sc` can be
measured beside this one), loads the evaluator (not timed), scores one sample as a warm-up, then times
`sample_nlls` on the first `--num-samples` samples of a samples file: wall time and the process's CPU time (on a shared
machine the CPU time is the steadier number; `--threads 1` keeps thread spinning out of it). The per-sample NLL sums of
two float32 configurations are compared (largest relative difference; token counts must agree exactly).

    # before: an older tree, e.g. `mkdir -p /tmp/before && git archive COMMIT src | tar -x -C /tmp/before`
    python benchmarks/evaluator_throughput.py benchmarks/results/langflow-small-baselines.samples.jsonl.gz \\
        --protocol langflow --num-samples 64 --threads 1 --before-src /tmp/before/src --before-bf16-samples 4 \\
        --output benchmarks/results/evaluator-throughput-smollm2.json

A configuration is `NAME=SRC:DTYPE:BATCH` (`--config`, repeatable): SRC `before` or `after` (this tree), DTYPE
`auto`/`float32`/`bfloat16` (`auto` only where the tree knows it), BATCH an integer or `auto` (the tree's default);
without `--config` the script runs today's defaults against the new ones (see `default_configs`).
"""

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def cpu_description() -> dict:
    """The CPU's model name, core count and the flags that decide the dtype, from /proc/cpuinfo."""
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            model = value.strip()
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "bf16")
    return {"model": model, "cores": os.cpu_count(), "flags": [flag for flag in wanted if flag in flags]}


def worker(args: argparse.Namespace) -> None:
    """One configuration in this process: loads, warms up, times and writes JSON to `args.result`."""
    import torch

    from untied_sc.generation import read_samples
    from untied_sc_lab.evaluation.evaluator import describe_evaluator, load_evaluator
    from untied_sc_lab.evaluation.metrics import sample_nlls

    torch.set_num_threads(args.threads)
    dtype = args.dtype if args.dtype == "auto" else getattr(torch, args.dtype)
    model, tokenizer = load_evaluator(args.evaluator, dtype=dtype)
    texts = [sample.text for sample in read_samples(args.samples)[: args.num_samples]]
    batch = {} if args.batch == "auto" else {"batch_size": int(args.batch)}
    sample_nlls(texts[:1], model, tokenizer, protocol=args.protocol, **batch)  # warm-up: first-call allocations
    wall, cpu = time.perf_counter(), time.process_time()
    scores = sample_nlls(texts, model, tokenizer, protocol=args.protocol, **batch)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    result = {
        "evaluator": describe_evaluator(args.evaluator, model.dtype),
        "dtype": str(model.dtype).removeprefix("torch."),
        "batch": args.batch,
        "num_samples": len(texts),
        "num_tokens": [int(n) for n in scores.num_tokens],
        "evaluator_tokens": sum(len(ids) for ids in scores.evaluator_ids),
        "nll_sum": [float(x) for x in scores.nll_sum],
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "samples_per_second_wall": len(texts) / wall,
        "samples_per_second_cpu": len(texts) / cpu,
    }
    Path(args.result).write_text(json.dumps(result))


def start_config(name: str, src: Path, dtype: str, batch: str, num_samples: int, args) -> dict:
    """Starts one configuration in a subprocess with `src` first on the path; [`finish_config`] collects it."""
    folder = tempfile.mkdtemp(prefix="evaluator-throughput-")
    result = Path(folder) / "result.json"
    command = [sys.executable, __file__, str(args.samples), "--worker", "--result", str(result)]
    command += ["--evaluator", args.evaluator, "--protocol", args.protocol, "--threads", str(args.threads)]
    command += ["--num-samples", str(num_samples), "--dtype", dtype, "--batch", batch]
    began = os.getloadavg()[0]
    process = subprocess.Popen(command, env={**os.environ, "PYTHONPATH": str(src)})
    return {"name": name, "src": str(src), "batch": batch, "process": process, "result": result, "load": began}


def finish_config(started: dict) -> dict:
    """Waits for a [`start_config`] subprocess and returns its result dict."""
    if started["process"].wait() != 0:
        raise SystemExit(f"Configuration {started['name']} failed.")
    record = json.loads(started["result"].read_text())
    shutil.rmtree(started["result"].parent)
    record.update(name=started["name"], src=started["src"], load_average=[started["load"], os.getloadavg()[0]])
    print(
        f"{record['name']}: {record['num_samples']} samples in {record['wall_seconds']:.1f} s wall, "
        f"{record['cpu_seconds']:.1f} s CPU ({record['samples_per_second_cpu']:.3f} samples/CPU-s), {record['dtype']}, "
        f"batch {started['batch']}, load {started['load']:.1f}",
        flush=True,
    )
    return record


def default_configs(args) -> list[tuple[str, str, str, str]]:
    """Today's float32 path, the new default, and (with `--before-bf16-samples`) today's bfloat16 path."""
    configs = []
    if args.before_src:
        configs.append(("before-float32", "before", "float32", "8"))
    configs.append(("after-auto", "after", "auto", "auto"))
    if args.before_src and args.before_bf16_samples:
        configs.append(("before-bfloat16", "before", "bfloat16", "8"))
    return configs


def relative_difference(a: list[float], b: list[float]) -> float:
    return max((abs(x - y) / max(abs(x), abs(y), 1e-12) for x, y in zip(a, b, strict=True)), default=0.0)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("samples", type=Path, help="A samples file (JSONL, .gz ok), e.g. a benchmark's.")
    parser.add_argument("--evaluator", default="smollm2-135m", help="Evaluator name or folder.")
    parser.add_argument("--protocol", choices=["elf", "langflow"], default="langflow")
    parser.add_argument("--num-samples", type=int, default=64, help="The first N samples of the file.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per configuration.")
    parser.add_argument("--before-src", type=Path, help="The `src` folder of the tree to compare against.")
    parser.add_argument(
        "--before-bf16-samples",
        type=int,
        default=0,
        help="Also time the older tree in bfloat16 on this many samples (emulated bf16 is ~50x slower).",
    )
    parser.add_argument("--config", action="append", default=[], help="NAME=SRC:DTYPE:BATCH, repeatable.")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="Run the configurations side by side (on a shared machine: compare their CPU times, not wall times).",
    )
    parser.add_argument("--output", type=Path, help="JSON file to write.")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--batch", default="auto", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    if args.output and args.output.exists() and not args.overwrite:
        raise SystemExit(f"{args.output} exists; pass --overwrite to replace it.")
    sources = {"after": ROOT / "src", "before": args.before_src}
    configs = [(c.split("=", 1)[0], *c.split("=", 1)[1].split(":")) for c in args.config]
    configs = configs or default_configs(args)

    import torch
    import transformers

    runs, started = [], []
    for name, src, dtype, batch in configs:
        if sources.get(src) is None:
            raise SystemExit(f"Configuration {name}: source {src!r} needs --before-src.")
        count = args.before_bf16_samples if name == "before-bfloat16" else args.num_samples
        started.append(start_config(name, sources[src], dtype, batch, count, args))
        if not args.parallel:
            runs.append(finish_config(started.pop()))
    runs += [finish_config(one) for one in started]
    float32 = [run for run in runs if run["dtype"] == "float32" and run["num_samples"] == args.num_samples]
    comparisons = []
    for other in float32[1:]:
        first = float32[0]
        comparisons.append(
            {
                "a": first["name"],
                "b": other["name"],
                "max_relative_nll_difference": relative_difference(first["nll_sum"], other["nll_sum"]),
                "token_counts_equal": first["num_tokens"] == other["num_tokens"],
            }
        )
    speedups = {
        f"{b['name']} / {a['name']}": b["samples_per_second_cpu"] / a["samples_per_second_cpu"]
        for a in runs
        for b in runs
        if a["src"] != b["src"] and b["src"] == str(sources["after"])
    }
    report = {
        "what": "evaluator scoring throughput: sample_nlls on the same samples, per configuration",
        "command": shlex.join(["python", "benchmarks/evaluator_throughput.py", *(argv or sys.argv[1:])]),
        "samples_file": str(args.samples),
        "protocol": args.protocol,
        "evaluator": args.evaluator,
        "threads": args.threads,
        "parallel": args.parallel,
        "cpu": cpu_description(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "speedups_samples_per_cpu_second": speedups,
        "nll_comparisons": comparisons,
        "runs": [{k: v for k, v in run.items() if k not in ("nll_sum", "num_tokens")} for run in runs],
    }
    for key, value in speedups.items():
        print(f"speed-up {key}: {value:.2f}x (samples per CPU-second)")
    for comparison in comparisons:
        print(
            f"NLL {comparison['a']} vs {comparison['b']}: max relative difference "
            f"{comparison['max_relative_nll_difference']:.2e}, token counts equal: {comparison['token_counts_equal']}"
        )
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"Wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
