"""One content-addressed folder of sampled and scored runs (`untied-sc benchmark --store`, `evaluate --store`,
`tune --store`): a stopped sweep, rescoring or tuning resumes from it, and a sweep sampled on one machine is scored on
another from it.

A run's samples are stored under the hash of its [`RunKey`], the settings that decide them and nothing else; a run's
scores under the hash of its [`ScoreKey`], its samples' fingerprint and the scoring's settings; a `--generate-only`
sweep's settings (timings, coefficients, device: all but its samples) under the hash of what names the part
([`RunStore.put_sweep`]), for the scoring command to find; a scored tuning-bank run (`tune --store`, the benchmark's
knob tuning) under the hash of its [`BankRunKey`], the bank and the run that decide its scores. Two runs with equal
keys draw equal samples (same seed, same machine) and equal texts score equally, so a key found is work not done
again. Each entry is written to a temporary name and renamed into place whole: a stopped process never leaves half an
entry under an entry's name, and temporary files are never read. An entry whose recorded key differs from the one its
name was computed from (an edited or foreign file) is refused, naming the file.
"""

import gzip
import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from untied_sc.generation import KNOBS_KEY, Sample, SamplerSpec

from ..evaluation.io import samples_key
from .bank_run import BankRun


STORE_FORMAT = "untied-sc run store 1"
HEADER = "store.json"
SWEEPS = "sweeps"  # the folder of `--generate-only` sweep parts
BANKS = "banks"  # the folder of scored tuning-bank runs
# Relative tolerance of the check of imported scores on each sample's NLL sum: another device or batch padding moves
# it by ~1e-6; another --max-length, dtype or evaluator moves it by far more.
SPOT_CHECK_TOLERANCE = 1e-4
# What a tuning-bank run's key names in place of a sampler spec: its spec and call arguments.
BANK_RUN_SPEC = {"spec", "call"}


