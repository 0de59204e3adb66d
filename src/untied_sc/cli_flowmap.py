"""`untied-sc convert-flowmap`: an official FMLM*/ELF* Lightning checkpoint to a pipeline folder.

Imports nothing heavy until the command runs (the `untied-sc` command line starts without torch).
"""

import argparse


VARIANTS = ("fmlm-star", "elf-star", "elf")


def _convert_flowmap(args: argparse.Namespace) -> None:
    from .pipelines.pipeline_flowmap import convert_flowmap_pipeline

    kwargs = {
        "max_length": args.max_length,
        "self_conditioning": args.self_conditioning,
        "weights": args.weights,
        "allow_pickle": args.allow_pickle,
    }
    if args.revision is not None:
        kwargs["revision"] = args.revision
    tokenizer = None
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    pipe = convert_flowmap_pipeline(
        args.source, args.output, args.variant, overwrite=args.overwrite, tokenizer=tokenizer, **kwargs
    )
    parameters = sum(p.numel() for p in pipe.transformer.parameters())
    print(
        f"Wrote FlowMapPipeline ({args.variant}, {parameters / 1e6:.1f}M parameters, {type(pipe.scheduler).__name__}) "
        f"to {args.output}"
    )


def add_flowmap_commands(commands) -> None:
    """Adds `convert-flowmap` to the `untied-sc` subcommands."""
    convert = commands.add_parser(
        "convert-flowmap",
        help="Convert an official self-conditioned flow-map checkpoint (FMLM*, ELF* or their ELF teacher; Lightning .ckpt, EMA "
        "weights) into a FlowMapPipeline folder.",
    )
    convert.add_argument(
        "source", help="A .ckpt file, a folder holding it, or the Hub repo wonjKim/self-conditioned-fmlm."
    )
    convert.add_argument("output", help="Pipeline folder to write; written whole or not at all.")
    convert.add_argument(
        "--variant",
        required=True,
        choices=VARIANTS,
        help="Which model the checkpoint holds (the weights of FMLM* and ELF* have the same shapes): fmlm-star "
        "(fmlm_star.ckpt, sampled by ctm), elf-star (elf_star.ckpt, sampled by cdeq) or elf (elf.ckpt, the "
        "self-conditioned teacher, sampled by ELF's SDE).",
    )
    convert.add_argument(
        "--max-length",
        type=int,
        help="Sequence length. Default: the trainer's config.yml beside the checkpoint, or 1024 for the released repo; "
        "required otherwise.",
    )
    convert.add_argument(
        "--self-conditioning",
        choices=("free", "chained"),
        help="fmlm-star only: its sampling regime (elfmap_student_sc_free; the released FMLM*: free). Default: as "
        "--max-length.",
    )
    convert.add_argument(
        "--weights", choices=("ema", "raw"), default="ema", help="The EMA (official eval) or raw weights."
    )
    convert.add_argument(
        "--allow-pickle",
        action="store_true",
        help="Allow full unpickling (Lightning checkpoints pickle their hyper-parameters; trusted files only).",
    )
    convert.add_argument("--tokenizer", metavar="NAME_OR_PATH", help="Tokenizer to save with it (e.g. gpt2).")
    convert.add_argument("--revision", help="Hub SOURCE only: branch, tag or commit hash.")
    convert.add_argument("--overwrite", action="store_true", help="Replace OUTPUT if it exists and is not empty.")
    convert.set_defaults(handler=_convert_flowmap)
