"""A sampled benchmark sweep as one record ([`Generation`]): the sweep's settings, the coefficients each untied
sampler ran with, where and how long it sampled, and its runs with their samples ([`RunRecord`]); for `--experiment
baselines --tune-here` also the tuning bank's runs ([`BankSample`]), the bank's settings ([`BaselineCandidates`]) and
what was sampled per NFE ([`TunedWhenSampled`]).

[`generate_sweep`] makes one and [`score_sweep`] scores one. It crosses a file only where a run store carries a part
of it from the machine that samples to the one that scores ([`Generation.to_json`] / [`Generation.from_json`]: the
runs without their samples, which the store files under each run's key, key for key in the store files' order).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from untied_sc.generation import Sample, SamplerSpec
from untied_sc.per_nfe import read_steps_table, write_steps_table

from ..record_fields import require
from ..runs.bank_run import BankRun
from ..runs.store import RUN_SETTINGS, StoreRecord
from .provenance import SampledPart
from .records import RunRecord
from .tuning_records import (
    AceDirection,
    KnobTuning,
    SampledBank,
    TunedWhenSampled,
    UntiedRecords,
    untied_from_json,
    untied_to_json,
)


GENERATION_FORMAT = "untied-sc benchmark generation"  # the `format` of a stored generation
CANDIDATES_KEY = "baseline_candidates"  # the baselines experiment's tuning-bank candidates in a stored generation

_SWEEP = "sampled benchmark sweep"  # how a missing field's error names the record

Coefficients = Mapping[str, Mapping[int, Mapping[str, float]]]  # {sampler: {nfe: {coefficient: value}}}


@dataclass(frozen=True)
class BankSample:
    """
    One tuning-bank run that `--tune-here` sampled: no run of the benchmark, its knob values in `call`.

    Args:
        sampler (`str`): its label (`"tuning bank: higs (higs_weight=1.75)"`).
        nfe (`int`), seed (`int`): its NFE and the bank's seed (in the tuning seed space).
        key (`str`): what the search names it by (its NFE, spec and call arguments).
        spec ([`SamplerSpec`]), call (`Mapping`): what it was sampled with.
        num_samples (`int`): the bank's size.
        seconds (`float`): its sampling time (not timed: 0).
        samples (`Sequence[Sample]`, *optional*): its samples, where they are at hand.
    """

    sampler: str
    nfe: int
    seed: int
    key: str
    spec: SamplerSpec
    call: Mapping
    num_samples: int
    seconds: float
    samples: Sequence[Sample] | None = None

    def to_json(self, knob: str) -> dict:
        """The run as a stored generation lists it (the knob `None`: its value is in `call`)."""
        return {
            "sampler": self.sampler,
            "nfe": self.nfe,
            "seed": self.seed,
            knob: None,
            "bank_key": self.key,
            "spec": self.spec.to_json(),
            "call": dict(self.call),
            "num_samples": self.num_samples,
            "seconds": self.seconds,
        }

    @classmethod
    def from_json(cls, data: Mapping, where: str) -> "BankSample":
        def field(name: str):
            return require(data, name, _SWEEP, where)

        spec = SamplerSpec.from_json(field("spec"), f"{where}.spec")
        return cls(
            field("sampler"), field("nfe"), field("seed"), field("bank_key"), spec, field("call"),
            field("num_samples"), field("seconds"),
        )  # fmt: skip


@dataclass(frozen=True)
class BaselineCandidates:
    """
    The tuning bank a `--tune-here` generation sampled and what the scoring machine needs to replay the search on it.

    Args:
        samplers (`Mapping[str, SamplerSpec]`): the sampler set before tuning.
        bank ([`SampledBank`]): the bank's settings and the search's.
        untied (`UntiedRecords`): how each untied sampler's coefficients were chosen, per NFE.
        ace ([`AceDirection`], *optional*): the ACE direction the ACE samplers ran with (`None`: the pipeline has none).
    """

    samplers: Mapping[str, SamplerSpec]
    bank: SampledBank
    untied: UntiedRecords
    ace: AceDirection | None

    def to_json(self) -> dict:
        return {
            "samplers": {name: spec.to_json() for name, spec in self.samplers.items()},
            "bank": self.bank.to_json(),
            "untied": untied_to_json(self.untied),
            "ace": None if self.ace is None else self.ace.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping, where: str = CANDIDATES_KEY) -> "BaselineCandidates":
        samplers = {
            name: SamplerSpec.from_json(spec, f"{where}.samplers[{name!r}]")
            for name, spec in require(data, "samplers", _SWEEP, where).items()
        }
        ace = require(data, "ace", _SWEEP, where)
        return cls(
            samplers,
            SampledBank.from_json(require(data, "bank", _SWEEP, where), f"{where}.bank"),
            untied_from_json(require(data, "untied", _SWEEP, where)),
            None if ace is None else AceDirection.from_json(ace, f"{where}.ace"),
        )


@dataclass(frozen=True)
class Generation:
    """
    A sampled sweep, unscored.

    Args:
        model, family, pipeline_class, generator_tokenizer: the pipeline as the report names it (the tokenizer's
            description `None` where a rebuilt report lacks it).
        nfe, seeds, num_samples, batch_size, batch_seed: the sweep (`batch_seed`: the rule that seeds batch b).
        samplers (`Mapping[str, SamplerSpec]`): each sampler's spec.
        coefficients (`Coefficients`, *optional*): η_R, η_T, η_O, α each untied sampler ran with, by NFE (`None`
            where a rebuilt report records none).
        baseline (`str`): the sampler the others are compared with.
        diversity_knob, diversity_values, diversity_samplers, diversity_nfe: the diversity sweep.
        device, num_processes, torch: where it sampled (a run's `seconds` are its slowest process's).
        command (`str`), seconds (`float`): the command that sampled and its wall time.
        runs (`Sequence[RunRecord]`): the benchmark runs, with their samples.
        bank_runs (`Sequence[BankSample]`): the tuning bank's runs (`--tune-here`).
        knob_tuning ([`KnobTuning`], *optional*): how the comparison samplers' knobs were chosen.
        store ([`StoreRecord`], *optional*): the run store's account of the sampling.
        candidates ([`BaselineCandidates`], *optional*), tuned_when_sampled ([`TunedWhenSampled`], *optional*): a
            `--tune-here` generation's bank and what it sampled per NFE.
        parts (`Sequence[SampledPart]`, *optional*): a merged generation's parts, one per sampling command.
        bank_scores (`Mapping[str, BankRun]`, *optional*): the bank's scores by samples fingerprint, once scored.
    """

    model: str
    family: str
    pipeline_class: str
    generator_tokenizer: str | None
    nfe: tuple[int, ...]
    seeds: tuple[int, ...]
    num_samples: int
    batch_size: int
    batch_seed: str
    samplers: Mapping[str, SamplerSpec]
    coefficients: Coefficients | None
    baseline: str
    diversity_knob: str
    diversity_values: tuple[float, ...]
    diversity_samplers: tuple[str, ...]
    diversity_nfe: tuple[int, ...]
    device: str
    num_processes: int
    torch: str
    command: str
    seconds: float
    runs: tuple[RunRecord, ...] = ()
    bank_runs: tuple[BankSample, ...] = ()
    knob_tuning: KnobTuning | None = None
    store: StoreRecord | None = None
    candidates: BaselineCandidates | None = None
    tuned_when_sampled: TunedWhenSampled | None = None
    parts: tuple[SampledPart, ...] | None = None
    bank_scores: Mapping[str, BankRun] | None = None

    @property
    def run_settings(self) -> dict:
        """The settings a run's samples depend on beyond the run itself ([`RUN_SETTINGS`]), for [`RunKey.of`]."""
        return {name: getattr(self, name) for name in RUN_SETTINGS}

    @property
    def sampled_runs(self) -> tuple[RunRecord | BankSample, ...]:
        """Every sampled run in the order a stored generation lists them: the benchmark runs, then the bank's."""
        return (*self.runs, *self.bank_runs)

    def coefficients_at(self, sampler: str, nfe: int) -> Mapping[str, float] | None:
        """The coefficients `sampler` ran with at `nfe` (`None` for a sampler without any)."""
        return (self.coefficients or {}).get(sampler, {}).get(nfe)

    def samplers_json(self) -> dict:
        return {name: spec.to_json() for name, spec in self.samplers.items()}

    def coefficients_json(self) -> dict | None:
        if self.coefficients is None:
            return None
        return {sampler: write_steps_table(by_steps) for sampler, by_steps in self.coefficients.items()}

    def to_json(self) -> dict:
        """The generation as a run store keeps it: its settings, then its runs without their samples."""
        data = {
            "format": GENERATION_FORMAT,
            "model": self.model,
            "family": self.family,
            "pipeline_class": self.pipeline_class,
            "generator_tokenizer": self.generator_tokenizer,
            "nfe": list(self.nfe),
            "seeds": list(self.seeds),
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "batch_seed": self.batch_seed,
            "samplers": self.samplers_json(),
            "coefficients": self.coefficients_json(),
            "baseline": self.baseline,
            "diversity_knob": self.diversity_knob,
            "diversity_values": list(self.diversity_values),
            "diversity_samplers": list(self.diversity_samplers),
            "diversity_nfe": list(self.diversity_nfe),
            "device": self.device,
            "num_processes": self.num_processes,
            "torch": self.torch,
            "command": self.command,
            "seconds": self.seconds,
        }
        optional = {
            "knob_tuning": self.knob_tuning,
            "store": self.store,
            CANDIDATES_KEY: self.candidates,
            "tuned_when_sampled": self.tuned_when_sampled,
        }
        data.update({key: record.to_json() for key, record in optional.items() if record is not None})
        if self.parts is not None:
            data["parts"] = [part.to_json() for part in self.parts]
        if self.bank_scores is not None:
            data["bank_scores"] = {key: run.to_json() for key, run in self.bank_scores.items()}
        knob = self.diversity_knob
        data["runs"] = [run.to_stored(knob) for run in self.runs] + [run.to_json(knob) for run in self.bank_runs]
        return data

    @classmethod
    def from_json(cls, data: Mapping, where: str = "the generation") -> "Generation":
        """A generation as [`to_json`] writes it, its runs without samples. `coefficients`, `generator_tokenizer`,
        `num_processes` (1), `knob_tuning` and `parts` may be absent (a report rebuilt for rescoring lacks some).

        Raises:
            `ValueError`: not a generation, or a field missing (the error names the field and `where`).
        """
        if not isinstance(data, Mapping) or data.get("format") != GENERATION_FORMAT:
            raise ValueError(f"{where} is not a sampled benchmark sweep (its format is not {GENERATION_FORMAT!r}).")
        knob = require(data, "diversity_knob", _SWEEP, where)
        runs, bank_runs = [], []
        for i, run in enumerate(require(data, "runs", _SWEEP, where)):
            if "bank_key" in run:
                bank_runs.append(BankSample.from_json(run, f"{where}: runs[{i}]"))
            else:
                runs.append(RunRecord.from_stored(run, knob, f"{where}: runs[{i}]"))
        coefficients = data.get("coefficients")
        if coefficients is not None:
            coefficients = {
                sampler: read_steps_table(by_steps, f"{where}: coefficients[{sampler!r}]")
                for sampler, by_steps in coefficients.items()
            }
        parts = data.get("parts")
        tuning, store, candidates, tuned, bank_scores = (
            data.get(key) for key in ("knob_tuning", "store", CANDIDATES_KEY, "tuned_when_sampled", "bank_scores")
        )
        return cls(
            **{name: require(data, name, _SWEEP, where) for name in _SETTINGS},
            nfe=tuple(require(data, "nfe", _SWEEP, where)),
            seeds=tuple(require(data, "seeds", _SWEEP, where)),
            samplers={
                name: SamplerSpec.from_json(spec, f"{where}: samplers[{name!r}]")
                for name, spec in require(data, "samplers", _SWEEP, where).items()
            },
            coefficients=coefficients,
            generator_tokenizer=data.get("generator_tokenizer"),
            diversity_knob=knob,
            diversity_values=tuple(require(data, "diversity_values", _SWEEP, where)),
            diversity_samplers=tuple(require(data, "diversity_samplers", _SWEEP, where)),
            diversity_nfe=tuple(require(data, "diversity_nfe", _SWEEP, where)),
            num_processes=data.get("num_processes", 1),
            runs=tuple(runs),
            bank_runs=tuple(bank_runs),
            knob_tuning=None if tuning is None else KnobTuning.from_json(tuning),
            store=None if store is None else StoreRecord.from_json(store),
            candidates=None if candidates is None else BaselineCandidates.from_json(candidates),
            tuned_when_sampled=None if tuned is None else TunedWhenSampled.from_json(tuned),
            parts=None if parts is None else tuple(SampledPart.from_json(part) for part in parts),
            bank_scores=None if bank_scores is None else {k: BankRun.from_json(v) for k, v in bank_scores.items()},
        )


# The plain fields [`Generation.from_json`] takes as they are.
_SETTINGS = (
    "model",
    "family",
    "pipeline_class",
    "num_samples",
    "batch_size",
    "batch_seed",
    "baseline",
    "device",
    "torch",
    "command",
    "seconds",
)
