"""The `untied-sc` command line: convert official checkpoints, calibrate pipelines, generate samples, estimate ACE's
direction and publish sampler statistics. The lab (`pip install "untied-sc[lab]"`) adds its commands (`tune`,
`evaluate`, `benchmark`, `judge`, `diagnose`, `data`, `train`) through the `untied_sc.commands` entry point.

`generate` and the sampling of `benchmark` split their batches across processes started by `accelerate launch -m
untied_sc.cli ...` (or `torchrun`), one per GPU, with the samples of one process (see `untied_sc.distributed`)."""

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version

from .cli_generate import register_generate_command
from .cli_parser import Parser
from .defaults import (
    BASE_SCALE_BANK_SIZE,
    BASE_SCALE_STEPS,
    DTYPE_NAMES,
)
from .families import family_names, get_family
from .input_checks import (
    check_local_pipeline_folder,
    check_source_exists,
    check_writes_stay_inside,
    pipeline_writes,
    refuse_replacing_calibration,
)


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads: registering
# the parsers imports only argparse-level modules.


def refuse_existing_folder(folder: str, overwrite: bool, remedy: str = "pass --overwrite to replace it") -> None:
    """A folder a command would write must not hold anything yet, unless the user said to replace it."""
    from pathlib import Path

    path = Path(folder)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise ValueError(f"{path} already exists and is not empty; {remedy}, or name a new folder.")


# The `convert` options beyond SOURCE, OUTPUT, --tokenizer, --revision and --overwrite, by argument name: the flag,
# and what it is left at when not given. A family takes those its record lists (`Family.convert_options`).
CONVERT_OPTIONS = {
    "official_id": ("--official-id", None),
    "max_length": ("--max-length", None),
    "sde_gamma": ("--sde-gamma", None),
    "sc_cfg_scale": ("--sc-cfg-scale", None),
    "text_encoder": ("--text-encoder", None),
    "guidance_scale": ("--guidance-scale", None),
    "max_source_length": ("--max-source-length", None),
    "weights": ("--weights", None),
    "allow_pickle": ("--allow-pickle", False),
    "variant": ("--variant", None),
    "self_conditioning": ("--self-conditioning", None),
}


def convert_kwargs(args: argparse.Namespace) -> dict:
    """The family's converter options of `untied-sc convert` (its record's `convert_options`); an option given to
    a family that does not take it or a required one missing is one error naming the flags and the family; the values are checked by the family's converter."""
    family = get_family(args.family)
    given = {name for name, (_, unset) in CONVERT_OPTIONS.items() if getattr(args, name) != unset}
    foreign = [CONVERT_OPTIONS[name][0] for name in CONVERT_OPTIONS if name in given - set(family.convert_options)]
    if foreign:
        takes = ", ".join(CONVERT_OPTIONS[name][0] for name in family.convert_options) or "none of them"
        raise ValueError(
            f"{', '.join(foreign)}: not options of a {family.display_name} checkpoint (`convert {family.name}` "
            f"takes {takes}); leave them out."
        )
    missing = [CONVERT_OPTIONS[name][0] for name in family.convert_required if name not in given]
    if missing:
        raise ValueError(f"`untied-sc convert {family.name}` needs {', '.join(missing)}.")
    kwargs = {name: getattr(args, name) for name in family.convert_options}
    for name, value in family.convert_defaults:
        kwargs[name] = value if kwargs.get(name) is None else kwargs[name]
    return kwargs


