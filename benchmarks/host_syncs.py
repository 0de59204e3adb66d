"""Where a pipeline call waits for the device: each host read of a device value and each copy between host and device,
with the line of our code that makes it, for the official and the untied sampler of both families.

    python benchmarks/host_syncs.py --device cuda --output benchmarks/results/host-syncs-h200.json
    python benchmarks/host_syncs.py --device cpu --output /tmp/host-syncs-cpu.json      # dry run

A `TorchDispatchMode` sees every aten call of one pipeline call, after a warm-up call: host reads
(`_local_scalar_dense`, which `.item()`, `float(t)`, `bool(t)` and `.tolist()` reach, and `nonzero`, `equal`,
`is_nonzero`) and copies whose source and destination lie on different devices (`_to_copy`, `copy_`). On a GPU a read
of a device tensor, and a copy to the host, wait for every kernel queued before them; a blocking copy to the device
waits too (non-blocking from pinned memory does not). On the CPU nothing waits: the dry run lists the host reads alone,
which are the ones that would wait if their tensor lived on the device. Small random networks (the waits depend on the
code path, not on the shape); the pipelines are those of `side_by_side.py`. Each event is counted per variant and per
line of `untied_sc` that led to it; the output names the device, torch and our commit.
"""

import argparse
import collections
import datetime
import json
import platform
import sys
import traceback
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode


sys.path.insert(0, str(Path(__file__).resolve().parent))
from side_by_side import REPO, build_pipelines, fill_zero_initialised, git_state, machine_description  # noqa: E402


READS = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero"}
COPIES = {"_to_copy", "copy_"}


def our_line() -> str:
    """The innermost frame in the package (else in the caller's script) that led to the current aten call."""
    frames = traceback.extract_stack()[:-3]
    ours = [f for f in frames if "/untied_sc/" in f.filename] or [f for f in frames if "torch" not in f.filename]
    frame = ours[-1]
    return f"{frame.filename.split('/untied_sc/')[-1]}:{frame.lineno}: {(frame.line or '').strip()}"


def _devices(func_name: str, args: tuple, kwargs: dict) -> tuple[torch.device, torch.device] | None:
    """(source, destination) of a copy, or None."""
    if func_name == "copy_":
        return args[1].device, args[0].device
    if func_name == "_to_copy" and kwargs.get("device") is not None:
        return args[0].device, torch.device(kwargs["device"])
    return None


class HostSyncs(TorchDispatchMode):
    """Records host reads (`device_only`: of non-CPU tensors only) and cross-device copies, each with `our_line()`."""

    def __init__(self, device_only: bool):
        super().__init__()
        self.device_only = device_only
        self.events: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in READS:
            tensor = args[0]
            if not self.device_only or tensor.device.type != "cpu":
                self.events[("read", name, str(tensor.device), our_line())] += 1
        elif name in COPIES:
            ends = _devices(name, args, kwargs)
            if ends is not None and ends[0] != ends[1]:
                source, destination = ends
                blocking = "non-blocking" if kwargs.get("non_blocking") else "blocking"
                kind = "to host" if destination.type == "cpu" else f"to device, {blocking}"
                self.events[("copy", kind, f"{source}->{destination}", our_line())] += 1
        return func(*args, **kwargs)


# Small networks: the waits depend on the code path, not on the shape.
TINY_ELF = {"latent_dim": 64, "max_length": 32, "hidden_size": 64, "num_layers": 1, "num_attention_heads": 4}
TINY_ELF |= {"intermediate_size": 128, "bottleneck_dim": 32, "vocab_size": 100}
TINY_LANGFLOW = {"vocab_size": 100, "hidden_size": 64, "cond_dim": 16, "num_layers": 1, "num_attention_heads": 4}
TINY_LANGFLOW |= {"max_length": 32}


def tiny_models():
    from untied_sc import ELFTransformerModel, LangFlowTransformerModel

    torch.manual_seed(0)
    models = {"elf": ELFTransformerModel(**TINY_ELF), "langflow": LangFlowTransformerModel(**TINY_LANGFLOW)}
    for seed, model in enumerate(models.values()):  # zero self-conditioning paths would leave the overlap basis empty
        fill_zero_initialised(model, seed)
    return {family: model.eval() for family, model in models.items()}


def record(pipe, device: torch.device, batch: int, nfe: int) -> list[dict]:
    def call(seed: int):
        generator = torch.Generator(device).manual_seed(seed)
        return pipe(batch_size=batch, num_inference_steps=nfe, generator=generator, output_type="seq")

    call(0)  # warm-up: first-call work (allocations, caches) is not what every call pays
    mode = HostSyncs(device_only=device.type != "cpu")
    with mode:
        call(1)
    return [
        {"event": event, "kind": kind, "devices": devices, "where": where, "count": count}
        for (event, kind, devices, where), count in sorted(mode.events.items(), key=lambda item: -item[1])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()
    if args.output.exists() and not args.overwrite:
        raise SystemExit(f"{args.output} exists: pass --overwrite to replace it.")
    device = torch.device(args.device)
    report = {
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_state(REPO)["commit"],
        "machine": machine_description(device),
        "python": platform.python_version(),
        "events_counted": "host reads of device tensors and cross-device copies"
        if device.type != "cpu"
        else "host reads (dry run: every tensor is on the host)",
        "batch_size": args.batch_size,
        "nfe": args.nfe,
        "variants": {},
    }
    for family, model in tiny_models().items():
        pipes, _ = build_pipelines(family, model, args.nfe, device, "bf16" if device.type == "cuda" else "none")
        for name, pipe in pipes.items():
            events = record(pipe, device, args.batch_size, args.nfe)
            report["variants"][f"{family} {name}"] = events
            print(f"== {family} {name}: {sum(e['count'] for e in events)} events")
            for e in events:
                print(f"  {e['count']:3d}  {e['event']} {e['kind']} ({e['devices']})  {e['where']}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=1) + "\n")
    print(f"Wrote {args.output}")


if __name__ == "__main__":
    main()
