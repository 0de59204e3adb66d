"""The names of the files a benchmark writes, in a module that imports nothing heavy: the command line refuses to
replace them before any work (and `untied-sc evaluate` finds the record beside a samples file)."""

import os
from pathlib import Path


REPORT_SAMPLES_SUFFIX = ".samples.jsonl.gz"
GENERATION_SAMPLES_SUFFIX = ".generation-samples.jsonl.gz"


def report_paths(output_dir: str | os.PathLike, stem: str, samples: bool = True) -> dict[str, Path]:
    """The files `report.write_results` writes for `stem`: `json`, `markdown`, `plot` and (with `samples`)
    `samples`."""
    folder = Path(output_dir)
    paths = {"json": folder / f"{stem}.json", "markdown": folder / f"{stem}.md", "plot": folder / f"{stem}.png"}
    if samples:
        paths["samples"] = folder / f"{stem}{REPORT_SAMPLES_SUFFIX}"
    return paths


def generation_paths(output_dir: str | os.PathLike, stem: str) -> dict[str, Path]:
    """The files `generation_files.write_generation` writes for `stem`: `generation` and `samples`."""
    folder = Path(output_dir)
    return {"generation": folder / f"{stem}.generation.json", "samples": folder / f"{stem}{GENERATION_SAMPLES_SUFFIX}"}


def record_beside_samples(samples: str | os.PathLike) -> Path | None:
    """The JSON record a benchmark wrote beside its samples file (`<stem>.json` beside a report's samples,
    `<stem>.generation.json` beside a generation's), or `None` for a file of another name."""
    path = Path(samples)
    for suffix, paths in ((REPORT_SAMPLES_SUFFIX, report_paths), (GENERATION_SAMPLES_SUFFIX, generation_paths)):
        if path.name.endswith(suffix):
            return next(iter(paths(path.parent, path.name[: -len(suffix)]).values()))
    return None


def rescored_report_name(model: str, evaluator: str | os.PathLike, dtype: str | None = None) -> str:
    """The default file stem of a report rescored under another evaluator (`benchmark --rescore`): the first
    report's model and the evaluator's short name (`elf-small-baselines-gemma3-270m`; a folder or Hub id by its last
    part), and the dtype when only that differs from the first report's."""
    short = Path(str(evaluator).rstrip("/")).name
    return f"{model}-{short}" + (f"-{dtype}" if dtype else "")
