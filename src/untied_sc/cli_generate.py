"""`untied-sc generate`: samples of one sampler at one NFE, written as JSONL with the seeds that drew them.

Sample i lies in batch b = i // batch_size, drawn from `torch.Generator().manual_seed(batch_seed(seed, b))`: the
samples of the benchmark's run of the same sampler, NFE, seed and batch size (the benchmark's `--generate-only`
samples file holds them too). Under `accelerate launch` the batches are split across the processes
(`untied_sc.distributed`), each on its own device, with the same samples in the same order as one process; the main
process alone writes the file and shows the progress bar.

The parser imports nothing heavy (`untied-sc --help` stays fast): the handler imports torch and the pipelines.
"""

import argparse
from pathlib import Path

from .defaults import DEFAULT_BATCH_SIZE, DEFAULT_NUM_SAMPLES, DEFAULT_SEEDS
from .input_checks import check_source_exists


SAMPLERS = ("official", "untied")


def add_generate_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the `generate` arguments to `parser` and returns it."""
    parser.add_argument("pipeline", help="Pipeline folder (or Hub repo id); the untied sampler needs it calibrated.")
    parser.add_argument("--nfe", type=int, required=True, help="Number of function evaluations, e.g. 8.")
    parser.add_argument(
        "--num-samples", type=int, default=DEFAULT_NUM_SAMPLES, help="Samples to write (default %(default)s)."
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=DEFAULT_BATCH_SIZE,
        help="Samples per pipeline call, part of the seeding (default %(default)s, the benchmark's).",
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=DEFAULT_SEEDS[0],
        help="Benchmark seed (default %(default)s): batch b is drawn from 1_000_003·seed + b. Seeds that an old "
        "calibration or tuning record names are refused, as in the benchmark.",
    )
    parser.add_argument(
        "--sampler", choices=SAMPLERS, help="Sampler (default: the one the pipeline's scheduler config names)."
    )
    parser.add_argument(
        "--device",
        help="Device of the pipeline (default: the process's own: its GPU under `accelerate launch`, else cuda when "
        "there is one, else cpu). 'cuda' still gives each process its own GPU.",
    )
    parser.add_argument("--out", required=True, help="JSONL file to write (.gz: compressed), one sample per line.")
    parser.add_argument("--overwrite", action="store_true", help="Replace --out if it exists.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    return parser


def register_generate_command(commands) -> argparse.ArgumentParser:
    """Registers `generate` on an `add_subparsers()` object and returns its parser."""
    parser = commands.add_parser(
        "generate",
        help="Write a pipeline's samples at one NFE (JSONL, with their seeds); several GPUs with accelerate launch.",
    )
    add_generate_arguments(parser)
    parser.set_defaults(handler=generate_command)
    return parser


def pipeline_sampler(pipe) -> str:
    """`"untied"` or `"official"`: the sampler of the pipeline's own scheduler."""
    from .schedulers import UntiedSelfConditioningScheduler  # keeps `untied-sc --help` torch-free

    return "untied" if isinstance(pipe.scheduler, UntiedSelfConditioningScheduler) else "official"


def generate_samples(
    pipe,
    nfe: int,
    seed: int,
    num_samples: int,
    batch_size: int,
    sampler: str | None = None,
    state=None,
    progress: bool = False,
    source: str = "PIPELINE_DIR",
) -> tuple[list, float]:
    """Samples of one sampler at one NFE, with their provenance; checked before any sampling as the benchmark checks.

    Args:
        pipe: an [`ELFPipeline`] or [`LangFlowPipeline`], on its device.
        nfe, seed, num_samples, batch_size: as `sampling.generate` (batch b of `seed` is drawn from
            `batch_seed(seed, b)`).
        sampler (`str`, *optional*): `"official"` or `"untied"`, built from the pipeline's scheduler config as the
            benchmark builds it (default: the pipeline's own scheduler's kind).
        state: the [`untied_sc.distributed.process_state`] of several processes; every process returns all samples.
        progress (`bool`): a bar over the batches, on the main process.
        source (`str`): the pipeline's name in the `untied-sc calibrate` command an uncalibrated NFE's error suggests.

    Returns:
        `(samples, seconds)`: [`Sample`]s in order (`extra` holds `index` and `batch_seed`), and the sampling time
        of the slowest process.
    """
    # keeps `untied-sc --help` torch-free (cli.py registers this module's parser)
    from .generation.checks import check_runs, refuse_leaked_seeds
    from .generation.sampler_spec import SamplerSpec
    from .generation.sampling import build_scheduler, generate, run_samples

    if nfe < 1 or num_samples < 1 or batch_size < 1:
        raise ValueError(
            f"--nfe, --num-samples and --batch-size must be positive, got {nfe}, {num_samples}, {batch_size}."
        )
    sampler = sampler or pipeline_sampler(pipe)
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}.")
    refuse_leaked_seeds([seed], pipe, option="--seed")
    spec = SamplerSpec(scheduler=sampler)
    check_runs(pipe, {sampler: spec}, [(sampler, nfe, seed, None)], source)
    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    try:
        pipe.scheduler = build_scheduler(pipe, spec, original_scheduler.config, nfe)
        texts, ids, seconds = generate(pipe, nfe, seed, num_samples, batch_size, state=state, progress=progress)
    finally:
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)
    samples = run_samples(texts, ids, seed, batch_size, sampler, nfe, record_batch_seed=True)
    return samples, seconds


def generate_command(args: argparse.Namespace) -> list | None:
    """Handler of `untied-sc generate`: samples (split across processes under `accelerate launch`), then the main
    process writes `--out`. Returns the samples on the main process, `None` on the others."""
    # Refusals that need no model come first, on every process, before torch loads.
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it, or choose another --out.")
    check_source_exists(args.pipeline, "a pipeline folder", "PIPELINE")

    # keeps `untied-sc --help` and the refusals above torch-free
    from .distributed import is_main_process, process_state, silence_other_processes
    from .output_paths import claimed_outputs

    state = process_state(args.device)
    silence_other_processes(state)
    # The main process, which alone writes, holds --out from here to its last write: a second run is refused now.
    with claimed_outputs([out], args.overwrite, "choose another --out", active=is_main_process(state)):
        return _generate_into(args, out, state)


def _generate_into(args: argparse.Namespace, out: Path, state) -> list | None:
    from .distributed import describe_processes, is_main_process, process_device
    from .generation.samples import write_samples
    from .pipelines import load_pipeline

    pipe = load_pipeline(args.pipeline)
    pipe.to(process_device(state, args.device))
    samples, seconds = generate_samples(
        pipe,
        nfe=args.nfe,
        seed=args.seed,
        num_samples=args.num_samples,
        batch_size=args.batch_size,
        sampler=args.sampler,
        state=state,
        progress=not args.no_progress,
        source=args.pipeline,
    )
    if not is_main_process(state):
        return None
    write_samples(out, samples)
    print(
        f"Wrote {len(samples)} {samples[0].sampler} samples (NFE {args.nfe}, seed {args.seed}) to {out}; sampling took "
        f"{seconds:.1f} s on {pipe.device} ({describe_processes(state)}; the slowest process's time)."
    )
    return samples
