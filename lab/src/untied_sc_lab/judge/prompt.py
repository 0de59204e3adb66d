"""The judge prompt: a template file rendered into chat messages for one presentation.

A template is plain text. A line `=== system ===` starts the system message and a line `=== user ===` the user
message; a file without these lines is one user message. `{answer_a}` and `{answer_b}` are replaced by the two
samples (nothing else is special: other braces are kept as written). The packaged default is `judge_prompt.txt`
beside this module (the paper's four criteria, Arena-Hard-Auto's five verdict tags); copy it, edit it and pass it with
`untied-sc judge run --prompt-file`.
"""

import os
import re
from dataclasses import dataclass
from pathlib import Path


DEFAULT_PROMPT_FILE = Path(__file__).with_name("judge_prompt.txt")
_SECTION = re.compile(r"^=== (system|user) ===[ \t]*$", re.MULTILINE)
_PLACEHOLDER = re.compile(r"\{(answer_a|answer_b)\}")


@dataclass
class PromptTemplate:
    """A judge prompt: an optional system message and a user message holding `{answer_a}` and `{answer_b}`."""

    user: str
    system: str | None = None

    def __post_init__(self):
        text = (self.system or "") + self.user
        missing = [name for name in ("{answer_a}", "{answer_b}") if name not in text]
        if missing:
            raise ValueError(f"The judge prompt template lacks {' and '.join(missing)}; it must show both samples.")

    def messages(self, answer_a: str, answer_b: str) -> list[dict]:
        """The chat messages of one presentation (OpenAI format: `{"role", "content"}`)."""
        values = {"answer_a": answer_a, "answer_b": answer_b}

        def fill(text: str) -> str:  # one pass: a sample that contains "{answer_b}" stays as written
            return _PLACEHOLDER.sub(lambda match: values[match.group(1)], text)

        system = [] if self.system is None else [{"role": "system", "content": fill(self.system)}]
        return [*system, {"role": "user", "content": fill(self.user)}]


def parse_template(text: str) -> PromptTemplate:
    """Splits a template's text into its system and user messages (see the module docstring)."""
    parts = _SECTION.split(text)
    if len(parts) == 1:
        return PromptTemplate(user=text.strip("\n"))
    if parts[0].strip():
        raise ValueError("Text before the first '=== system ===' / '=== user ===' line; move it into a section.")
    sections: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        if name in sections:
            raise ValueError(f"The template has two '=== {name} ===' sections.")
        sections[name] = body.strip("\n")
    if "user" not in sections:
        raise ValueError("The template has no '=== user ===' section.")
    return PromptTemplate(user=sections["user"], system=sections.get("system"))


def load_template(path: str | os.PathLike | None = None) -> PromptTemplate:
    """Reads a template file (default: the packaged `judge_prompt.txt`)."""
    return parse_template(Path(path or DEFAULT_PROMPT_FILE).read_text(encoding="utf-8"))
