"""The five-level pairwise verdict: its accepted spellings, reading it from a judge's reply, and verdict files.

A verdict compares the two answers of one presentation, A (shown first) and B (shown second):

| canonical | meaning               | also accepted                 |
|-----------|-----------------------|-------------------------------|
| `A>>B`    | A significantly better | `A≫B`, `B<<A`, `B≪A`          |
| `A>B`     | A slightly better     | `B<A`                         |
| `A=B`     | tie                   | `B=A`                         |
| `B>A`     | B slightly better     | `A<B`                         |
| `B>>A`    | B significantly better | `B≫A`, `A<<B`, `A≪B`          |

Spellings are case-insensitive, may carry spaces (`A >> B`) and may be wrapped in `[[...]]` or `[...]`.

A judge's reply is parsed as Arena-Hard-Auto describes: the last `[[...]]` tag of the upper-cased reply, else the
last `[...]` tag; a reply without a tag, or whose tag is not one of the spellings above, is *unparseable* (`None`),
never guessed.

A verdicts file (read by [`read_verdicts`]) has one presentation per line, in either form:

- a JSON object with `id` and `verdict` (a spelling above, or `null` for an unparseable reply); without `verdict`, its
  `reply` is parsed with [`parse_verdict`] (this is what `untied-sc judge run` writes, with `reply` and `judge`);
- `ID VERDICT` separated by white space, where VERDICT `?` marks an unparseable reply (hand-written files).

Blank lines and lines starting with `#` are skipped.
"""

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .records import optional, require


VERDICTS = ("A>>B", "A>B", "A=B", "B>A", "B>>A")
# Signed preference for A: +2 A significantly better ... -2 B significantly better.
VERDICT_STRENGTH = {"A>>B": 2, "A>B": 1, "A=B": 0, "B>A": -1, "B>>A": -2}
UNPARSEABLE_MARK = "?"

_ALIASES = {
    "A>>B": "A>>B",
    "B<<A": "A>>B",
    "A>B": "A>B",
    "B<A": "A>B",
    "A=B": "A=B",
    "B=A": "A=B",
    "B>A": "B>A",
    "A<B": "B>A",
    "B>>A": "B>>A",
    "A<<B": "B>>A",
}
_DOUBLE_TAG = re.compile(r"\[\[([AB<>=≫≪ ]+)\]\]")
_SINGLE_TAG = re.compile(r"\[([AB<>=≫≪ ]+)\]")


def normalise_verdict(label: str) -> str | None:
    """The canonical verdict (one of [`VERDICTS`]) that `label` spells, or `None` if it spells none."""
    text = label.strip().upper().replace("≫", ">>").replace("≪", "<<")
    if text.startswith("[[") and text.endswith("]]"):
        text = text[2:-2]
    elif text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return _ALIASES.get("".join(text.split()))


def parse_verdict(reply: str | None) -> str | None:
    """The verdict of a judge's reply: the last `[[...]]` tag of the upper-cased reply, else its last `[...]` tag,
    normalised by [`normalise_verdict`]; `None` (unparseable) when there is no tag or the tag spells no verdict."""
    if not reply:
        return None
    text = reply.upper()
    for pattern in (_DOUBLE_TAG, _SINGLE_TAG):
        tags = pattern.findall(text)
        if tags:
            return normalise_verdict(tags[-1])
    return None


@dataclass(frozen=True)
class VerdictRecord:
    """One presentation's verdict as read from a file: `verdict` is canonical, or `None` when unparseable."""

    id: str
    verdict: str | None
    judge: str | None = None
    source: str = ""

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "VerdictRecord":
        """A JSON line of a verdicts file: its `verdict` (`null`: unparseable), or without one its parsed `reply`."""
        identifier = optional(data, "id")
        if not isinstance(identifier, str):
            raise ValueError(f"{where}: a JSON verdict record needs a string 'id', got keys {sorted(data)}.")
        if "verdict" in data:
            label = require(data, "verdict", "JSON verdict record", where)
            verdict = None if label is None else _checked_label(str(label), where)
        elif "reply" in data:
            verdict = parse_verdict(require(data, "reply", "JSON verdict record", where))
        else:
            raise ValueError(f"{where}: a JSON verdict record needs 'verdict' (or 'reply'), got keys {sorted(data)}.")
        return cls(identifier, verdict, optional(data, "judge"), where)


def _parse_line(line: str, where: str) -> VerdictRecord:
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not a JSON object ({error}).") from error
        return VerdictRecord.from_json(record, where)
    fields = line.split()
    if len(fields) != 2:
        raise ValueError(f"{where}: expected 'ID VERDICT' (or a JSON object), got {line!r}.")
    identifier, label = fields
    verdict = None if label == UNPARSEABLE_MARK else _checked_label(label, where)
    return VerdictRecord(identifier, verdict, None, where)


def _checked_label(label: str, where: str) -> str:
    verdict = normalise_verdict(label)
    if verdict is None:
        raise ValueError(
            f"{where}: {label!r} is not a verdict; write one of {', '.join(VERDICTS)} (or an alias such as A<B, "
            f"A≫B), or {UNPARSEABLE_MARK!r} / null for an unparseable reply."
        )
    return verdict


def read_verdicts(paths: str | os.PathLike | Iterable[str | os.PathLike]) -> dict[str, VerdictRecord]:
    """Reads one or more verdicts files (format in the module docstring) into `{presentation id: VerdictRecord}`.

    A presentation met twice keeps a parsed verdict over an unparseable one; two different parsed verdicts for one
    presentation are an error (merge the files by hand, deciding which judgment counts).
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    records: dict[str, VerdictRecord] = {}
    for path in paths:
        with Path(path).open(encoding="utf-8") as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.strip()
                if not line or line.startswith("#"):
                    continue
                record = _parse_line(line, f"{path}, line {number}")
                seen = records.get(record.id)
                if seen is None or seen.verdict is None:
                    records[record.id] = record
                elif record.verdict is not None and record.verdict != seen.verdict:
                    raise ValueError(
                        f"Presentation {record.id!r} has verdict {seen.verdict} ({seen.source}) and {record.verdict} "
                        f"({record.source}); keep one of them."
                    )
    return records
