"""One benchmark run as the sweep, the aggregation and the rescoring compute with it ([`RunRecord`]): which run it is
(sampler, NFE, seed, diversity knob value), its sampling seconds, its samples once sampled and its scores once
scored ([`RunScores`], with the per-sample columns the intervals resample, [`PerSample`]).

A report holds its runs' JSON layout and a stored generation its sampled runs' layout: [`RunRecord.to_json`] /
[`RunRecord.from_json`] and [`RunRecord.to_stored`] / [`RunRecord.from_stored`] cross those boundaries, key for key
in the order the committed reports have them (they re-render byte for byte). A record holds the diversity knob's
value; its name (`temperature`, `decode_temperature`, `sc_cfg_scale`) is the report's `diversity_knob`, given to
each of those four.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from untied_sc.generation import Sample

from ..evaluation.metrics import samples_per_second
from ..record_fields import require


# A run's scores that get a mean ± SE over seeds, as [`evaluate_samples`] names them, in the report's order (the
# subword measures last: reports scored before they existed lack them).
SCORE_METRICS = (
    "gen_ppl",
    "nll_per_token",
    "entropy",
    "entropy_generator_ids",
    "entropy_evaluator_ids",
    "rep_4",
    "distinct_1",
    "distinct_2",
    "distinct_3",
    "distinct_4",
    "token_rep_4",
    "token_distinct_4",
    "longest_repeat",
)
SUBWORD_METRICS = ("token_rep_4", "token_distinct_4", "longest_repeat")
# Per-sample columns a report's run keeps (the intervals and the equal-entropy control resample them).
PER_SAMPLE_KEYS = ("mean_nll", "nll_sum", "num_tokens", "entropy")


@dataclass(frozen=True)
class PerSample:
    """
    A run's per-sample columns, sample i of each at position i.

    Args:
        mean_nll: NLL per token (`None` for a sample the evaluator dropped).
        nll_sum, num_tokens: summed NLL and token count under the evaluator.
        entropy (*optional*): the protocol's unigram entropy; `None` in reports scored before it was kept per sample.
    """

    mean_nll: Sequence[float | None]
    nll_sum: Sequence[float]
    num_tokens: Sequence[int]
    entropy: Sequence[float | None] | None = None

    def __len__(self) -> int:
        return len(self.nll_sum)

    @classmethod
    def from_json(cls, data: Mapping) -> "PerSample":
        return cls(data["mean_nll"], data["nll_sum"], data["num_tokens"], data.get("entropy"))

    def to_json(self) -> dict:
        columns = {"mean_nll": self.mean_nll, "nll_sum": self.nll_sum, "num_tokens": self.num_tokens}
        return columns if self.entropy is None else {**columns, "entropy": self.entropy}

    def rows(self) -> list[dict]:
        """One dict per sample, as [`evaluate_samples`]'s `per_sample` holds them (entropy `None` where not kept)."""
        entropy = self.entropy if self.entropy is not None else [None] * len(self)
        columns = zip(self.mean_nll, self.nll_sum, self.num_tokens, entropy, strict=True)
        return [dict(zip(PER_SAMPLE_KEYS, row, strict=True)) for row in columns]


@dataclass(frozen=True)
class RunScores:
    """
    What scoring a run gave, as a report records it.

    Args:
        num_samples, num_scored: the run's samples and those the evaluator scored.
        samples_per_second: samples/s of sampling (from the run's seconds).
        metrics: each of [`SCORE_METRICS`] the report records (the subword ones absent from reports scored before
            they existed; `None` where a score is undefined).
        num_tokens: tokens the evaluator scored.
        per_sample ([`PerSample`]): the per-sample columns.
    """

    num_samples: int
    num_scored: int
    samples_per_second: float
    metrics: Mapping[str, float | None]
    num_tokens: int
    per_sample: PerSample

    @property
    def gen_ppl(self) -> float | None:
        return self.metrics["gen_ppl"]

    @property
    def entropy(self) -> float | None:
        return self.metrics["entropy"]

    def metric(self, name: str) -> float | None:
        """A score by name ([`SCORE_METRICS`] or `samples_per_second`); `None` where the report lacks it."""
        return self.samples_per_second if name == "samples_per_second" else self.metrics.get(name)

    @classmethod
    def from_result(cls, result: Mapping, seconds: float) -> "RunScores":
        """The scores of an [`evaluate_samples`] result of a run sampled in `seconds`."""
        rows = result["per_sample"]
        columns = {key: [row.get(key) for row in rows] for key in PER_SAMPLE_KEYS}
        return cls(
            result["num_samples"],
            result["num_scored"],
            samples_per_second(result["num_samples"], seconds),
            {key: result.get(key) for key in SCORE_METRICS},
            result["num_tokens"],
            PerSample(**columns),
        )

    def to_result(self) -> dict:
        """The [`evaluate_samples`] result these scores were made from, as far as a report keeps it (what a run
        store's scores entry needs)."""
        return {
            "num_samples": self.num_samples,
            "num_scored": self.num_scored,
            "num_tokens": self.num_tokens,
            **{key: self.metrics.get(key) for key in SCORE_METRICS},
            "per_sample": self.per_sample.rows(),
        }


