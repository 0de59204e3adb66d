"""The prompt bank a conditional model (ELFText2TextPipeline) is calibrated on: the source texts its calibration
trajectories are generated from, with a fingerprint the statistics record.

A file holds one prompt per line (plain text), or, for a `.jsonl` file, one JSON object per line whose `"input"`
(the official datasets' key, `load_jsonl_dataset(..., input_key="input")`) or `"prompt"` is the source text. Every
line must hold a non-empty prompt: an empty one is an error naming the file and the line.
"""

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


JSONL_KEYS = ("input", "prompt")


@dataclass(frozen=True)
class PromptBank:
    """
    The calibration prompts.

    Args:
        texts: the prompts, in order; trajectory j of a bank is generated from `texts[j % len(texts)]`.
        source: where they were read (a file name), for the statistics' record.
    """

    texts: tuple[str, ...]
    source: str = "given in code"

    def __post_init__(self):
        if isinstance(self.texts, str) or not self.texts:
            raise ValueError(
                "The prompt bank is empty: give the source texts to calibrate on (--prompts FILE, one per line or "
                "JSONL with an 'input' field)."
            )
        for i, text in enumerate(self.texts):
            if not isinstance(text, str) or not text.strip():
                raise ValueError(
                    f"Prompt {i} of the bank ({self.source}) is empty ({text!r}): every prompt needs text."
                )

    @property
    def fingerprint(self) -> str:
        """sha256 (16 hex digits) of the prompts, each followed by a newline: the same prompts give the same one."""
        digest = hashlib.sha256()
        for text in self.texts:
            digest.update(text.encode("utf-8") + b"\n")
        return digest.hexdigest()[:16]

    def record(self) -> dict:
        """What the statistics record of the bank: its file, fingerprint and count."""
        return {"file": self.source, "fingerprint": self.fingerprint, "count": len(self.texts)}

    def batch(self, start: int, size: int) -> list[str]:
        """The prompts of trajectories `start` … `start + size − 1` (the bank cycles)."""
        return [self.texts[(start + i) % len(self.texts)] for i in range(size)]


def read_prompt_bank(path: str | os.PathLike) -> PromptBank:
    """The prompts of `path`: one per line, or for `.jsonl` one JSON object per line with an `"input"` or `"prompt"`
    string. Errors name the file, the line and the fix."""
    path = Path(path).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"--prompts {path}: cannot read the prompt file ({error}).") from None
    jsonl, texts = path.suffix == ".jsonl", []
    for number, line in enumerate(lines, start=1):
        where = f"--prompts {path}, line {number}"
        if jsonl:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{where} is not JSON ({error.msg}): one JSON object per line.") from None
            keys = [key for key in JSONL_KEYS if isinstance(entry, dict) and key in entry]
            if len(keys) != 1 or not isinstance(entry[keys[0]], str):
                raise ValueError(
                    f"{where}: expected an object with one string field {' or '.join(map(repr, JSONL_KEYS))} (the "
                    f"source text), got {line[:80]!r}."
                )
            line = entry[keys[0]]
        if not line.strip():
            raise ValueError(f"{where} is an empty prompt: remove the line, or write the source text there.")
        texts.append(line)
    if not texts:
        raise ValueError(f"--prompts {path} holds no prompt: write one source text per line.")
    return PromptBank(tuple(texts), path.name)
