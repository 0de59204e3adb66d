"""Where a report's runs came from, as records: a run store's account (`store`, [`StoreRecord`]), the runs lent by an
earlier report (`reused_samples`, [`ReusedSamples`]; `reused_scores` and `bank_scores_reused`, [`ReusedScores`]), a
parts folder's scores (`score_parts`, [`ScoreParts`]), the report a rescoring scores again (`rescored_from`,
[`RescoredFrom`]) and the NFE parts sampled on different machines (`parts`, [`SampledPart`]), gathered in
[`Provenance`].

`from_json` / `to_json` cross the report's boundary key for key in the order the committed reports have them.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..runs.store import StoreRecord


@dataclass(frozen=True)
class ReusedScores:
    """
    Scores taken from an earlier report (`--reuse-scores`), or its tuning bank's.

    Args:
        report (`str`): the report.
        runs (`int`): the runs whose scores were taken.
        checked_run (`str`): the run scored again here.
        checked_difference (`float`): how far its scores were apart (relative NLL).
    """

    report: str
    runs: int
    checked_run: str
    checked_difference: float

    @classmethod
    def from_json(cls, data: Mapping) -> "ReusedScores":
        return cls(data["report"], data["runs"], data["checked_run"], data["checked_difference"])

    def to_json(self) -> dict:
        return {
            "report": self.report,
            "runs": self.runs,
            "checked_run": self.checked_run,
            "checked_difference": self.checked_difference,
        }


@dataclass(frozen=True)
class ReusedSamples:
    """
    Samples and sampling times taken from an earlier report (`--reuse-samples`).

    Args:
        report (`str`): the report.
        runs (`int`): the runs taken.
        checked_runs (`Sequence[str]`): the runs whose first batch was sampled again here.
    """

    report: str
    runs: int
    checked_runs: Sequence[str]

    @classmethod
    def from_json(cls, data: Mapping) -> "ReusedSamples":
        return cls(data["report"], data["runs"], data["checked_runs"])

    def to_json(self) -> dict:
        return {"report": self.report, "runs": self.runs, "checked_runs": list(self.checked_runs)}


@dataclass(frozen=True)
class ScoreParts:
    """
    Scores read from and written to a parts folder (`--score-parts-dir`).

    Args:
        folder (`str`): the folder.
        read (`int`), written (`int`): runs read from it and scored here.
    """

    folder: str
    read: int
    written: int

    @classmethod
    def from_json(cls, data: Mapping) -> "ScoreParts":
        return cls(data["folder"], data["read"], data["written"])

    def to_json(self) -> dict:
        return {"folder": self.folder, "read": self.read, "written": self.written}


@dataclass(frozen=True)
class RescoredFrom:
    """
    The report a rescoring (`benchmark --rescore`) scores again.

    Args:
        report (`str`): its file, relative to this report's folder.
        evaluator (`str`): its evaluator.
        evaluator_description (`str`, *optional*): its evaluator's description.
    """

    report: str
    evaluator: str
    evaluator_description: str | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> "RescoredFrom":
        return cls(data["report"], data["evaluator"], data.get("evaluator_description"))

    def to_json(self) -> dict:
        described = {"evaluator_description": self.evaluator_description} if self.evaluator_description else {}
        return {"report": self.report, "evaluator": self.evaluator, **described}


@dataclass(frozen=True)
class SampledPart:
    """
    An NFE part of a sweep sampled on its own machine.

    Args:
        nfe (`Sequence[int]`): its NFEs.
        command (`str`): the command that sampled it.
        seconds (`float`): its sampling time.
        device (`str`), torch (`str`): where it ran.
    """

    nfe: Sequence[int]
    command: str
    seconds: float
    device: str
    torch: str

    @classmethod
    def from_json(cls, data: Mapping) -> "SampledPart":
        return cls(tuple(data["nfe"]), data["command"], data["seconds"], data["device"], data["torch"])

    def to_json(self) -> dict:
        return {
            "nfe": list(self.nfe),
            "command": self.command,
            "seconds": self.seconds,
            "device": self.device,
            "torch": self.torch,
        }


def _read(data: Mapping, key: str, record: type):
    return record.from_json(data[key]) if data.get(key) else None


@dataclass(frozen=True)
class Provenance:
    """
    Where a report's runs came from (each part `None` where the report does not record it).

    Args:
        parts (`Sequence[SampledPart]`): the NFE parts sampled apart (empty where sampled in one).
        store ([`StoreRecord`], *optional*), reused_samples ([`ReusedSamples`], *optional*),
        reused_scores ([`ReusedScores`], *optional*), bank_scores_reused ([`ReusedScores`], *optional*),
        score_parts ([`ScoreParts`], *optional*), rescored_from ([`RescoredFrom`], *optional*): see the module.
    """

    parts: Sequence[SampledPart] = ()
    store: StoreRecord | None = None
    reused_samples: ReusedSamples | None = None
    reused_scores: ReusedScores | None = None
    bank_scores_reused: ReusedScores | None = None
    score_parts: ScoreParts | None = None
    rescored_from: RescoredFrom | None = None

    @property
    def devices(self) -> set[tuple[str, str]]:
        """The (device, torch) pairs the parts were sampled with."""
        return {(part.device, part.torch) for part in self.parts}

    @classmethod
    def from_json(cls, report: Mapping) -> "Provenance":
        """The provenance parts of a whole report."""
        return cls(
            tuple(SampledPart.from_json(part) for part in report.get("parts") or []),
            _read(report, "store", StoreRecord),
            _read(report, "reused_samples", ReusedSamples),
            _read(report, "reused_scores", ReusedScores),
            _read(report, "bank_scores_reused", ReusedScores),
            _read(report, "score_parts", ScoreParts),
            _read(report, "rescored_from", RescoredFrom),
        )
