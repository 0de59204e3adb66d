"""Checks of command-line inputs that need no model: paths, samples files, what a samples file records.

Everything here imports the standard library only, so a command refuses a missing path, an existing output or a file
of the wrong kind in well under a second, before torch, diffusers or transformers load.
"""

import gzip
import json
import os
from pathlib import Path

from .defaults import PROTOCOLS
from .output_paths import record_beside_samples
from .per_nfe import read_steps_table


def looks_like_repo_id(source: str | os.PathLike) -> bool:
    """Whether `source` has the form of a Hub repo id, `owner/name` (the rule of `untied_sc.hub.resolve_local`)."""
    text = str(source)
    return not text.startswith(("/", ".", "~")) and text.count("/") == 1 and all(text.split("/"))


def check_source_exists(source: str | os.PathLike, what: str, option: str) -> None:
    """
    Refuses a `source` that is neither a path on this machine nor shaped like a Hub repo id (a mistyped path), naming
    `option` (the argument that gave it) and `what` it should be.
    """
    if Path(source).expanduser().exists() or looks_like_repo_id(source):
        return
    raise FileNotFoundError(
        f"{option} {str(source)!r}: no such file or folder on this machine. Give the path of {what} (or a Hub repo "
        "id of the form owner/name)."
    )


def check_local_pipeline_folder(source: str | os.PathLike, command: str, has_output: bool = True) -> Path:
    """
    A pipeline folder that `untied-sc command` writes into: it must exist here and hold `model_index.json`. A Hub
    repo id cannot be written into: with `has_output`, the command's `--output FOLDER` takes the result instead.
    """
    path = Path(source).expanduser()
    if not path.exists():
        if looks_like_repo_id(source):
            remedy = "give --output FOLDER to write the result there" if has_output else "download it to a folder"
            raise FileNotFoundError(
                f"{str(source)!r} is not a folder on this machine, and a Hub repo id cannot be written into: "
                f"`untied-sc {command}` writes into a local pipeline folder; {remedy}."
            )
        raise FileNotFoundError(
            f"{str(source)!r} does not exist: give the path of a local pipeline folder (one holding "
            "model_index.json, as `pipe.save_pretrained` or `untied-sc train ... export` writes it)."
        )
    if not (path / "model_index.json").is_file():
        raise FileNotFoundError(
            f"{path} has no model_index.json, so it is not a pipeline folder: give the folder that "
            "`pipe.save_pretrained` wrote."
        )
    return path


def _open_text(path: Path):
    return gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz") else path.open(encoding="utf-8")