def canonical(value) -> str:
    """A value as the one JSON text a key hashes (keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def spec_at(spec: SamplerSpec, n: int) -> dict:
    """A sampler spec's JSON as it samples at NFE `n`: its settings and, for a tuned comparison sampler, its knobs
    there under `knobs_by_steps`."""
    at_n = spec.to_json()
    if spec.knobs_by_steps is not None:
        # a spec tuned at other NFEs only still names its run here (with no knobs); sampling it is refused
        at_n[KNOBS_KEY] = spec.knobs_at(n, missing_ok=True)
    return at_n


def samples_fingerprint(samples: Sequence[Sample]) -> str:
    """[`samples_key`] as a short sha256 hex digest: what a run's scores are stored under, and how a report names a
    tuning-bank run without its samples."""
    return hashlib.sha256(json.dumps(samples_key(samples)).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RunKey:
    """
    What decides a run's samples, and nothing else: its fields are the one list of run settings that sampling,
    rescoring and the store read. The weights and the machine's rounding are not in it (a report does not record
    them): [`RunStore.samples`] checks them by sampling one batch again where a pipeline is at hand.

    Args:
        family, pipeline_class, generator_tokenizer: the pipeline as a report records it.
        seed_space: `"benchmark"` or `"tuning"` (the tuning bank's seeds).
        spec: the sampler spec at this NFE ([`spec_at`]), as [`canonical`] JSON.
        coefficients: the untied coefficients it ran with at this NFE, as canonical JSON (`"null"` for another
            sampler).
        nfe, seed, num_samples, batch_size: the run.
        batch_seed: the rule that seeds batch b of seed s.
        diversity_knob, value: the diversity knob the call sets and its value (`None`: the sampler's own).
    """

    family: str
    pipeline_class: str
    generator_tokenizer: str | None
    seed_space: str
    spec: str
    coefficients: str
    nfe: int
    seed: int
    num_samples: int
    batch_size: int
    batch_seed: str
    diversity_knob: str
    value: float | None = None

    @classmethod
    def of(
        cls, settings: Mapping, spec: SamplerSpec | Mapping, coefficients, nfe: int, seed: int, value=None, **overrides
    ):
        """The key of one run of a sweep whose settings (a generation's or a report's) are `settings`; `spec` is the
        run's sampler spec (a JSON object is read with [`SamplerSpec.from_json`]), or for a tuning-bank run the
        `{"spec": ..., "call": ...}` JSON it was sampled with."""
        bank_run = isinstance(spec, Mapping) and set(spec) == BANK_RUN_SPEC
        return cls(
            family=settings["family"],
            pipeline_class=settings["pipeline_class"],
            generator_tokenizer=settings.get("generator_tokenizer"),
            seed_space=overrides.pop("seed_space", "benchmark"),
            spec=canonical(dict(spec) if bank_run else spec_at(SamplerSpec.of(spec), nfe)),
            coefficients=canonical(coefficients),
            nfe=nfe,
            seed=seed,
            num_samples=overrides.pop("num_samples", settings["num_samples"]),
            batch_size=overrides.pop("batch_size", settings["batch_size"]),
            batch_seed=settings["batch_seed"],
            diversity_knob=settings["diversity_knob"],
            value=value,
            **overrides,
        )

    def label(self, sampler: str) -> str:
        """How errors and reports name the run."""
        return f"{sampler} at NFE {self.nfe}, seed {self.seed}" + (f", {self.value}" if self.value is not None else "")


# The settings a run's samples depend on beyond the run itself, as generations and reports name them: one list, read
# by the store, by the parts of a merged generation and by a report's rescoring.
RUN_SETTINGS = tuple(
    f.name for f in fields(RunKey) if f.name not in ("seed_space", "spec", "coefficients", "nfe", "seed", "value")
)


@dataclass(frozen=True)
class ScoreKey:
    """What decides a run's scores: its samples ([`samples_fingerprint`]), the evaluator as the report names it (its
    description, dtype included), the protocol, the scoring batch size, the maximum length and (`evaluate
    --context-size`) the chunk width."""

    samples: str
    evaluator_description: str
    protocol: str
    eval_batch_size: int | None
    max_length: int | None
    context_size: int | None = None
    kind: str = "run"  # "run": an [`evaluate_samples`] result; "bank": a tuning-bank run's [`BankRun`] scores


@dataclass(frozen=True)
class BankRunKey:
    """
    What decides a tuning-bank run's scores, and nothing else (a bank run is sampled and scored where it is tuned, so
    its samples are not stored, only its [`BankRun`]).

    Args:
        pipeline: the pipeline as it was loaded (its `name_or_path`: the folder or Hub id the command was given).
        seed, seed_space, num_samples, batch_size: the bank (`seed_space` is `"tuning"`).
        evaluator, evaluator_dtype, protocol: its scoring (the evaluator as the user named it, the dtype it ran in).
        nfe: the run's NFE.
        spec, call: the sampler spec and the pipeline-call arguments (a diversity knob), as [`canonical`] JSON.
    """

    pipeline: str
    seed: int
    seed_space: str
    num_samples: int
    batch_size: int
    evaluator: str | None
    evaluator_dtype: str
    protocol: str
    nfe: int
    spec: str
    call: str

    @classmethod
    def of(cls, bank: Mapping, nfe: int, spec: SamplerSpec | Mapping, call: Mapping) -> "BankRunKey":
        """The key of the run (`nfe`, `spec`, `call`) on the bank `bank` (its other fields by name); a JSON `spec` is
        read with [`SamplerSpec.from_json`]."""
        return cls(**bank, nfe=nfe, spec=canonical(SamplerSpec.of(spec).to_json()), call=canonical(dict(call)))

    def bank(self) -> dict:
        """The fields that name the bank (all but the run's NFE, spec and call)."""
        return {name: value for name, value in asdict(self).items() if name not in ("nfe", "spec", "call")}


BANK_RUN_FIELDS = {f.name for f in fields(BankRunKey)}


@dataclass
class StoredSamples:
    """A run's samples as stored: texts, generator ids, sampling seconds, and where they came from (`None`: sampled
    into this store; else the report they were imported from)."""

    texts: list[str]
    ids: list[list[int] | None]
    seconds: float
    source: str | None = None


def _digest(key) -> str:
    return hashlib.sha256(canonical(asdict(key)).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class StoreRecord:
    """
    A run store's account of a report (`--store`, [`RunStore.record`]), as the report's `store` holds it.

    Args:
        folder (`str`): the store.
        samples_read, samples_written, scores_read, scores_written (`int`): runs read from it and computed here.
        checked_runs (`Sequence[str]`): the runs read and checked again here.
        banks_read, banks_written (`int`): tuning-bank runs read and computed (0 where none: then not in the JSON).
        imported (`Sequence`, *optional*): the reports imported into the store (`--store-from`).
    """

    folder: str
    samples_read: int
    samples_written: int
    scores_read: int
    scores_written: int
    checked_runs: Sequence[str]
    banks_read: int = 0
    banks_written: int = 0
    imported: Sequence | None = None

    @classmethod
    def from_json(cls, data: Mapping) -> "StoreRecord":
        return cls(
            data["folder"],
            data["samples_read"],
            data["samples_written"],
            data["scores_read"],
            data["scores_written"],
            data["checked_runs"],
            data.get("banks_read", 0),
            data.get("banks_written", 0),
            data.get("imported"),
        )

    def to_json(self) -> dict:
        return {
            "folder": self.folder,
            "samples_read": self.samples_read,
            "samples_written": self.samples_written,
            "scores_read": self.scores_read,
            "scores_written": self.scores_written,
            "checked_runs": list(self.checked_runs),
            **{name: getattr(self, name) for name in ("banks_read", "banks_written") if getattr(self, name)},
            **({"imported": list(self.imported)} if self.imported else {}),
        }


@dataclass
class RunStore:
    """
    A store folder: `samples/<hash of RunKey>.json.gz`, `scores/<hash of ScoreKey>.json`, `sweeps/<hash>.json` (the
    settings of a `--generate-only` sweep part), `banks/<hash of BankRunKey>.json` (a scored tuning-bank run) and
    `store.json` naming the format. Counts what this process read and wrote ([`record`] is what a report says of
    it).

    Raises:
        `ValueError`: the folder is a file, or a non-empty folder that is not a store.
    """

    folder: Path
    samples_read: int = 0
    samples_written: int = 0
    scores_read: int = 0
    scores_written: int = 0
    banks_read: int = 0
    banks_written: int = 0
    imported: dict[str, str] = field(default_factory=dict)  # entry path -> report, for the spot checks
    checked: list[str] = field(default_factory=list)
    imports: list[dict] = field(default_factory=list)  # what [`import_report`] read into it
    _checked_samplers: set = field(default_factory=set, repr=False)

    def __post_init__(self):
        self.folder = Path(self.folder)
        header = self.folder / HEADER
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"--store {self.folder}: a file, not a folder. Give a folder (it is made if missing).")
        if header.exists():
            stored = _read_json(header, "its header")
            if stored.get("format") != STORE_FORMAT:
                raise ValueError(
                    f"--store {header}: format {stored.get('format')!r}, not {STORE_FORMAT!r}: this version reads "
                    "another store. Give a new folder."
                )
        # (a header another process is still writing is a hidden temporary file: this process writes its own)
        elif self.folder.exists() and any(not p.name.startswith(".") for p in self.folder.iterdir()):
            raise ValueError(
                f"--store {self.folder}: a folder that holds other files and no {HEADER}: not a run store. Give a "
                "new or empty folder."
            )
        else:
            _write_atomic(header, (json.dumps({"format": STORE_FORMAT}, indent=1) + "\n").encode())

    def samples_path(self, key: RunKey) -> Path:
        return self.folder / "samples" / f"{_digest(key)}.json.gz"

    def score_path(self, key: ScoreKey) -> Path:
        return self.folder / "scores" / f"{_digest(key)}.json"

    def samples(self, key: RunKey) -> StoredSamples | None:
        """The stored samples of the run `key`, or `None` when the store does not hold it."""
        path = self.samples_path(key)
        entry = _read_entry(path, key, gzipped=True)
        if entry is None:
            return None
        self.samples_read += 1
        return StoredSamples(entry["texts"], entry["ids"], entry["seconds"], entry.get("source"))

    def put_samples(self, key: RunKey, stored: StoredSamples) -> None:
        """Stores the samples of the run `key` (whole, or not at all)."""
        entry = {"format": STORE_FORMAT, "key": asdict(key), **asdict(stored)}
        _write_atomic(self.samples_path(key), gzip.compress(json.dumps(entry).encode(), mtime=0))
        if stored.source is None:
            self.samples_written += 1

    def sampled(self, key: RunKey, check: str, sample, sample_batch, rebuild) -> tuple[list[Sample], float]:
        """
        The run `key`'s samples and sampling seconds: read when stored (`rebuild(texts, ids)` gives them their
        provenance), else `sample()`d and stored first. The first run read for each `check` name (a sampler) is
        checked: `sample_batch()` draws its first batch here, which must equal the stored one.

        Raises:
            `ValueError`: the batch drawn here differs from the stored one (another machine, torch or weights drew it:
            its samples would not be matched with the ones drawn here).
        """
        stored = self.samples(key)
        if stored is None:
            samples, seconds = sample()
            self.put_samples(key, StoredSamples([s.text for s in samples], [s.ids for s in samples], seconds))
            return samples, seconds
        label = key.label(check)
        if check not in self._checked_samplers:
            fresh = sample_batch()
            if [(s.text, s.ids) for s in fresh] != list(zip(stored.texts, stored.ids, strict=True))[: len(fresh)]:
                raise ValueError(
                    f"--store: the first batch of {label}, sampled here, differs from {self.samples_path(key)}"
                    + (f" (imported from {stored.source})" if stored.source else "")
                    + ": another machine, torch or weights drew it, so its samples would not be matched with the "
                    "ones drawn here. Give another --store."
                )
            self._checked_samplers.add(check)
            self.checked.append(label)
        return rebuild(stored.texts, stored.ids), stored.seconds

    def put_sweep(self, identity: Mapping, sweep: Mapping, keys: Sequence[RunKey]) -> Path:
        """Stores a sampled sweep part's settings `sweep` (its runs without their samples) and the [`RunKey`] of each
        run, in order, under the hash of `identity` (what names the part: sampling it again replaces it)."""
        path = self.folder / SWEEPS / f"{hashlib.sha256(canonical(identity).encode()).hexdigest()[:32]}.json"
        entry = {"format": STORE_FORMAT, "sweep": sweep, "keys": [asdict(key) for key in keys]}
        _write_atomic(path, (json.dumps(entry, indent=1) + "\n").encode())
        return path

    def sweeps(self) -> list[tuple[Path, dict, list[RunKey]]]:
        """Every stored sweep part ([`put_sweep`]), in file-name order: its file, settings and runs' keys."""
        found = []
        for path in sorted((self.folder / SWEEPS).glob("*.json")):
            entry = _read_json(path, "a sampled sweep")
            if not isinstance(entry, dict) or entry.get("format") != STORE_FORMAT or "sweep" not in entry:
                raise ValueError(
                    f"--store: {path} is not a sampled sweep of this store: the file was edited or copied in. Delete "
                    "it and sample that part again with --generate-only."
                )
            found.append((path, entry["sweep"], [RunKey(**key) for key in entry["keys"]]))
        return found

    def bank_path(self, key: BankRunKey) -> Path:
        return self.folder / BANKS / f"{_digest(key)}.json"

    def bank_run(self, key: BankRunKey) -> BankRun | None:
        """The stored scores of the bank run `key`, or `None` when the store does not hold it."""
        entry = _read_entry(self.bank_path(key), key)
        if entry is None:
            return None
        self.banks_read += 1
        return BankRun.from_json(entry["run"])

    def put_bank_run(self, key: BankRunKey, run: BankRun) -> None:
        """Stores the scores of the bank run `key` (whole, or not at all)."""
        entry = {"format": STORE_FORMAT, "key": asdict(key), "run": run.to_json()}
        _write_atomic(self.bank_path(key), json.dumps(entry).encode())
        self.banks_written += 1

    def bank_runs(self) -> list[tuple[BankRunKey, BankRun]]:
        """Every stored bank run, in file-name order (readers of a bank: `benchmarks/bank_reading.py`).

        Raises:
            `ValueError`: an entry is not the run it is named after (edited or copied in), naming the file.
        """
        found = []
        for path in sorted((self.folder / BANKS).glob("*.json")):
            entry = _read_json(path, "a stored bank run")
            recorded = entry.get("key") if isinstance(entry, dict) else None
            key = BankRunKey(**recorded) if isinstance(recorded, dict) and set(recorded) == BANK_RUN_FIELDS else None
            if key is None or entry.get("format") != STORE_FORMAT or path != self.bank_path(key):
                raise ValueError(
                    f"--store: {path} is not the bank run it is named after (its recorded key is another run's, or "
                    "none): the file was edited or copied in. Delete it to do that work again."
                )
            found.append((key, BankRun.from_json(entry["run"])))
        return found

    def score(self, key: ScoreKey) -> dict | None:
        """The stored scores of `key` (as [`evaluate_samples`] returns them), or `None`."""
        entry = _read_entry(self.score_path(key), key)
        if entry is None:
            return None
        self.scores_read += 1
        if entry.get("source") is not None:
            self.imported[str(self.score_path(key))] = entry["source"]
        return entry["result"]

    def put_score(self, key: ScoreKey, result: Mapping, source: str | None = None) -> None:
        """Stores the scores of `key` (whole, or not at all)."""
        entry = {"format": STORE_FORMAT, "key": asdict(key), "source": source, "result": result}
        _write_atomic(self.score_path(key), json.dumps(entry).encode())
        if source is None:
            self.scores_written += 1

    def account(self) -> StoreRecord:
        """The report's account of the store: the folder, and how many runs were read and written here."""
        counts = (self.samples_read, self.samples_written, self.scores_read, self.scores_written)
        imported = list(self.imports) or None
        return StoreRecord(
            str(self.folder), *counts, list(self.checked), self.banks_read, self.banks_written, imported
        )

    def record(self) -> dict:
        """[`account`] as the report's `store` holds it."""
        return self.account().to_json()


@dataclass
class StoreScoring:
    """A store and the scoring that names its scores ([`ScoreKey`] less the samples): `scored(samples, score, run)`
    is a run's scores, read when stored, else `score()`d and stored first (the `parts` of [`evaluate_runs`]).

    Scores imported from a report ([`import_report`]) are checked once per scoring: the first one read is scored
    again here and must agree within [`SPOT_CHECK_TOLERANCE`] (the report does not record its `--max-length` or
    evaluator files)."""

    store: RunStore
    evaluator_description: str
    protocol: str
    eval_batch_size: int | None
    max_length: int | None
    context_size: int | None = None
    kind: str = "run"
    checked_difference: float | None = None

    def key(self, samples: Sequence[Sample]) -> ScoreKey:
        return ScoreKey(
            samples_fingerprint(samples),
            self.evaluator_description,
            self.protocol,
            self.eval_batch_size,
            self.max_length,
            self.context_size,
            self.kind,
        )

    def scored(self, samples: Sequence[Sample], score, run: str, nlls=None) -> dict:
        """`samples`' scores (`nlls(scores)`: their per-sample NLL sums, for the check of imported scores)."""
        key = self.key(samples)
        stored = self.store.score(key)
        if stored is None:
            result = score()
            self.store.put_score(key, result)
            return result
        source = self.store.imported.get(str(self.store.score_path(key)))
        if source is not None and self.checked_difference is None:
            fresh = score()
            nlls = nlls or (lambda result: [r["nll_sum"] for r in result["per_sample"]])
            self.checked_difference = spot_check(nlls(stored), nlls(fresh), source, run)
            self.store.checked.append(f"{run} (scores of {source})")
        return stored


def spot_check(stored: Sequence[float], fresh: Sequence[float], source: str, run: str) -> float:
    """The largest relative difference between an imported run's per-sample NLLs and the same run's scored here (NaN
    where both left a sample unscored); raises when it exceeds [`SPOT_CHECK_TOLERANCE`] (other scoring options)."""
    worst = 0.0
    for old, new in zip(stored, fresh, strict=True):
        if math.isnan(old) and math.isnan(new):
            continue
        if math.isnan(old) or math.isnan(new):  # scored on one side only
            worst = math.inf
            break
        worst = max(worst, abs(old - new) / max(abs(old), abs(new), 1e-12))
    if worst > SPOT_CHECK_TOLERANCE:
        raise ValueError(
            f"--store: run {run} scored here differs from its scores imported from {source} by {worst:.2g} "
            "(relative NLL): that report was scored with other options (--max-length, the evaluator's files). Import "
            "it into another store, or score without it."
        )
    return worst


def open_store(store: "str | os.PathLike | RunStore | None") -> RunStore | None:
    """`store` as a [`RunStore`] (a folder is opened, made if missing)."""
    if store is None or isinstance(store, RunStore):
        return store
    return RunStore(Path(store))


def _read_json(path: Path, what: str, gzipped: bool = False):
    try:
        data = gzip.decompress(path.read_bytes()) if gzipped else path.read_bytes()
        return json.loads(data)
    except (OSError, EOFError, gzip.BadGzipFile, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(
            f"--store: {path} ({what}) cannot be read ({error}); delete it to do that work again."
        ) from error


def _read_entry(path: Path, key, gzipped: bool = False) -> dict | None:
    """The entry at `path`, checked to be `key`'s; `None` when there is none."""
    if not path.exists():
        return None
    entry = _read_json(path, "a stored run", gzipped)
    if not isinstance(entry, dict) or entry.get("format") != STORE_FORMAT or entry.get("key") != asdict(key):
        differ = []
        if isinstance(entry, dict) and isinstance(entry.get("key"), dict):
            differ = [name for name, value in asdict(key).items() if entry["key"].get(name) != value]
        detail = f" (its {', '.join(differ)} differ)" if differ else ""
        raise ValueError(
            f"--store: {path} is not the run it is named after{detail}: the file was edited or copied in. Delete it "
            "to do that work again."
        )
    return entry


def _write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary name beside `path`, then renames it into place: readers see all or nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staged = path.with_name(f".{path.name}.{os.getpid()}.partial")
    staged.write_bytes(data)
    os.replace(staged, path)
