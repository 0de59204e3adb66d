"""The argument parser class of `untied-sc` and its subcommands (also `python -m untied_sc_lab.training.FAMILY`): defaults
shown, preformatted blocks kept, each subcommand's `--help` led by its one-line description."""

import argparse


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default (unless its help already says it, or there is none to show), and keeps the
    preformatted blocks of a description: a paragraph whose lines are indented is printed as written, the others are
    refilled to the terminal's width."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        if action.default in (None, False, argparse.SUPPRESS) or "default" in help_text.lower():
            return help_text
        return super()._get_help_string(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        blocks = []
        for block in text.strip("\n").split("\n\n"):
            lines = block.splitlines()
            if any(line.startswith(" ") for line in lines):
                blocks.append("\n".join(indent + line for line in lines))
            else:
                blocks.append(super()._fill_text(block, width, indent))
        return "\n\n".join(blocks)


class _SubcommandsAction(argparse._SubParsersAction):
    """A subcommand's `--help` starts with the line that describes it in its parent's list."""

    def add_parser(self, name: str, **kwargs):
        if "description" not in kwargs and kwargs.get("help") not in (None, argparse.SUPPRESS):
            kwargs["description"] = kwargs["help"]
        return super().add_parser(name, **kwargs)


class Parser(argparse.ArgumentParser):
    """The parser of `untied-sc` and of every subcommand under it (which `add_subparsers` makes of the same class):
    defaults shown by [`HelpFormatter`], descriptions from the subcommands' one-line help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _SubcommandsAction)
