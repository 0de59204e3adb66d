"""The `untied-sc` command line."""

import argparse
import sys

from .models.convert import UnsafeCheckpointError, convert_official_elf, convert_official_langflow


def _convert(args: argparse.Namespace) -> None:
    if args.family == "elf":
        model = convert_official_elf(
            args.source, args.output, max_length=args.max_length, weights=args.weights, allow_pickle=args.allow_pickle
        )
    else:
        model = convert_official_langflow(args.source, args.output)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"Wrote {type(model).__name__} ({parameters / 1e6:.1f}M parameters) to {args.output}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="untied-sc", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    convert = commands.add_parser(
        "convert", help="Convert an official ELF or LangFlow checkpoint into a diffusers-format model folder."
    )
    convert.add_argument("family", choices=["elf", "langflow"])
    convert.add_argument("source", help="Local file/folder or Hub repo id of the official checkpoint.")
    convert.add_argument("output", help="Folder to write (config.json + diffusion_pytorch_model.safetensors).")
    convert.add_argument(
        "--max-length", type=int, default=1024, help="ELF only: training sequence length (1024 OWT, 1088 XSum)."
    )
    convert.add_argument("--weights", default="ema_params1", help="ELF only: weight set to convert.")
    convert.add_argument(
        "--allow-pickle", action="store_true", help="ELF only: allow full unpickling (trusted files only)."
    )
    convert.set_defaults(handler=_convert)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.handler(args)
    except (UnsafeCheckpointError, ValueError, FileNotFoundError) as error:
        print(f"untied-sc {args.command}: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
