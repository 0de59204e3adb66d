"""A report's settings as a record ([`ReportSettings`]): the model, the evaluator and protocol, the seeds and sample
counts, the diversity sweep, the machine(s) and command(s) that ran it, its timings, and how its intervals were
computed ([`ResamplingUnit`], [`IntervalRule`]).

[`ReportSettings.from_json`] reads them from a whole report, where they sit at the top level among its other parts.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ResamplingUnit:
    """
    The bootstrap's resampling unit.

    Args:
        unit (`str`): `"batch"` (ELF: a batch shares one time grid) or `"sample"`.
        why (`str`): the reason.
        stratified_by (`str`): what the resamples stay within (`"seed"`).
    """

    unit: str
    why: str
    stratified_by: str

    @classmethod
    def from_json(cls, data: Mapping) -> "ResamplingUnit":
        return cls(data["unit"], data["why"], data["stratified_by"])

    def to_json(self) -> dict:
        return {"unit": self.unit, "why": self.why, "stratified_by": self.stratified_by}


# A report that records no unit (none of the committed ones) resamples samples within seeds.
SAMPLE_UNIT = ResamplingUnit("sample", "", "seed")


@dataclass(frozen=True)
class IntervalRule:
    """
    The headline interval's rule of a report analysed with the small-sample intervals.

    Args:
        threshold_clusters (`int`): below this many clusters the `below` interval, otherwise the `otherwise` one.
        below (`str`), otherwise (`str`), why (`str`): the two intervals and the reason.
    """

    threshold_clusters: int
    below: str
    otherwise: str
    why: str

    @classmethod
    def from_json(cls, data: Mapping) -> "IntervalRule":
        return cls(data["threshold_clusters"], data["below"], data["otherwise"], data["why"])

    def to_json(self) -> dict:
        return {
            "threshold_clusters": self.threshold_clusters,
            "below": self.below,
            "otherwise": self.otherwise,
            "why": self.why,
        }


# The sweep's settings a report holds beside those it renders (absent from the reports tests build by hand).
SWEEP_KEYS = (
    "batch_seed",
    "diversity_values",
    "diversity_samplers",
    "diversity_nfe",
    "diversity_default",
    "num_processes",
)


@dataclass(frozen=True)
class ReportSettings:
    """
    What a report ran and how.

    Args:
        model (`str`), family (`str`), pipeline_class (`str`): the model.
        nfe (`Sequence[int]`), seeds (`Sequence[int]`), num_samples (`int`), batch_size (`int`): the sweep.
        protocol (`str`), evaluator (`str`), evaluator_description (`str`, *optional*): the scoring.
        generator_tokenizer (`str`, *optional*): the generating model's tokenizer, described.
        baseline (`str`): the sampler the others are compared with.
        diversity_knob (`str`): the diversity sweep's knob.
        device (`str`), torch (`str`): where it sampled.
        command (`str`): the command that ran it (sampled it, where `scoring_command` scored it elsewhere).
        main_only (`bool`): the diversity runs were not scored (`--main-only`).
        scoring_command (`str`, *optional*), scoring_device (`str`, *optional*): the scoring elsewhere.
        sampling_seconds, scoring_seconds (`float`, *optional*), wall_seconds (`float`): its timings.
        samples_file (`str`, *optional*): the scored samples' file beside the report.
        resampling_unit ([`ResamplingUnit`]): the bootstrap's unit.
        interval_rule ([`IntervalRule`], *optional*): the headline rule (reports with the small-sample intervals).
        equal_entropy_fit (`str`, *optional*): the curve fit of the equal-entropy readings.
        batch_seed, diversity_values, diversity_samplers, diversity_nfe, diversity_default, num_processes
            (*optional*): the sweep's batch seeding, its diversity values, samplers and NFEs, the knob's value in the
            main runs, and its processes.
    """

    model: str
    family: str
    pipeline_class: str
    nfe: Sequence[int]
    seeds: Sequence[int]
    num_samples: int
    batch_size: int
    protocol: str
    evaluator: str
    evaluator_description: str | None
    generator_tokenizer: str | None
    baseline: str
    diversity_knob: str
    device: str
    torch: str
    command: str
    main_only: bool
    scoring_command: str | None
    scoring_device: str | None
    sampling_seconds: float | None
    scoring_seconds: float | None
    wall_seconds: float
    samples_file: str | None
    resampling_unit: ResamplingUnit
    interval_rule: IntervalRule | None
    equal_entropy_fit: str | None
    batch_seed: str | None = None
    diversity_values: Sequence[float] | None = None
    diversity_samplers: Sequence[str] | None = None
    diversity_nfe: Sequence[int] | None = None
    diversity_default: float | None = None
    num_processes: int | None = None

    @property
    def num_clusters(self) -> int:
        """The independent clusters a cell pools: the time grids (batches) over seeds, or the samples."""
        if self.resampling_unit.unit == "batch":
            return len(self.seeds) * -(-self.num_samples // self.batch_size)
        return len(self.seeds) * self.num_samples

    @classmethod
    def from_json(cls, report: Mapping) -> "ReportSettings":
        """The settings of a whole report."""
        unit = report.get("resampling_unit")
        rule = report.get("interval_rule")
        return cls(
            report["model"],
            report["family"],
            report["pipeline_class"],
            report["nfe"],
            report["seeds"],
            report["num_samples"],
            report["batch_size"],
            report["protocol"],
            report["evaluator"],
            report.get("evaluator_description"),
            report.get("generator_tokenizer"),
            report["baseline"],
            report["diversity_knob"],
            report["device"],
            report["torch"],
            report["command"],
            bool(report.get("main_only")),
            report.get("scoring_command"),
            report.get("scoring_device"),
            report.get("sampling_seconds"),
            report.get("scoring_seconds"),
            report["wall_seconds"],
            report.get("samples_file"),
            ResamplingUnit.from_json(unit) if unit else SAMPLE_UNIT,
            IntervalRule.from_json(rule) if rule is not None else None,
            report.get("equal_entropy_fit"),
            *(report.get(key) for key in SWEEP_KEYS),
        )