def _convert(args: argparse.Namespace) -> None:
    refuse_existing_folder(args.output, args.overwrite)
    kwargs = convert_kwargs(args)
    check_source_exists(args.source, f"an official {args.family} checkpoint", "SOURCE")

    from .pipelines.conversion import convert_official

    kwargs["tokenizer"] = args.tokenizer
    if args.revision is not None:
        kwargs["revision"] = args.revision
    pipe = convert_official(args.family, args.source, args.output, overwrite=args.overwrite, **kwargs)
    parameters = sum(p.numel() for p in pipe.transformer.parameters())
    conversion = getattr(pipe, "conversion", None)  # the ELF and LangFlow pipelines' record of the settings read
    if conversion is None:
        print(
            f"Wrote {type(pipe).__name__} ({type(pipe.transformer).__name__}, {parameters / 1e6:.1f}M parameters; "
            f"{type(pipe.scheduler).__name__}; tokenizer {getattr(pipe.tokenizer, 'name_or_path', None)}) to "
            f"{args.output}"
        )
        return
    encoder = getattr(conversion, "text_encoder", None)  # a conditional checkpoint's T5 encoder
    components = f"tokenizer {conversion.tokenizer.value}" + (f", text encoder {encoder.value}" if encoder else "")
    print(
        f"Wrote {type(pipe).__name__} ({type(pipe.transformer).__name__}, {parameters / 1e6:.1f}M parameters; "
        f"{components}; {type(pipe.scheduler).__name__} at the settings of {conversion.settings.settings_from}) to "
        f"{args.output}"
    )


def save_calibration(pipe, source: str, output: str | None, command: str) -> str:
    """
    In place (no `--output`): only the `sampler_statistics` component and the scheduler config (which holds the
    coefficients) are written; with `--output`: the whole pipeline.
    """
    from pathlib import Path

    from .pipelines.loading import save_sampler_statistics

    if output is not None:
        pipe.save_pretrained(output)
        return output
    check_writes_stay_inside(
        source, pipeline_writes(source), f"`untied-sc {command}`"
    )  # again: the folder may have changed meanwhile
    save_sampler_statistics(pipe, source)
    pipe.scheduler.save_config(Path(source) / "scheduler")
    return source


def check_statistics_target(source: str, output: str | None, command: str) -> None:
    """Before any work: the pipeline exists (a local folder, or a Hub repo id with `--output`), and writing in place
    needs a local pipeline folder."""
    if output is None:
        check_local_pipeline_folder(source, command)
        check_writes_stay_inside(source, pipeline_writes(source), f"`untied-sc {command}`")
        return
    check_source_exists(source, "a pipeline folder", "PIPELINE")
    refuse_existing_folder(output, False, "leave out --output to update the pipeline folder in place")


def statistics_push_folder(args: argparse.Namespace) -> str | None:
    """Where `--push-statistics-to` keeps the statistics folder it uploads (`--statistics-dir`, default: beside the
    pipeline folder written), refused before any work when it holds something already and `--overwrite` is not
    given."""
    if args.push_statistics_to is None:
        if args.statistics_dir is not None:
            raise ValueError(
                "--statistics-dir is where --push-statistics-to keeps its folder: give --push-statistics-to."
            )
        return None
    from pathlib import Path

    from .hub import check_endpoint

    check_endpoint()  # an HF_ENDPOINT without a scheme fails every request: said before the work
    if args.statistics_dir is None:
        target = Path(args.output or args.pipeline).expanduser().resolve()
        args.statistics_dir = str(target.with_name(f"{target.name}-statistics"))
    refuse_existing_folder(args.statistics_dir, args.overwrite, "pass --overwrite to replace it (or --statistics-dir)")
    return args.statistics_dir


def push_statistics(pipe, repo_id: str, folder: str) -> None:
    """Saves the statistics folder (kept) and uploads it; a failure is a `HubPushError` naming the folder."""
    from .hub import upload_folder_to_hub
    from .pipelines.statistics_repo import base_checkpoint

    pipe.save_sampler_statistics(folder, repo_id=repo_id, overwrite=True)  # refused before the work if not empty
    message = f"Sampler statistics for {base_checkpoint(pipe).describe()}"
    commit = upload_folder_to_hub(folder, repo_id, commit_message=message)
    print(f"Pushed the sampler statistics and coefficients to {repo_id} (commit {commit[:12]}; kept in {folder})")