@dataclass(frozen=True)
class RunRecord:
    """
    One run of a sweep: one sampler at one NFE and seed, and a diversity knob value or none.

    Args:
        sampler (`str`): the sampler's name in the sweep.
        nfe (`int`), seed (`int`): the run.
        value (`float`, *optional*): the diversity knob's value; `None` for a main run (the sampler's own).
        seconds (`float`): its sampling time (its slowest process's).
        samples (`Sequence[Sample]`, *optional*): its samples, where they are at hand (a generation's runs).
        scores ([`RunScores`], *optional*): its scores, once scored.
    """

    sampler: str
    nfe: int
    seed: int
    value: float | None
    seconds: float
    samples: Sequence[Sample] | None = None
    scores: RunScores | None = None

    @property
    def key(self) -> tuple:
        """`(sampler, nfe, seed, value)`: what names the run in a sweep."""
        return self.sampler, self.nfe, self.seed, self.value

    @property
    def is_main(self) -> bool:
        """A main run (no diversity value)."""
        return self.value is None

    def label(self) -> str:
        """How progress and errors name the run."""
        return f"{self.sampler} at NFE {self.nfe}, seed {self.seed}"

    def scored(self, result: Mapping) -> "RunRecord":
        """This run with the scores of its [`evaluate_samples`] `result`, its samples left behind."""
        return replace(self, samples=None, scores=RunScores.from_result(result, self.seconds))

    @classmethod
    def from_stored(cls, run: Mapping, knob: str, where: str, samples: Sequence[Sample] | None = None) -> "RunRecord":
        """A stored generation's run (`sampler`, `nfe`, `seed`, the knob, `seconds`), with its `samples` where
        given (a run store files them apart); a missing field is named with `where`."""
        fields = [require(run, name, "sampled run", where) for name in ("sampler", "nfe", "seed", knob, "seconds")]
        return cls(*fields, samples)

    def to_stored(self, knob: str) -> dict:
        """The run as a stored generation lists it ([`from_stored`]), without its samples."""
        return {"sampler": self.sampler, "nfe": self.nfe, "seed": self.seed, knob: self.value, "seconds": self.seconds}

    @classmethod
    def from_json(cls, data: Mapping, knob: str) -> "RunRecord":
        """A report's run record (the knob's value `None` where the record lacks the knob)."""
        metrics = {key: data[key] for key in SCORE_METRICS if key not in SUBWORD_METRICS}
        if SUBWORD_METRICS[0] in data:
            metrics.update({key: data[key] for key in SUBWORD_METRICS})
        scores = RunScores(
            data["num_samples"],
            data["num_scored"],
            data["samples_per_second"],
            metrics,
            data["num_tokens"],
            PerSample.from_json(data["per_sample"]),
        )
        return cls(data["sampler"], data["nfe"], data["seed"], data.get(knob), data["seconds"], scores=scores)

    def to_json(self, knob: str) -> dict:
        """The run record a report holds: the run, its timing, its scores and per-sample columns."""
        if self.scores is None:
            raise ValueError(f"The run {self.label()} is not scored: a report holds scored runs only.")
        scores = self.scores
        return {
            "sampler": self.sampler,
            "nfe": self.nfe,
            "seed": self.seed,
            knob: self.value,
            "num_samples": scores.num_samples,
            "num_scored": scores.num_scored,
            "seconds": self.seconds,
            "samples_per_second": scores.samples_per_second,
            **scores.metrics,
            "num_tokens": scores.num_tokens,
            "per_sample": scores.per_sample.to_json(),
        }


# The knob of a report that names none: reports written before `diversity_knob` was recorded swept temperature.
DEFAULT_KNOB = "temperature"


def report_knob(report: Mapping) -> str:
    """The diversity knob a report's runs record their values under ([`DEFAULT_KNOB`] where it names none)."""
    return report.get("diversity_knob", DEFAULT_KNOB)


def report_records(report: Mapping) -> list[RunRecord]:
    """A report's runs as [`RunRecord`]s, in the report's order (its [`report_knob`] names the knob)."""
    knob = report_knob(report)
    return [RunRecord.from_json(run, knob) for run in report["runs"]]
