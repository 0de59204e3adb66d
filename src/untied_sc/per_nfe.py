"""Per-NFE tables (one setting per number of inference steps): keyed by `int` in memory, by string in files.

A scheduler config, a statistics config, a sampler spec and a report are JSON, whose object keys are strings:
`{"8": ..., "16": ...}`. They stay so wherever diffusers mirrors the file (`register_to_config`): its
`to_json_string` sorts keys as strings, so int keys would change the saved bytes. Everything else holds the table
as `dict[int, Entry]`, read from the file's shape once with [`read_steps_table`] and written back with
[`write_steps_table`]; no other code turns an NFE into a key or a key into an NFE.
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar


Entry = TypeVar("Entry")


def steps_key(num_inference_steps: int) -> str:
    """The JSON key of an NFE: `8` → `"8"`."""
    return str(num_inference_steps)


def check_steps(value: Any, name: str = "num_inference_steps", minimum: int = 2) -> int:
    """`value` as a number of steps: an `int` ≥ `minimum` (2 for a sampler's run, 1 for a grid), else an error
    naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        wanted = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
        raise ValueError(f"{name} must be {wanted}, got {value!r}.")
    return value


def read_steps(key: Any, field: str) -> int:
    """
    The NFE a table key names: a positive integer, given as an `int` or as its digits (`"8"`; `"08"` reads as 8).
    Anything else is refused with an error naming `field`, the table it came from.
    """
    if (
        isinstance(key, bool)
        or not isinstance(key, int | str)
        or (isinstance(key, str) and not (key.isascii() and key.isdigit()))
    ):
        raise ValueError(
            f"{field}: the key {key!r} is not a number of steps; keys are positive integers, e.g. {{'8': ...}}."
        )
    steps = int(key)
    if steps < 1:
        raise ValueError(f"{field}: the key {key!r} is not a number of steps; keys are positive integers (≥ 1).")
    return steps


def read_steps_table(
    table: Mapping | None, field: str, entry: Callable[[int, Any, str], Entry] | None = None
) -> dict[int, Entry]:
    """
    A per-NFE table of a file or config (`{"8": value, ...}`, int keys taken as they are) as `{8: entry, ...}`, in
    the table's order. `entry(steps, value, where)` reads each value (`where` names it, e.g.
    `coefficients_by_steps['8']`, for its errors); without one the values are kept as they are. `None` reads as
    `{}`. A key that is no positive integer, or two keys of one NFE (`"8"` and `"08"`), is refused with an error
    naming `field` and the key.
    """
    if table is None:
        return {}
    if not isinstance(table, Mapping):
        raise ValueError(f"{field} must be a mapping of NFE to value, e.g. {{'8': ...}}, got {table!r}.")
    read: dict[int, Entry] = {}
    keys: dict[int, Any] = {}
    for key, value in table.items():
        steps = read_steps(key, field)
        if steps in keys:
            raise ValueError(f"{field}: the keys {keys[steps]!r} and {key!r} both name NFE {steps}; keep one of them.")
        keys[steps] = key
        read[steps] = value if entry is None else entry(steps, value, f"{field}[{str(key)!r}]")
    return read


def write_steps_table(table: Mapping[int, Entry], entry: Callable[[Entry], Any] | None = None) -> dict[str, Any]:
    """The file's shape of a per-NFE table: `{8: entry}` → `{"8": entry(entry)}`, in the table's order (the entries
    as they are without `entry`)."""
    return {steps_key(steps): value if entry is None else entry(value) for steps, value in table.items()}
