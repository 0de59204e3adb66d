"""Samples files: what `untied-sc generate` writes and the lab's `evaluate` reads.

A samples file is JSONL: one JSON object per line and per sample, with

- `text` (`str`, required): the decoded sample (ELF's `generated` key is accepted when reading);
- `ids` (`list[int]`, optional): the generator's token ids (LangFlow's entropy is computed on these);
- `seed` (`int`, optional), `batch` (`int`, optional: the pipeline call within the seed, ELF's resampling unit),
  `sampler` (`str`, optional, e.g. `"official"` / `"untied"`), `nfe` (`int`, optional);
- any other key (a benchmark writes `index` and its diversity knob, e.g. `temperature`), kept in `Sample.extra`.

A benchmark report's samples (`<report>.samples.jsonl.gz`) hold several runs; [`evaluate_runs`] scores each run apart,
with the numbers of the report's run records.

Runs are stored once. A run (consecutive lines with the same values of [`RUN_KEYS`]) whose samples equal an earlier
run's, line for line in everything but those keys (a comparison sampler that its tuning switched off draws official's
samples), is written as one line: its own run keys, `same_samples_as` (the earlier run's run keys) and `num_samples`.
[`read_samples`] expands it back into the samples it stands for, in place.

A name ending in `.gz` is read and written gzip-compressed (a benchmark's samples come back from another machine).
"""

import gzip
import hashlib
import io
import json
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path


_KNOWN_KEYS = ("text", "ids", "seed", "batch", "sampler", "nfe")
# Keys that tell the runs of a benchmark samples file apart (the diversity knobs among them; `None` = the main run).
RUN_KEYS = ("sampler", "nfe", "seed", "temperature", "decode_temperature", "sc_cfg_scale")
PROVENANCE_KEYS = ("seed", "batch", "sampler", "nfe")  # what a per-sample record says of where the sample comes from


@dataclass
class Sample:
    """One generated sample: its text and, optionally, its generator ids and provenance."""

    text: str
    ids: list[int] | None = None
    seed: int | None = None
    batch: int | None = None
    sampler: str | None = None
    nfe: int | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        record = {key: getattr(self, key) for key in _KNOWN_KEYS if getattr(self, key) is not None}
        return {**self.extra, **record}

    @classmethod
    def from_dict(cls, record: dict) -> "Sample":
        record = dict(record)
        if "text" not in record and "generated" in record:
            record["text"] = record.pop("generated")
        if not isinstance(record.get("text"), str):
            raise ValueError(f"A sample needs a string 'text' (or 'generated'), got keys {sorted(record)}.")
        known = {key: record.pop(key) for key in _KNOWN_KEYS if key in record}
        if known.get("ids") is not None:
            known["ids"] = [int(i) for i in known["ids"]]
        return cls(**known, extra=record)


def _open_text(path: Path, mode: str):
    if path.name.endswith(".gz"):
        if mode == "w":  # no timestamp in the header: the same samples give the same bytes (committed files)
            return io.TextIOWrapper(gzip.GzipFile(path, "wb", compresslevel=9, mtime=0), encoding="utf-8")
        return gzip.open(path, mode + "t", encoding="utf-8")
    return path.open(mode, encoding="utf-8")


SAME_SAMPLES_AS = "same_samples_as"
_REFERENCE_KEYS = {SAME_SAMPLES_AS, "num_samples", *RUN_KEYS}


def _stored_key(record: dict) -> tuple:
    """The run keys a record holds, `None` values included: equal keys mean one run, written back exactly."""
    return tuple((key, record[key]) for key in RUN_KEYS if key in record)


def _content(records: list[dict]) -> str:
    """A digest of a run's samples in everything but their run keys."""
    digest = hashlib.sha256()
    for record in records:
        rest = {key: value for key, value in record.items() if key not in RUN_KEYS}
        digest.update(json.dumps(rest, sort_keys=True, ensure_ascii=False).encode() + b"\n")
    return digest.hexdigest()


