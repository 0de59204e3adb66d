"""An earlier report's samples and scores read into a run store (`untied-sc benchmark --store DIR --store-from
REPORT_JSON`), so that a sweep that adds a temperature, a sampler or an NFE part to a report samples and scores only
its new runs.

Each run of the report is stored under the [`RunKey`] its settings give (the report's family, pipeline class,
tokenizer, sample count, batch size and seeding, the sampler's spec and coefficients at the run's NFE, its seed and
knob value): a sweep with another of those settings computes other keys and reads none of it. Its scores are stored
under the [`ScoreKey`] of its samples, the report's evaluator description and protocol, and the scoring's
`--eval-batch-size` and `--max-length` (a report does not record those): the first imported score a scoring reads is
scored again there and must agree ([`StoreScoring`]), and the first batch of each sampler read is sampled again
([`RunStore.sampled`]). The tuning bank of `--experiment baselines`, not in a report's samples file, comes with its
scores alone (`bank_scores`, by [`samples_fingerprint`]).
"""

import os
from pathlib import Path

from untied_sc.generation import Sample, SamplerSpec, read_samples
from untied_sc.input_checks import read_benchmark_report
from untied_sc.per_nfe import read_steps_table

from ..runs.store import RunKey, RunStore, ScoreKey, StoredSamples, samples_fingerprint
from .records import RunRecord, report_knob, report_records


def _refuse_without_sample_entropies(records: list[RunRecord], path: str | os.PathLike) -> None:
    """Refuses a report whose runs lack per-sample entropies: a stored score stands for a fresh scoring, and the
    equal-entropy intervals of a report scored from it would resample entropies it does not hold."""
    for record in records:
        if record.scores.per_sample.entropy is None:
            raise ValueError(
                f"--store-from: {path}'s run {record.label()} holds no per-sample entropies (it was scored before "
                "they were kept), so its scores cannot stand for a fresh scoring. Score its samples again instead."
            )


def read_report_runs(
    path: str | os.PathLike, option: str, remedy: str = ""
) -> tuple[dict, list[RunRecord], list[list[Sample]]]:
    """
    A benchmark report (`<model>.json`), its runs ([`report_records`]) and the samples of each run, in the report's
    order, from its samples file. The file may hold runs the report does not: a rescoring of part of a larger
    report's runs shares that report's file (samples are stored once).

    Raises:
        `ValueError`: the file is not a benchmark report, its samples file is missing (`remedy` ends that error), or
        it does not hold each run's samples (`option`, the argument that named the report, begins every error).
    """
    path = Path(path)
    report = read_benchmark_report(path, option, remedy)
    knob = report_knob(report)
    by_run: dict[tuple, list[Sample]] = {}
    for sample in read_samples(path.parent / report["samples_file"]):
        by_run.setdefault((sample.sampler, sample.nfe, sample.seed, sample.extra.get(knob)), []).append(sample)
    records, runs = report_records(report), []
    for record in records:
        run, count = by_run.get(record.key, []), record.scores.num_samples
        if len(run) != count:
            raise ValueError(
                f"{option}: {report['samples_file']} holds {len(run)} samples of {path}'s run {record.key} (sampler, "
                f"NFE, seed, knob), not its {count}: one of the two was edited or replaced."
            )
        runs.append(run)
    return report, records, runs


def import_report(
    store: RunStore, path: str | os.PathLike, eval_batch_size: int | None = None, max_length: int | None = None
) -> dict:
    """
    Reads a benchmark report's runs (samples, sampling seconds, scores) and its tuning bank's scores into `store`;
    entries the store holds already are kept. Returns what was imported (`report`, `runs`, `bank_runs`), which the
    store's record lists.

    Raises:
        `ValueError`: the file is not a benchmark report or its samples file is missing or incomplete (a report
        written without its samples cannot lend them: nothing shows which samples its scores belong to).
    """
    report, records, runs = read_report_runs(path, "--store-from", " Give a report with its samples file beside it.")
    source = str(path)
    settings = {**report, "diversity_knob": report_knob(report)}
    description, protocol = report.get("evaluator_description"), report["protocol"]
    by_sampler = report.get("coefficients") or {}
    _refuse_without_sample_entropies(records, path)
    for record, samples in zip(records, runs, strict=True):
        coefficients = read_steps_table(by_sampler.get(record.sampler), "coefficients").get(record.nfe)
        spec = SamplerSpec.from_json(report["samplers"][record.sampler], f"samplers[{record.sampler!r}]")
        key = RunKey.of(settings, spec, coefficients, record.nfe, record.seed, record.value)
        if not store.samples_path(key).exists():
            texts, ids = [s.text for s in samples], [s.ids for s in samples]
            store.put_samples(key, StoredSamples(texts, ids, record.seconds, source))
        scores = ScoreKey(samples_fingerprint(samples), description, protocol, eval_batch_size, max_length)
        if not store.score_path(scores).exists():
            store.put_score(scores, record.scores.to_result(), source)
    bank = report.get("bank_scores", {})
    for fingerprint, scores in bank.items():
        # a bank run's per-sample records (the equal-entropy search); reports of the fixed-grid rule keep mean NLLs
        # alone, which the search cannot read: those are scored again
        if isinstance(scores, dict):
            key = ScoreKey(fingerprint, description, protocol, eval_batch_size, None, kind="bank")
            if not store.score_path(key).exists():
                store.put_score(key, dict(scores), source)
    imported = {"report": source, "runs": len(runs), "bank_runs": sum(isinstance(s, dict) for s in bank.values())}
    store.imports.append(imported)
    return imported
