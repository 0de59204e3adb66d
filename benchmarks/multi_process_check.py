"""Checks that several processes write exactly the samples of one process, on a real pipeline.

    python benchmarks/multi_process_check.py PIPELINE_DIR [--processes 2] [--nfe 8] [--num-samples 64]
        [--batch-size 8] [--seed 0] [--work-dir DIR]

Runs `untied-sc generate` and `untied-sc benchmark --generate-only --store DIR` (official and untied at one NFE and
seed) once as one plain process and once under `accelerate launch --multi_gpu --num_processes N` (one process per GPU;
needs N GPUs), then compares the written samples (`generate`'s file byte for byte, every run the store holds by its
texts and token ids) and prints each run's sampling time (the slowest process's).
Without N GPUs it launches N CPU processes with torchrun and `--device cpu` instead (what tests/test_distributed.py
does on a tiny pipeline). Exits 1 if any file differs. Writes `multi-process-check.json` in --work-dir.
"""

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch


def launcher(processes: int) -> tuple[list[str], list[str]]:
    """(the launch command, extra CLI options): accelerate over N GPUs when there are N, else torchrun on CPU."""
    cli = ["-m", "untied_sc.cli"]
    if torch.cuda.device_count() >= processes:
        accelerate = [sys.executable, "-m", "accelerate.commands.launch", f"--num_processes={processes}"]
        accelerate += ["--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"]
        return [*accelerate, *(["--multi_gpu"] if processes > 1 else []), *cli], []
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}", *cli], [
        "--device",
        "cpu",
    ]


def stored_samples(store: Path) -> dict[str, tuple]:
    """Every run a run store's sweeps list, by its entry's name (the hash of its key): its texts and token ids, not its
    sampling time (which differs run to run)."""
    from untied_sc_lab.runs.store import RunStore

    store = RunStore(store)
    return {
        store.samples_path(key).name: (stored.texts, stored.ids)
        for _, _, keys in store.sweeps()
        for key, stored in zip(keys, map(store.samples, keys), strict=True)
    }


def run(command: list[str]) -> str:
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"failed ({done.returncode}):\n{done.stderr[-4000:]}")
    print(done.stdout.strip(), flush=True)
    return done.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pipeline")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--num-samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="Where the samples go (default: a temporary folder, removed after).")
    args = parser.parse_args()

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="multi-process-check-"))
    work.mkdir(parents=True, exist_ok=True)
    launch, options = launcher(args.processes)
    plain = [sys.executable, "-m", "untied_sc.cli"]
    sweep = ["--nfe", str(args.nfe), "--num-samples", str(args.num_samples), "--batch-size", str(args.batch_size)]
    generate = ["generate", args.pipeline, *sweep, "--seed", str(args.seed), "--no-progress", "--overwrite", *options]
    benchmark = ["benchmark", args.pipeline, *sweep, "--seeds", str(args.seed), "--generate-only", "--no-progress"]
    benchmark += ["--name", "check", *options]
    outputs = {}
    for label, prefix in (("1 process", plain), (f"{args.processes} processes", launch)):
        tag = label.split()[0]
        shutil.rmtree(work / f"benchmark-{tag}", ignore_errors=True)  # a store left by an earlier check would be read
        outputs[label] = {
            "generate": run([*prefix, *generate, "--out", str(work / f"generate-{tag}.jsonl")])
            .strip()
            .splitlines()[-1],
            "benchmark": run([*prefix, *benchmark, "--store", str(work / f"benchmark-{tag}")]).strip(),
        }
    one, many = (work / "generate-1.jsonl", work / f"generate-{args.processes}.jsonl")
    stores = [stored_samples(work / f"benchmark-{tag}") for tag in ("1", str(args.processes))]
    identical = {
        "generate": one.read_bytes() == many.read_bytes(),
        "benchmark": bool(stores[0]) and stores[0] == stores[1],
    }
    report = {
        "pipeline": args.pipeline,
        "processes": args.processes,
        "launcher": "accelerate launch" if "accelerate.commands.launch" in launch else "torchrun (CPU)",
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] or ["cpu"],
        "torch": torch.__version__,
        "python": platform.python_version(),
        "settings": {k: getattr(args, k) for k in ("nfe", "num_samples", "batch_size", "seed")},
        "identical": identical,
        "outputs": outputs,
    }
    (work / "multi-process-check.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    if not args.work_dir:
        shutil.rmtree(work)
    return 0 if all(identical.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