def _calibrate(args: argparse.Namespace) -> None:
    explicit = {name: getattr(args, name) for name in ("eta_r", "eta_t", "eta_o", "alpha")}
    given = [name for name, value in explicit.items() if value is not None]
    if given and len(given) < len(explicit):
        flags = " ".join(f"--{name.replace('_', '-')}" for name in explicit)
        raise ValueError(f"Give all four of {flags} together (got only {', '.join(given)}), or none.")
    if given and args.coefficients is not None:
        raise ValueError("Give either --coefficients PRESET or --eta-r/--eta-t/--eta-o/--alpha, not both.")
    coefficients = {n: dict(explicit) for n in args.nfe} if given else args.coefficients
    check_statistics_target(args.pipeline, args.output, "calibrate")
    statistics_dir = statistics_push_folder(args)
    if args.output is None:  # in place: what the folder holds is kept unless --overwrite says to replace it
        refuse_replacing_calibration(args.pipeline, args.nfe, args.overwrite, bool(given or args.coefficients))
    from .calibration.calibrate import small_bank_warning

    warning = small_bank_warning(args.bank_size)
    if warning:
        print(warning, file=sys.stderr)

    from .calibration import format_summary
    from .calibration.reduction import calibration_process_state, is_main_process, wait_for_everyone
    from .hardware import torch_dtype

    # Launched with torchrun / accelerate launch: one process per device, the banks' batches split between them.
    state = calibration_process_state(args.device)
    main_process = is_main_process(state)
    device = state.device if state is not None else args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not main_process or args.no_progress:  # the main process alone shows progress bars, loading's too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    prompts = _prompt_bank(args.pipeline, args.prompts)
    pipe = _load_for_calibration(args.pipeline, args.overwrite)
    result = pipe.calibrate(
        prompts=prompts,
        nfe=args.nfe,
        bank_size=args.bank_size,
        seed=args.seed,
        batch_size=args.batch_size,
        coefficients=coefficients,
        base_scale_steps=args.base_scale_steps,
        base_scale_bank_size=args.base_scale_bank_size,
        progress=not args.no_progress,
        device=device,
        dtype=torch_dtype(args.dtype) if args.dtype else None,
        process_state=state,
        generator_device=args.generator_device,
        overwrite=args.overwrite,
    )
    if main_process:  # every process holds the same statistics; one writes them
        folder = save_calibration(pipe, args.pipeline, args.output, "calibrate")
        print(format_summary(result))
        print(f"Wrote sampler statistics (calibrated NFEs {result.statistics.config.calibrated_steps}) to {folder}")
        if args.push_to_hub:
            from .hub import push_folder

            push_folder(pipe, args.push_to_hub, folder)
            print(f"Pushed to {args.push_to_hub}")
        if args.push_statistics_to:
            push_statistics(pipe, args.push_statistics_to, statistics_dir)
    wait_for_everyone(state)  # the other processes return once the files are written


def _prompt_bank(source: str, prompts: str | None):
    """`--prompts FILE` read (errors name the file and line), and, for a local folder, checked against the pipeline
    class its model_index.json names before anything loads: a conditional one needs prompts, another takes none."""
    from pathlib import Path

    from .pipelines.saving import saved_pipeline_class

    held = saved_pipeline_class(Path(source)) if Path(source).is_dir() else None
    if held == "ELFText2TextPipeline" and prompts is None:
        raise ValueError(
            f"{source} holds an ELFText2TextPipeline, which generates from a source text: its calibration needs "
            "prompts. Pass --prompts FILE, source texts like the ones it will translate or summarise, one per line "
            "(or JSONL with an 'input' field)."
        )
    if held not in (None, "ELFText2TextPipeline", "an unreadable model_index.json") and prompts is not None:
        raise ValueError(f"--prompts: {source} holds an unconditional {held}, which takes no prompts; leave it out.")
    if prompts is None:
        return None
    from .calibration.prompts import read_prompt_bank

    return read_prompt_bank(prompts)


def _load_for_calibration(source: str, overwrite: bool):
    """
    The pipeline to calibrate. With `--overwrite`, sampler statistics that cannot be loaded (a corrupt file, NaN
    values) are left out, so that calibrating replaces them, as their error says; the NFEs they held are named.
    """
    from .pipelines import load_pipeline

    try:
        return load_pipeline(source, conditional=True)
    except ValueError as error:
        if not overwrite or "sampler statistics" not in str(error):
            raise
        print(
            f"warning: the sampler statistics cannot be loaded ({str(error).splitlines()[0]}); with --overwrite they "
            "are calibrated afresh: only the NFEs given now will be calibrated.",
            file=sys.stderr,
        )
        return load_pipeline(source, conditional=True, sampler_statistics=None)


