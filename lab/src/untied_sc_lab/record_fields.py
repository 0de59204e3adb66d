"""Reading a record's fields from a JSON file: a field the record needs and the file lacks is a [`RecordError`] (a
`ValueError`) naming the field, the record and where it was read (the file, and within it the part), the lab's one
reader for every record's `from_json`."""

from collections.abc import Mapping
from typing import Any


class RecordError(ValueError):
    """A record read from a file that is not a JSON object or lacks a field."""


def require(data: Any, name: str, record: str, where: str) -> Any:
    """`data[name]`, or a [`RecordError`] naming the missing field, the record and where it was read."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{where}: a {record} must be a JSON object, got {type(data).__name__}.")
    if name not in data:
        raise RecordError(f"{where}: the {record} lacks the field {name!r} (it has {sorted(data)}).")
    return data[name]


def optional(data: Mapping, name: str, default: Any = None) -> Any:
    """`data[name]`, or `default` where the field is absent (an optional field of a record)."""
    return data[name] if name in data else default
