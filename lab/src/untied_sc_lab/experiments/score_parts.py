"""Scored runs kept one file each (`--score-parts-dir` of `untied-sc benchmark` and `evaluate`), so that a stopped
scoring resumes.

Scoring dominates a benchmark on a CPU (hours for a report under a large evaluator) and a process may be stopped
before the report is written; checking a report from its samples (`evaluate`) takes as long. With a parts folder every
run [`score_sweep`] or [`evaluate_runs`] scores is written there as soon as it is scored, named by what decides its
scores: its samples ([`samples_fingerprint`]), the evaluator as the report names it (its description, dtype included),
the protocol, the scoring batch size, the maximum length and (`evaluate --context-size`) the chunk width. A run whose
part exists is read instead of scored: the same texts under the same scoring give the same numbers. A part holds the
[`evaluate_samples`] result and nothing else of the run, so any report whose runs hold those samples can read it.
"""

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from untied_sc.generation import Sample

from .score_reuse import samples_fingerprint


PART_FORMAT = "untied-sc scored run 1"


@dataclass
class ScoreParts:
    """A parts folder and the scoring that names its parts; counts the parts read and written in this scoring."""

    folder: Path
    evaluator_description: str
    protocol: str
    eval_batch_size: int | None
    max_length: int | None
    context_size: int | None = None
    read: int = 0
    written: int = 0

    def identity(self, samples: Sequence[Sample]) -> dict:
        """What decides a run's scores: its samples and this scoring's settings."""
        identity = {
            "samples": samples_fingerprint(samples),
            "evaluator_description": self.evaluator_description,
            "protocol": self.protocol,
            "eval_batch_size": self.eval_batch_size,
            "max_length": self.max_length,
        }
        if self.context_size is not None:  # `evaluate --context-size`; absent, parts keep the names they had
            identity["context_size"] = self.context_size
        return identity

    def path(self, samples: Sequence[Sample]) -> Path:
        digest = hashlib.sha256(json.dumps(self.identity(samples), sort_keys=True).encode()).hexdigest()[:24]
        return self.folder / f"run-{digest}.json"

    def scored(self, samples: Sequence[Sample], score: Callable[[], dict], run: str) -> dict:
        """`samples`' scores: read from their part when it exists, else `score()`d and written as a part first.

        Raises:
            `ValueError`: a part of that name that is not this run's (another format, or other samples or
            settings): the folder holds files it was not made for.
        """
        path, identity = self.path(samples), self.identity(samples)
        if path.exists():
            try:
                part = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as error:
                raise ValueError(
                    f"--score-parts-dir: {path} cannot be read ({error}); delete it to score again."
                ) from error
            if not isinstance(part, dict) or part.get("format") != PART_FORMAT or part.get("identity") != identity:
                raise ValueError(
                    f"--score-parts-dir: {path} is not the scored run it is named after (another format, samples or "
                    "scoring); delete it, or give a folder of parts this scoring wrote."
                )
            self.read += 1
            return part["result"]
        result = score()
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(".json.partial")  # renamed into place whole: a stop never leaves half a part
        staged.write_text(json.dumps({"format": PART_FORMAT, "run": run, "identity": identity, "result": result}))
        os.replace(staged, path)
        self.written += 1
        return result

    def record(self) -> dict:
        """The report's account of the parts: the folder, and how many runs were read and scored here."""
        return {"folder": str(self.folder), "read": self.read, "written": self.written}
