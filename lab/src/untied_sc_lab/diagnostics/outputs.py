"""Where a diagnostic's results go: `<output-dir>/<model>-<diagnostic>.{json,md,png}`, never over existing files
unless asked; and how their per-NFE entries cross the JSON boundary (`int` NFEs in memory, `str` object keys in JSON).
"""

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path


SUFFIXES = ("json", "md", "png")


def output_paths(output_dir: str | Path, model: str, diagnostic: str) -> dict[str, Path]:
    """The three result files of `diagnostic` on `model`, by suffix."""
    return {suffix: Path(output_dir) / f"{model}-{diagnostic}.{suffix}" for suffix in SUFFIXES}


def refuse_existing(paths: dict[str, Path], overwrite: bool) -> None:
    """Before any work: an existing result file is replaced only with `overwrite`."""
    existing = [str(path) for path in paths.values() if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} already exist{'s' if len(existing) == 1 else ''}; pass --overwrite to replace "
            "them, or choose another --output-dir."
        )


def nfe_keyed(by_nfe: Mapping[int, object], convert: Callable[[object], object] | None = None) -> dict[str, object]:
    """Per-NFE entries as a JSON object: the NFE's decimal string as the key, in the mapping's (NFE) order; each entry
    through `convert` where given (a record's `to_json`)."""
    return {str(n): value if convert is None else convert(value) for n, value in by_nfe.items()}


def _finite(value):
    """JSON has no NaN or infinity: they are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def write_outputs(
    paths: dict[str, Path], payload: dict, markdown: str, plot: Callable[[Path], None]
) -> dict[str, Path]:
    """Writes the JSON payload, the Markdown report and the figure (`plot(path)` saves it); returns `paths`."""
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(_finite(payload), indent=2, ensure_ascii=False) + "\n")
    paths["md"].write_text(markdown)
    plot(paths["png"])
    return paths
