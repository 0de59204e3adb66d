"""Samples the bundled pipelines with fixed seeds and writes (or compares) their token ids and final latents.

A refactor of the schedulers must not change what they sample: run this before it (`--write BEFORE.pt`) and after
(`--compare BEFORE.pt`). It covers the official samplers, the untied ones (the config's coefficients, and the
calibration's coefficients on the untied step and on the chained functions it is tested against, and with the online
δ̄ ablation) and every comparison sampler at its defaults.

    PYTHONPATH=src python benchmarks/bundled_sampling_check.py --write /tmp/before.pt
    PYTHONPATH=src python benchmarks/bundled_sampling_check.py --compare /tmp/before.pt
"""

import argparse
import inspect
import sys
from pathlib import Path

import torch

from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers import UntiedSelfConditioningScheduler
from untied_sc.schedulers.comparison_names import COMPARISON_METHODS, comparison_scheduler_class
from untied_sc_lab.ablations import ablation_scheduler_class


FOLDERS = {"elf": "hub_artifacts/elf-small", "langflow": "hub_artifacts/langflow-small"}


def samplers(pipe, nfe: int):
    """(name, scheduler) of every sampler checked on `pipe`."""
    config = pipe.scheduler.config
    yield "official", pipe.scheduler
    yield "untied-config", UntiedSelfConditioningScheduler.from_config(config)
    calibrated = config["tuning_by_steps"][str(nfe)]["calibrated"]
    yield "untied-calibrated-fused", UntiedSelfConditioningScheduler.from_config(config, **calibrated)
    ablation = ablation_scheduler_class(pipe.family)
    reference = ablation.from_config(config, **calibrated)
    reference.reference_chain = True
    yield "untied-calibrated-reference", reference
    online = ablation.from_config(config, **calibrated, cosine_distance="online")
    yield "untied-calibrated-online", online
    for method in COMPARISON_METHODS:
        cls = comparison_scheduler_class(method, pipe.family)
        accepted = set(inspect.signature(cls.__init__).parameters)
        yield method, cls.from_config({k: v for k, v in config.items() if k in accepted or k.startswith("_")})


def run(root: Path, nfe: int, seed: int, batch_size: int) -> dict[str, torch.Tensor]:
    results = {}
    for family, folder in FOLDERS.items():
        pipe = load_pipeline(root / folder)
        pipe.set_progress_bar_config(disable=True)
        official = pipe.scheduler
        for name, scheduler in samplers(pipe, nfe):
            pipe.scheduler = scheduler
            generator = torch.Generator().manual_seed(seed)
            output = pipe(batch_size=batch_size, num_inference_steps=nfe, generator=generator, output_type="seq")
            results[f"{family}/{name}/tokens"] = output.sequences
            results[f"{family}/{name}/latents"] = output.latents
            pipe.scheduler = official
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--write", type=Path, help="save the samples here")
    group.add_argument("--compare", type=Path, help="compare with samples saved by --write")
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--batch-size", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = run(Path(__file__).resolve().parents[1], args.nfe, args.seed, args.batch_size)
    if args.write:
        if args.write.exists():
            print(f"{args.write} exists; remove it first.")
            return 1
        torch.save(results, args.write)
        print(f"wrote {len(results)} tensors to {args.write}")
        return 0
    before = torch.load(args.compare)
    failures = 0
    for key in sorted(set(before) | set(results)):
        same = key in before and key in results and torch.equal(before[key], results[key])
        failures += not same
        print(f"{'same' if same else 'DIFFERENT'}  {key}")
    print(f"{len(results) - failures} of {len(results)} equal bit for bit")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