def check_samples_file(path: str | os.PathLike, option: str = "SAMPLES") -> None:
    """
    Reads enough of a samples file to tell whether it is one: it exists, holds at least one non-blank line, and its
    first line is a JSON object with a string `text` (or ELF's `generated`). The full file is parsed when scored.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"{option} {str(path)!r}: no such file. Give a JSONL samples file, as `untied-sc generate --out` or "
            "`untied-sc benchmark` (<report>.samples.jsonl.gz) writes one."
        )
    expected = (
        "a JSONL samples file holds one JSON object per line, each with a string 'text' (as `untied-sc generate "
        "--out FILE.jsonl` writes it)"
    )
    if path.name == "model_index.json" or path.name.endswith("_config.json") or path.name == "config.json":
        raise ValueError(
            f"{path} is a pipeline or model config, not a samples file: {expected}. To score a pipeline, write its "
            f"samples first: `untied-sc generate {path.parent} --nfe 8 --out samples.jsonl`."
        )
    try:
        with _open_text(path) as handle:
            first = next((line for line in handle if line.strip()), None)
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise ValueError(f"{path} is not a readable text file ({error}); {expected}.") from None
    if first is None:
        raise ValueError(f"{path} is empty: it holds no samples to score; {expected}.")
    try:
        record = json.loads(first)
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}, line 1 is not one JSON object ({error.msg}); {expected}.") from None
    if not isinstance(record, dict) or not isinstance(record.get("text", record.get("generated")), str):
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{path}, line 1 has no string 'text' (got {keys}); {expected}.")


def recorded_protocol(path: str | os.PathLike) -> tuple[str, Path] | None:
    """
    The GenPPL protocol a benchmark's samples file records, and the file that records it: a report's
    `<stem>.samples.jsonl.gz` has `<stem>.json` beside it (its `protocol`). `None` for a bare JSONL.
    """
    record_path = record_beside_samples(path)
    try:
        record = json.loads(record_path.read_text()) if record_path is not None else None
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict):
        return None
    protocol = record.get("protocol")
    return (protocol, record_path) if protocol in PROTOCOLS else None


def resolve_protocol(samples: str | os.PathLike, given: str | None) -> tuple[str, str | None]:
    """
    The protocol to score `samples` with: `given` (`--protocol`), else the one its benchmark record names. A bare
    JSONL without `--protocol` is refused: the two protocols give different GenPPL for the same texts. Returns the
    protocol and a warning (or `None`) for a `given` one that differs from the record's.
    """
    recorded = recorded_protocol(samples)
    if given is None:
        if recorded is None:
            raise ValueError(
                f"{samples} does not record which model produced it, so the GenPPL protocol is unknown: pass "
                f"--protocol {{{','.join(PROTOCOLS)}}} (elf for ELF samples, langflow for LangFlow samples; the two "
                "give different GenPPL for the same texts)."
            )
        return recorded[0], None
    if recorded is not None and recorded[0] != given:
        return given, (
            f"warning: {recorded[1]} records protocol {recorded[0]!r} for {samples}, but --protocol {given} was "
            f"given; scoring with {given!r} (leave --protocol out to use the recorded one)."
        )
    return given, None


def read_benchmark_report(path: str | os.PathLike, option: str, remedy: str = "") -> dict:
    """
    A benchmark report (`<model>.json`) read for `option` (`--reuse-scores`, `--rescore`), checked without its
    samples: the file exists, is a report (runs scored by a named evaluator), and its samples file is beside it (what
    its scores belong to; its `samples_file`, relative to the report's folder). `remedy` ends the missing-samples error.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{option} {path}: no such file; give a benchmark report, <model>.json.")
    try:
        report = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{option}: cannot read {path} as a benchmark report ({error}).") from None
    if not isinstance(report, dict) or not {"runs", "evaluator", "protocol"} <= report.keys():
        raise ValueError(f"{option}: {path} is not a benchmark report (<model>.json with runs and an evaluator).")
    if not report.get("samples_file") or not (path.parent / report["samples_file"]).is_file():
        raise ValueError(
            f"{option}: {path} has no samples file beside it ({report.get('samples_file') or 'none recorded'}), "
            f"so nothing shows which samples its scores belong to.{remedy}"
        )
    return report


def _json_record(path: Path) -> dict:
    """A JSON object file, or `{}` where there is none (or it cannot be read: loading reports that with its name)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return record if isinstance(record, dict) else {}


# What `calibrate` / `tune` / `ace` write into a pipeline folder in place (`cli._save_calibration`,
# `loading.save_sampler_statistics`, `remote_code.write_remote_code`, `ace.save_ace_statistics`), by component.
STATISTICS_FILES = ("config.json", "diffusion_pytorch_model.safetensors")
COMPONENT_MODULES = {
    "sampler_statistics": "untied_sc.schedulers.sampler_statistics",
    "ace_statistics": "untied_sc.calibration.ace",
}


def pipeline_writes(
    folder: str | os.PathLike, components: tuple[str, ...] = ("sampler_statistics", "scheduler")
) -> list[str]:
    """
    The files (relative to `folder`) a command writes into a pipeline folder in place, when it writes `components`:
    each statistics component's files and module file, the scheduler config, and `model_index.json` with the module
    files `write_remote_code` refreshes beside every package component it lists.
    """
    paths = ["model_index.json", "untied_sc_pipeline.py"]
    for component in components:
        if component == "scheduler":
            paths.append("scheduler/scheduler_config.json")
        else:
            paths += [f"{component}/{name}" for name in STATISTICS_FILES]
            paths.append(f"{component}/{COMPONENT_MODULES[component]}.py")
    index = _json_record(Path(folder) / "model_index.json")
    for component, value in index.items():
        if not component.startswith("_") and isinstance(value, list) and len(value) == 2:
            if isinstance(value[0], str) and value[0].startswith("untied_sc."):
                paths.append(f"{component}/{value[0]}.py")
    return list(dict.fromkeys(paths))


def check_writes_stay_inside(folder: str | os.PathLike, paths, writer: str) -> None:
    """
    Refuses to write `paths` (relative to `folder`) where one of them, or a folder on the way to it, is a symbolic
    link that leads out of `folder`: the write would go through it into another pipeline's files (or a shared
    Hub-cache blob). A link that stays inside `folder` is followed as usual. `writer` names what writes (a command,
    in backquotes).
    """
    root = Path(folder).expanduser()
    inside = root.resolve()
    for relative in paths:
        current = root
        for part in Path(relative).parts:
            current = current / part
            if not current.is_symlink():
                continue
            target = current.resolve()
            if target == inside or inside in target.parents:
                continue
            raise ValueError(
                f"{current} is a symbolic link to {os.readlink(current)} ({target}), outside {root}: {writer} "
                f"would write {relative} through it, into files that are not this pipeline's. Replace the "
                f"link with a copy of what it points to (`rm {current} && cp -r {target} {current}`), or write the "
                "result to a new folder with --output NEW_FOLDER."
            )


def _nfe_list(values) -> str:
    return ", ".join(str(n) for n in sorted(values))


def refuse_replacing_calibration(
    folder: str | os.PathLike, nfe, overwrite: bool, explicit_coefficients: bool = False
) -> None:
    """
    `untied-sc calibrate` in place, before any work: the NFEs asked for are not calibrated in `folder` yet (their
    statistics would be replaced), and, with coefficients given on the command line, the scheduler config holds none
    for them (they would be replaced, tuned ones included), unless `overwrite`. NFEs not there yet are added beside
    the others without it.
    """
    if overwrite:
        return
    folder = Path(folder)
    statistics = _json_record(folder / "sampler_statistics" / "config.json")
    calibrated = [int(n) for n in statistics.get("calibrated_steps") or []]
    path = folder / "scheduler" / "scheduler_config.json"
    scheduler = _json_record(path)
    stored = set(read_steps_table(scheduler.get("coefficients_by_steps"), f"{path}: coefficients_by_steps"))
    tuned = set(read_steps_table(scheduler.get("tuning_by_steps"), f"{path}: tuning_by_steps"))
    replaced = sorted(set(nfe) & set(calibrated))
    coefficients = sorted(set(nfe) & stored) if explicit_coefficients else []
    if not replaced and not coefficients:
        return
    parts = []
    if replaced:
        parts.append(
            f"{folder / 'sampler_statistics'} already holds statistics for NFE {_nfe_list(replaced)} "
            f"(calibrated NFEs: {_nfe_list(calibrated)})"
        )
    if coefficients:
        kind = "tuned " if set(coefficients) & tuned else ""
        parts.append(
            f"{folder / 'scheduler' / 'scheduler_config.json'} already holds {kind}coefficients for NFE "
            f"{_nfe_list(coefficients)}, which the coefficients given would replace"
        )
    new = sorted(set(nfe) - set(replaced) - set(coefficients))
    only_new = f" (--nfe {' '.join(map(str, new))})" if new else ""
    raise FileExistsError(
        f"{'; '.join(parts)}: calibrating again would replace them. Pass --overwrite to replace them, calibrate only "
        f"NFEs the folder lacks{only_new}, which are added beside the others, or write the result to a new folder "
        "with --output NEW_FOLDER."
    )


def refuse_replacing_tuning(folder: str | os.PathLike, nfe, overwrite: bool) -> None:
    """
    `untied-sc tune` in place, before any work: no NFE asked for holds tuned coefficients yet (a tuning record, or an
    entropy-matching temperature beside its coefficients), unless `overwrite`. Calibration's coefficients (a preset's)
    are what tuning starts from and replaces, without it.
    """
    if overwrite:
        return
    path = Path(folder) / "scheduler" / "scheduler_config.json"
    scheduler = _json_record(path)
    records = read_steps_table(scheduler.get("tuning_by_steps"), f"{path}: tuning_by_steps")
    entries = read_steps_table(scheduler.get("coefficients_by_steps"), f"{path}: coefficients_by_steps")
    knobs = ("temperature", "decode_temperature")
    tuned: dict[int, str] = {}
    for n in sorted(set(nfe)):
        record, entry = records.get(n), entries.get(n) or {}
        knob = next((f"{key} {entry[key]:g}" for key in knobs if isinstance(entry.get(key), int | float)), None)
        if record is None and knob is None:
            continue
        sized = isinstance(record, dict) and "num_samples" in record
        tuned[n] = (f"NFE {n}: tuned on {record['num_samples']} samples" if sized else f"NFE {n}: tuned") + (
            f", {knob}" if knob else ""
        )
    if not tuned:
        return
    untuned = sorted(set(nfe) - set(tuned))
    only_new = f" (--nfe {' '.join(map(str, untuned))})" if untuned else ""
    raise FileExistsError(
        f"{path} already holds tuned coefficients ({'; '.join(tuned.values())}): tuning again would replace them "
        f"and their entropy-matching temperature. Pass --overwrite to replace them, tune only NFEs not tuned "
        f"yet{only_new}, or write the result to a new folder with --output NEW_FOLDER."
    )
