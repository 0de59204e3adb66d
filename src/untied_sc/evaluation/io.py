"""Samples files and scoring them: the data behind `untied-sc evaluate`.

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
import math
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .evaluator import load_evaluator
from .metrics import (
    distinct_n,
    generative_perplexity,
    longest_repeated_run,
    mean_unigram_entropy,
    token_distinct_n,
    token_repetition,
    unigram_entropy,
    word_repetition,
)
from .statistics import paired_comparison


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


def _finite_or_none(value: float) -> float | None:
    return None if value is None or math.isnan(value) else value


def evaluate_samples(
    samples: str | os.PathLike | Sequence[Sample],
    evaluator="smollm2-135m",
    protocol: str = "elf",
    batch_size: int | None = None,
    max_length: int | None = None,
    context_size: int | None = None,
    repetition_n: int = 4,
    distinct: Sequence[int] = (1, 2, 3, 4),
    **evaluator_kwargs,
) -> dict:
    """Scores a samples file (or a list of [`Sample`]) and returns a JSON-ready result dict.

    Args:
        samples: a JSONL path (see the module docstring) or a list of [`Sample`].
        evaluator: an evaluator name for [`load_evaluator`] (default `"smollm2-135m"`), or a `(model, tokenizer)` pair.
        protocol (`str`, defaults to `"elf"`): `"elf"` or `"langflow"` (see [`sample_nlls`]).
        batch_size, max_length, context_size: passed to [`sample_nlls`] (`batch_size=None`: by length, see there).
        repetition_n (`int`, defaults to 4): n of the word and token Rep-n.
        distinct (`Sequence[int]`, defaults to `(1, 2, 3, 4)`): the n of each distinct-n (words and token ids).
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        `dict` with `protocol`, `evaluator`, counts, `gen_ppl`, `nll_per_token`, `num_tokens`, `entropy` (the
        protocol's own: evaluator ids for `"elf"`, generator ids for `"langflow"`, `None` when the file has no ids),
        both entropies, `rep_<n>`, `distinct_<n>` (word metrics over the samples the protocol scores), the subword
        twins on generator ids `token_rep_<n>`, `token_distinct_<n>` and `longest_repeat` (mean over samples of
        [`longest_repeated_run`]; `None` without ids), and `per_sample` (one dict per sample, in file order, with its
        provenance and scores, for paired comparisons).
    """
    if isinstance(samples, (str, os.PathLike)):
        samples = read_samples(samples)
    if isinstance(evaluator, (str, os.PathLike)):
        evaluator_name = str(evaluator)
        model, tokenizer = load_evaluator(evaluator, **evaluator_kwargs)
    else:
        model, tokenizer = evaluator
        evaluator_name = getattr(model, "name_or_path", None) or type(model).__name__
    result = generative_perplexity(
        [sample.text for sample in samples],
        model,
        tokenizer,
        protocol=protocol,
        batch_size=batch_size,
        max_length=max_length,
        context_size=context_size,
    )
    return _summary(samples, result, protocol, evaluator_name, repetition_n, distinct)


def _summary(
    samples: Sequence[Sample], result, protocol: str, evaluator_name: str, repetition_n: int, distinct
) -> dict:
    """[`evaluate_samples`]'s result from the evaluator's scores of `samples` (`result`, [`generative_perplexity`]'s):
    everything but the network call, so that runs with the same texts share one."""
    texts = [sample.text for sample in samples]
    scores = result.per_sample
    scored = scores.scored.tolist()
    scored_texts = [text for text, keep in zip(texts, scored, strict=True) if keep]
    evaluator_entropy = mean_unigram_entropy(
        [ids for ids, keep in zip(scores.evaluator_ids, scored, strict=True) if keep]
    )[0]
    has_ids = all(sample.ids is not None for sample in samples)
    generator_entropy = mean_unigram_entropy([sample.ids for sample in samples])[0] if has_ids else float("nan")
    mean_nll = scores.mean_nll.tolist()
    per_sample = []
    for i, sample in enumerate(samples):
        record = _provenance(sample)
        evaluator_h = _finite_or_none(unigram_entropy(scores.evaluator_ids[i])) if scored[i] else None
        generator_h = _finite_or_none(unigram_entropy(sample.ids)) if sample.ids is not None else None
        record.update(
            index=i,
            scored=scored[i],
            nll_sum=float(scores.nll_sum[i]),
            num_tokens=int(scores.num_tokens[i]),
            mean_nll=_finite_or_none(mean_nll[i]),
            entropy=evaluator_h if protocol == "elf" else generator_h,  # the protocol's, as the run's mean
            entropy_evaluator_ids=evaluator_h,
            entropy_generator_ids=generator_h,
            **{f"rep_{repetition_n}": word_repetition(sample.text, repetition_n)},
        )
        if sample.ids is not None:
            record[f"token_rep_{repetition_n}"] = token_repetition(sample.ids, repetition_n)
            record["longest_repeat"] = longest_repeated_run(sample.ids)
        per_sample.append(record)
    official_entropy = evaluator_entropy if protocol == "elf" else generator_entropy
    ids = [sample.ids for sample in samples] if has_ids else None
    return {
        "protocol": protocol,
        "evaluator": evaluator_name,
        "num_samples": len(samples),
        "num_scored": sum(scored),
        "num_dropped": len(samples) - sum(scored),
        **_run_provenance(samples),
        "gen_ppl": result.gen_ppl,
        "nll_per_token": result.nll_per_token,
        "num_tokens": result.num_tokens,
        "entropy": _finite_or_none(official_entropy),
        "entropy_evaluator_ids": _finite_or_none(evaluator_entropy),
        "entropy_generator_ids": _finite_or_none(generator_entropy),
        f"rep_{repetition_n}": sum(word_repetition(t, repetition_n) for t in scored_texts) / max(len(scored_texts), 1),
        **{f"distinct_{n}": distinct_n(scored_texts, n) for n in distinct},
        f"token_rep_{repetition_n}": None
        if ids is None
        else sum(token_repetition(row, repetition_n) for row in ids) / max(len(ids), 1),
        **{f"token_distinct_{n}": None if ids is None else token_distinct_n(ids, n) for n in distinct},
        "longest_repeat": None if ids is None else sum(map(longest_repeated_run, ids)) / max(len(ids), 1),
        "per_sample": per_sample,
    }


def _run_provenance(samples: Sequence[Sample]) -> dict:
    """The samplers and NFE a run's samples come from, as its result names them."""
    return {
        "samplers": sorted({s.sampler for s in samples if s.sampler is not None}),
        "nfe": sorted({s.nfe for s in samples if s.nfe is not None}),
    }


def _provenance(sample: Sample) -> dict:
    """Where a sample comes from, as its per-sample record begins: its seed, batch, sampler and NFE that are set."""
    return {key: getattr(sample, key) for key in PROVENANCE_KEYS if getattr(sample, key) is not None}


def with_provenance(result: dict, samples: Sequence[Sample]) -> dict:
    """[`evaluate_samples`]'s `result` of other runs' samples with the same texts and ids, as `samples`' own: the
    samplers, NFE and each sample's provenance are `samples`', every score and statistic is the result's."""
    if len(result["per_sample"]) != len(samples):
        raise ValueError(f"A result of {len(result['per_sample'])} samples cannot be that of {len(samples)}.")
    per_sample = [
        {**_provenance(sample), **{k: v for k, v in record.items() if k not in PROVENANCE_KEYS}}
        for sample, record in zip(samples, result["per_sample"], strict=True)
    ]
    return {**result, **_run_provenance(samples), "per_sample": per_sample}


def samples_key(samples: Sequence[Sample]) -> tuple:
    """What makes two runs the same for the evaluator: their texts and token ids, in order."""
    return tuple((sample.text, tuple(sample.ids or ())) for sample in samples)


def run_key(sample: Sample) -> dict:
    """The run a sample belongs to: its values of [`RUN_KEYS`] (sampler, NFE, seed, diversity knob) that are set."""
    record = sample.to_dict()
    return {key: record[key] for key in RUN_KEYS if record.get(key) is not None}


def group_runs(samples: Sequence[Sample]) -> list[tuple[dict, list[Sample]]]:
    """The samples grouped by [`run_key`], in order of first appearance: `(key, samples of that run)` pairs."""
    groups: dict[tuple, tuple[dict, list[Sample]]] = {}
    for sample in samples:
        key = run_key(sample)
        groups.setdefault(tuple(sorted(key.items())), (key, []))[1].append(sample)
    return list(groups.values())


def evaluate_runs(
    samples: str | os.PathLike | Sequence[Sample],
    evaluator="smollm2-135m",
    state=None,
    progress: bool = False,
    parts=None,
    **options,
) -> list[dict]:
    """Scores every run of a samples file apart (a benchmark report's `<report>.samples.jsonl.gz` holds many).

    Samples are grouped by [`run_key`] in file order; each group is scored with [`evaluate_samples`] (`options` are its
    keyword arguments; `cache_dir`, `device`, `dtype` load a named evaluator once), so each result equals the report's
    record of that run. A run whose samples (texts and ids) repeat an earlier run's (a comparison sampler that its
    tuning switched off draws official's samples) is not passed through the evaluator again: its result is the earlier
    run's, with its own provenance ([`with_provenance`]).

    With a `state` of several processes ([`untied_sc.distributed.process_state`], e.g. under `accelerate launch` or
    `torchrun`), the distinct runs are dealt out by index (run r to process r mod N), each scored whole by one process,
    and every process receives all scores in run order: the results equal one process's, whatever N. `progress` shows
    a bar over the (main process's) runs to score.

    `parts` keeps each distinct run's result as soon as it is scored, so that a stopped scoring resumes: any object
    with `scored(samples, score, run) -> dict` that returns the kept result of those samples, or else calls `score()`
    and keeps what it returns (`untied-sc evaluate --score-parts-dir` gives a folder of parts,
    [`untied_sc.experiments.score_parts.ScoreParts`]).
    Returns one dict per run: its key under `"run"`, then the [`evaluate_samples`] result.
    """
    from ..distributed import gather_in_order, main_process_progress, shard_batches

    if isinstance(samples, (str, os.PathLike)):
        samples = read_samples(samples)
    name = None
    if isinstance(evaluator, (str, os.PathLike)):
        name = str(evaluator)
        loading = {key: options.pop(key) for key in ("cache_dir", "device", "dtype") if key in options}
        evaluator = load_evaluator(evaluator, **loading)
    model, tokenizer = evaluator
    evaluator_name = name or getattr(model, "name_or_path", None) or type(model).__name__
    summary = {"repetition_n": options.pop("repetition_n", 4), "distinct": options.pop("distinct", (1, 2, 3, 4))}
    protocol = options.get("protocol", "elf")
    groups = group_runs(samples)
    holders: dict[tuple, list[int]] = {}  # [`samples_key`] -> the runs that hold those samples, by index in `groups`
    for index, (_, group) in enumerate(groups):
        holders.setdefault(samples_key(group), []).append(index)
    distinct = list(holders.values())

    def score_distinct(runs: list[int]) -> list[dict]:
        key, first = groups[runs[0]]

        def score() -> dict:
            scores = generative_perplexity([sample.text for sample in first], model, tokenizer, **options)
            return _summary(first, scores, protocol, evaluator_name, **summary)

        label = ", ".join(f"{k} {v}" for k, v in key.items())
        result = score() if parts is None else parts.scored(first, score, label)
        return [with_provenance(result, groups[index][1]) for index in runs]

    mine = {
        index: score_distinct(distinct[index])
        for index in main_process_progress(shard_batches(len(distinct), state), state, progress, desc="scoring runs")
    }
    by_run: dict[int, dict] = {}
    for runs, results in zip(distinct, gather_in_order(mine, state), strict=True):
        by_run.update(zip(runs, results, strict=True))
    return [
        {"run": key, **by_run[index], **({"evaluator": name} if name else {})} for index, (key, _) in enumerate(groups)
    ]


def compare_results(
    baseline: dict,
    candidate: dict,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = None,
    unit: str = "sample",
) -> dict:
    """Paired comparison of two [`evaluate_samples`] results (baseline = a, candidate = b), pairing samples by order.

    The two files must hold the same number of samples and, where both record seeds, the same seed at each position.
    `unit` is the bootstrap's resampling unit: `"sample"`, or `"batch"` (ELF: a batch shares one time grid), which
    needs every sample's `seed` and `batch`. Returns [`PairedComparison`]'s fields as a dict (Δ = candidate - baseline
    per-token NLL) and the unit.
    """
    a, b = baseline["per_sample"], candidate["per_sample"]
    if len(a) != len(b):
        raise ValueError(f"Paired files must hold the same number of samples, got {len(a)} and {len(b)}.")
    for first, second in zip(a, b, strict=True):
        if "seed" in first and "seed" in second and first["seed"] != second["seed"]:
            raise ValueError(
                f"Sample {first['index']} has seed {first['seed']} in the baseline but {second['seed']} in the "
                "candidate; write both files in the same seed order."
            )
    if unit == "batch":
        missing = [r["index"] for r in a if "seed" not in r or "batch" not in r]
        if missing:
            raise ValueError(
                f"Resampling whole batches needs each sample's 'seed' and 'batch'; samples {missing[:5]} lack them. "
                "Write them (a benchmark's samples files do) or resample single samples (unit 'sample')."
            )
        clusters, strata = [(r["seed"], r["batch"]) for r in a], [r["seed"] for r in a]
    elif unit == "sample":
        clusters, strata = None, None
    else:
        raise ValueError(f"`unit` must be 'sample' or 'batch', got {unit!r}.")
    nan = float("nan")
    comparison = paired_comparison(
        [nan if r["mean_nll"] is None else r["mean_nll"] for r in a],
        [nan if r["mean_nll"] is None else r["mean_nll"] for r in b],
        num_resamples=num_resamples,
        confidence=confidence,
        generator=generator,
        clusters=clusters,
        strata=strata,
    )
    return {**vars(comparison), "resampling_unit": unit}