def _stored_once(records: Iterable[dict]) -> Iterable[dict]:
    """`records` with each run whose samples repeat an earlier run's replaced by one reference line (module doc).

    Only runs that occupy one stretch of lines take part, so that a reference names exactly one run."""
    blocks: list[tuple[tuple, list[dict]]] = []
    for record in records:
        key = _stored_key(record)
        if blocks and blocks[-1][0] == key:
            blocks[-1][1].append(record)
        else:
            blocks.append((key, [record]))
    stretches: dict[tuple, int] = {}
    for key, _ in blocks:
        stretches[key] = stretches.get(key, 0) + 1
    first_run: dict[str, tuple] = {}
    for key, block in blocks:
        if not key or stretches[key] > 1:
            yield from block
            continue
        content = _content(block)
        if content in first_run:
            yield {**dict(key), SAME_SAMPLES_AS: dict(first_run[content]), "num_samples": len(block)}
            continue
        first_run[content] = key
        yield from block


def write_samples(path: str | os.PathLike, samples: Iterable[Sample | dict]) -> Path:
    """Writes `samples` (`Sample`s or dicts with at least `text`) to a JSONL file (`.gz`: compressed), one per line,
    each run stored once (a run that repeats an earlier one's samples is one reference line; see the module doc)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = ((s if isinstance(s, Sample) else Sample.from_dict(s)).to_dict() for s in samples)
    with _open_text(path, "w") as handle:
        for record in _stored_once(records):
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def _expand_reference(record: dict, runs: dict[tuple, list[dict] | None]) -> list[dict]:
    """The samples a reference line stands for: the named earlier run's, each with the line's run keys."""
    unknown = sorted(set(record) - _REFERENCE_KEYS)
    if unknown:
        raise ValueError(f"a '{SAME_SAMPLES_AS}' line holds only run keys and 'num_samples', got also {unknown}")
    target = record[SAME_SAMPLES_AS]
    if not isinstance(target, dict):
        raise ValueError(f"'{SAME_SAMPLES_AS}' must be the run keys of an earlier run, got {target!r}")
    source = runs.get(_stored_key(target), [])
    if not source:
        held = "stands on more than one stretch of lines" if source is None else "is not on an earlier line"
        raise ValueError(f"'{SAME_SAMPLES_AS}' names run {target}, which {held}; the file was not written whole")
    if record.get("num_samples") != len(source):
        raise ValueError(
            f"'{SAME_SAMPLES_AS}' run {target} holds {len(source)} samples, the line says {record.get('num_samples')}"
        )
    own = {key: record[key] for key in RUN_KEYS if key in record}
    return [{**{k: v for k, v in sample.items() if k not in RUN_KEYS}, **own} for sample in source]


def read_samples(path: str | os.PathLike) -> list[Sample]:
    """Reads a JSONL samples file (`.gz`: compressed; blank lines skipped), expanding the lines of runs stored once."""
    samples = []
    runs: dict[tuple, list[dict] | None] = {}  # run keys -> its records (None: on several stretches of lines)
    last_key = None
    number = 0
    try:
        with _open_text(Path(path), "r") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                    records = _expand_reference(record, runs) if SAME_SAMPLES_AS in record else [record]
                    samples.extend(Sample.from_dict(r) for r in records)
                    key = _stored_key(records[0])
                    if key != last_key:
                        runs[key] = [] if key not in runs else None
                        last_key = key
                except (json.JSONDecodeError, ValueError, TypeError) as error:  # TypeError: a run key that is a list
                    raise ValueError(f"{path}, line {number}: {error}") from error
                if runs[key] is not None:
                    runs[key].extend(records)
    except (EOFError, gzip.BadGzipFile, zlib.error, UnicodeDecodeError) as error:
        # a compressed file cut short (a copy or a run stopped mid-write) or not gzip at all
        raise ValueError(
            f"{path} cannot be read past line {number} ({type(error).__name__}: {error}): the file is cut short or "
            "damaged. Copy it again, or write it again (e.g. rerun the `untied-sc generate` that made it)."
        ) from None
    return samples