def _ace(args: argparse.Namespace) -> None:
    folder = check_local_pipeline_folder(args.pipeline, "ace", has_output=False)
    check_writes_stay_inside(folder, pipeline_writes(folder, ("ace_statistics",)), "`untied-sc ace`")
    target = folder / "ace_statistics"
    if target.exists() and not args.overwrite:
        raise ValueError(f"{target} already exists; pass --overwrite to estimate it again and replace it.")

    from .calibration.ace import estimate_ace_direction, save_ace_statistics
    from .pipelines import load_pipeline
    from .pipelines.remote_code import write_remote_code

    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    pipe = load_pipeline(folder).to(args.device)
    given = {
        "num_trajectories": args.num_trajectories,
        "num_inference_steps": args.nfe,
        "batch_size": args.batch_size,
        "seed": args.seed,
    }
    statistics = estimate_ace_direction(
        pipe, progress=not args.no_progress, **{key: value for key, value in given.items() if value is not None}
    )
    check_writes_stay_inside(folder, pipeline_writes(folder, ("ace_statistics",)), "`untied-sc ace`")
    written = save_ace_statistics(statistics.to("cpu"), folder)
    write_remote_code(folder)  # the component's module file, for loading by repo id with diffusers' generic class
    config = statistics.config
    print(
        f"Wrote ACE's repetition direction ({config.num_trajectories} trajectories of {config.num_inference_steps} "
        f"NFE, seed {config.seed}; Rep-4 of the contrasted thirds {config.top_repetition:.3f} vs "
        f"{config.bottom_repetition:.3f}) to {written}"
    )


def _push_statistics_command(args: argparse.Namespace) -> None:
    check_source_exists(args.pipeline, "a calibrated pipeline folder", "PIPELINE")
    args.push_statistics_to, args.output = args.repo, None
    statistics_dir = statistics_push_folder(args)

    from .pipelines import load_pipeline

    pipe = load_pipeline(args.pipeline, conditional=True, **({"revision": args.revision} if args.revision else {}))
    if pipe.sampler_statistics is None:
        raise ValueError(
            f"{args.pipeline} has no sampler statistics to push: calibrate it first (`untied-sc calibrate "
            f"{args.pipeline} --nfe 8`)."
        )
    push_statistics(pipe, args.repo, statistics_dir)


# The lab's commands, named so that calling one without the lab says how to install it rather than "invalid choice".
LAB_COMMANDS = ("tune", "evaluate", "benchmark", "judge", "diagnose", "data", "train")
COMMANDS_ENTRY_POINT = "untied_sc.commands"


def _register_plugin_commands(commands: argparse._SubParsersAction) -> None:
    """The subcommands other installed packages declare under the `untied_sc.commands` entry point (the lab's)."""
    from importlib.metadata import entry_points

    for entry_point in entry_points(group=COMMANDS_ENTRY_POINT):
        entry_point.load()(commands)


def _refuse_missing_lab(argv: list[str] | None, parser: argparse.ArgumentParser) -> None:
    name = next((arg for arg in (sys.argv[1:] if argv is None else argv) if not arg.startswith("-")), None)
    known = parser._subparsers._group_actions[0].choices if parser._subparsers else {}
    if name in LAB_COMMANDS and name not in known:
        parser.exit(
            2,
            f"untied-sc: `{name}` is one of the lab's commands, which is not installed: pip install "
            f'"untied-sc[lab]" (from a source tree: pip install -e lab).\n',
        )


def package_version() -> str:
    """The installed `untied-sc` distribution's version."""
    try:
        return version("untied-sc")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from . import __version__

        return f"{__version__} (not installed)"


def add_statistics_push_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--push-statistics-to",
        metavar="REPO",
        help="Upload only the sampler statistics and coefficients (a few MB, no weights) to this Hub repo, with a "
        "record of the base weights and a model card; load them with `from_pretrained(BASE, "
        "sampler_statistics=REPO)`.",
    )
    parser.add_argument(
        "--statistics-dir",
        metavar="DIR",
        help="Where --push-statistics-to writes (and keeps) the folder it uploads (default: PIPELINE-statistics "
        "beside the pipeline folder written).",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="untied-sc", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    commands = parser.add_subparsers(
        dest="command", required=True, metavar="COMMAND", help="One of these; COMMAND --help for its options."
    )

    convert = commands.add_parser(
        "convert",
        help="Convert an official ELF, LangFlow or self-conditioned flow-map (FMLM*, ELF*) checkpoint into a complete "
        "pipeline folder (network, tokenizer, official sampler settings; ELF and LangFlow: a model card).",
    )
    convert.add_argument("family", choices=family_names(), help="Model family of the checkpoint.")
    convert.add_argument("source", help="Local file/folder or Hub repo id of the official checkpoint.")
    convert.add_argument(
        "output",
        help="Pipeline folder to write (transformer/, tokenizer/, scheduler/, model_index.json, README.md); "
        "written whole or not at all.",
    )
    convert.add_argument(
        "--tokenizer",
        metavar="NAME_OR_PATH",
        help="Tokenizer (Hub id or folder). Default: the released checkpoint's, as the official code loads it "
        "(t5-small for ELF, gpt2 for LangFlow OWT, bert-base-uncased for LangFlow LM1B), or the one an ELF config.yml "
        "names; required for another LangFlow checkpoint.",
    )
    convert.add_argument(
        "--official-id",
        metavar="REPO_ID",
        help="The released checkpoint (Hub id) that a local SOURCE is a copy of: its official settings apply. "
        "Hub ids and Hugging Face cache paths are recognised without it.",
    )
    convert.add_argument("--revision", help="Hub SOURCE only: branch, tag or commit hash (default: main).")
    convert.add_argument(
        "--max-length",
        type=int,
        help="ELF and flow maps: the model's sequence length, as trained. Default: the one recorded by the trainer's "
        "config.yml beside the checkpoint (or, for a released checkpoint, its official config); required otherwise "
        "(ELF: 1024 OpenWebText, 1088 XSum, 128 WMT14 De-En; flow maps: 1024).",
    )
    convert.add_argument(
        "--sde-gamma",
        type=float,
        metavar="G",
        help="ELF only: the SDE churn γ at every NFE, over the recorded ones; required when neither the table of "
        "released checkpoints nor a config.yml beside the checkpoint records them.",
    )
    convert.add_argument(
        "--sc-cfg-scale",
        type=float,
        metavar="W",
        help="ELF only: the SC-CFG scale w at every NFE, over the recorded ones; required as --sde-gamma is.",
    )
    convert.add_argument(
        "--text-encoder",
        metavar="NAME_OR_PATH",
        help="Conditional ELF only (XSum, WMT14 De-En): the frozen T5 encoder (Hub id or folder). Default: the "
        "checkpoint's, as the official code loads it (t5-small, through the Hugging Face cache).",
    )
    convert.add_argument(
        "--guidance-scale",
        type=float,
        metavar="G",
        help="Conditional ELF only: the default classifier-free guidance scale, over the recorded one (official 2).",
    )
    convert.add_argument(
        "--max-source-length",
        type=int,
        metavar="N",
        help="Conditional ELF only: the source positions, where nothing records them (the training config's "
        "max_input_length: 1024 XSum, 64 WMT14 De-En).",
    )
    convert.add_argument(
        "--weights",
        help="ELF and flow maps: the weight set to convert (ELF: default ema_params1; flow maps: ema, the official "
        "eval's, or raw).",
    )
    convert.add_argument(
        "--allow-pickle",
        action="store_true",
        help="ELF and flow maps: allow full unpickling (trusted files only; Lightning checkpoints pickle their "
        "hyper-parameters).",
    )
    convert.add_argument(
        "--variant",
        choices=sorted({v for name in family_names() for v in get_family(name).variants}),
        help="Flow maps only (required): the model the checkpoint holds (FMLM* and ELF* weights have the same shapes): "
        "fmlm-star (fmlm_star.ckpt, sampled by ctm), elf-star (elf_star.ckpt, by cdeq) or elf (elf.ckpt, the "
        "self-conditioned teacher, by ELF's SDE).",
    )
    convert.add_argument(
        "--self-conditioning",
        choices=("free", "chained"),
        help="Flow maps, fmlm-star only: its sampling regime (elfmap_student_sc_free; the released FMLM*: free). "
        "Default: the trainer's config.yml beside the checkpoint, or the released repo's; required otherwise.",
    )
    convert.add_argument("--overwrite", action="store_true", help="Replace OUTPUT if it exists and is not empty.")
    convert.set_defaults(handler=_convert)

    from .defaults import CALIBRATION_SEED

    calibrate = commands.add_parser(
        "calibrate", help="Compute a pipeline's sampler statistics (overlap basis, base scales, per-NFE statistics)."
    )
    calibrate.add_argument("pipeline", help="Pipeline folder (or Hub repo id) to calibrate.")
    calibrate.add_argument("--nfe", type=int, nargs="+", required=True, help="NFEs to calibrate, e.g. 8 16 32 64.")
    calibrate.add_argument(
        "--bank-size",
        type=int,
        default=64,
        help="Trajectories in each of the two banks B_μ, B_σ (per-NFE statistics).",
    )
    calibrate.add_argument(
        "--base-scale-bank-size",
        type=int,
        default=BASE_SCALE_BANK_SIZE,
        help="ELF only: trajectories of the base-scale (response-Gram) measurement, a bank of its own that "
        "--bank-size does not change. Measured only when no other calibrated NFE is kept (those were measured with "
        "the folder's base scales, which are then kept).",
    )
    calibrate.add_argument(
        "--base-scale-steps",
        type=int,
        default=BASE_SCALE_STEPS,
        help="ELF only: NFE of the base-scale trajectories.",
    )
    calibrate.add_argument(
        "--seed",
        type=int,
        default=CALIBRATION_SEED,
        help="Seed of the banks, in the calibration seed space: no benchmark seed draws the same batches.",
    )
    calibrate.add_argument(
        "--batch-size", type=int, default=16, help="Trajectories per pipeline call (the pipeline batch)."
    )
    calibrate.add_argument(
        "--coefficients",
        help="Paper coefficient preset to calibrate at (its α) and to write into the scheduler config for NFEs that "
        "have none (default: the scheduler config's, else the family's preset). At an NFE the preset does not list, "
        "its entry at the nearest listed NFE in log2 (ties to the smaller).",
    )
    for flag, meaning in (
        ("--eta-r", "η_R (SC-transform strength)"),
        ("--eta-t", "η_T (correction strength)"),
        ("--eta-o", "η_O (disagreement weight)"),
        ("--alpha", "α (EMA weight, also the calibration's)"),
    ):
        calibrate.add_argument(
            flag,
            type=float,
            help=f"Explicit {meaning} for every NFE given; all four together, instead of --coefficients.",
        )
    calibrate.add_argument(
        "--device",
        help="Where the network runs: cpu, cuda, cuda:N (default: cuda where available, else cpu). Under torchrun "
        "or accelerate launch every process takes its own device (cuda:LOCAL_RANK; with cpu, all on the CPU).",
    )
    calibrate.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="The network's dtype for the runs, e.g. bfloat16 on a GPU (default: as stored); the statistics "
        "accumulate in float64 and the pipeline's weights are written as they were.",
    )
    calibrate.add_argument(
        "--generator-device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="Where the batches' random draws are made: cpu (the CPU stream: the same statistics on every device) "
        "or cuda (no CPU draws to wait for: faster at large banks, statistics of the same distribution but not the "
        "same numbers).",
    )
    calibrate.add_argument(
        "--prompts",
        metavar="FILE",
        help="A conditional pipeline (ELFText2TextPipeline) only, and required there: the source texts its "
        "calibration trajectories are generated from, one per line (or a .jsonl file, one object per line with an "
        "'input' or 'prompt' field); cycled through each bank. The statistics record the file's name, fingerprint and "
        "count.",
    )
    calibrate.add_argument("--no-progress", action="store_true", help="No progress bars.")
    calibrate.add_argument(
        "--overwrite",
        action="store_true",
        help="In place: replace the statistics of NFEs the folder has calibrated already (and, with coefficients "
        "given, their coefficients). Without it those are refused before any work; new NFEs are added either way.",
    )
    calibrate.add_argument("--output", help="Folder to write the pipeline to (default: in place).")
    calibrate.add_argument("--push-to-hub", metavar="REPO", help="Upload the calibrated pipeline to this Hub repo.")
    add_statistics_push_arguments(calibrate)
    calibrate.set_defaults(handler=_calibrate)

    ace = commands.add_parser(
        "ace",
        help="Estimate ACE's repetition direction for a pipeline: the ace_statistics component its ACE samplers need.",
    )
    ace.add_argument("pipeline", help="Local pipeline folder; the component is written into it.")
    ace.add_argument(
        "--num-trajectories", type=int, help="Official trajectories contrasted (default: ACE's recipe, 400)."
    )
    ace.add_argument("--nfe", type=int, help="NFE of each trajectory (default: ACE's recipe, 64).")
    ace.add_argument("--batch-size", type=int, help="Trajectories per pipeline call (default 16).")
    ace.add_argument(
        "--seed",
        type=int,
        help="Seed of the batches in ACE's seed space, which no benchmark batch reaches (default: ACE_SEED, 3000).",
    )
    ace.add_argument("--device", default="cpu", help="Where the pipeline runs: cpu, cuda, cuda:N.")
    ace.add_argument("--overwrite", action="store_true", help="Replace an existing ace_statistics component.")
    ace.add_argument("--no-progress", action="store_true", help="No progress bars.")
    ace.set_defaults(handler=_ace)

    push = commands.add_parser(
        "push-statistics",
        help="Upload only a calibrated pipeline's sampler statistics and coefficients (no weights) to a Hub repo.",
    )
    push.add_argument("pipeline", help="Calibrated pipeline folder (or Hub repo id).")
    push.add_argument("repo", help="The statistics repo to upload to (created where missing).")
    push.add_argument("--revision", help="Hub PIPELINE only: branch, tag or commit hash (default: main).")
    push.add_argument(
        "--statistics-dir",
        metavar="DIR",
        help="Where the folder uploaded is written and kept (default: PIPELINE-statistics beside the folder).",
    )
    push.add_argument("--overwrite", action="store_true", help="Replace a non-empty --statistics-dir.")
    push.set_defaults(handler=_push_statistics_command)

    register_generate_command(commands)
    _register_plugin_commands(commands)
    return parser


def _reported_errors() -> tuple[type[Exception], ...]:
    """Errors `main` reports in one line (exit status 2) rather than with a traceback."""
    errors = (ValueError, FileNotFoundError, FileExistsError, ImportError)
    convert = sys.modules.get("untied_sc.models.convert")  # only a handler that imported it can raise its error
    hub = sys.modules.get("untied_sc.hub")
    return (
        errors
        + ((convert.UnsafeCheckpointError,) if convert is not None else ())
        + ((hub.HubPushError,) if hub is not None else ())
    )


def _check_devices(args: argparse.Namespace) -> None:
    """A CUDA device option on a machine without one: refused before anything loads."""
    for option in ("device", "generator_device"):
        value = getattr(args, option, None)
        if isinstance(value, str) and value.startswith("cuda"):
            from .hardware import check_device

            check_device(value, f"--{option.replace('_', '-')} {value}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    _refuse_missing_lab(argv, parser)
    args = parser.parse_args(argv)
    try:
        _check_devices(args)
        args.handler(args)
    except Exception as error:
        if not isinstance(error, _reported_errors()):
            raise
        print(f"untied-sc {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
