"""A run store as the carrier of a benchmark sweep from the machine that samples to the machine that scores
(`untied-sc benchmark PIPELINE --generate-only --store DIR`, then `untied-sc benchmark --store DIR`): [`store_sweep`]
records a [`generate_sweep`] result's settings beside its samples, [`read_stored_sweeps`] gives back the sweep, its
parts merged ([`merge_generations`]) when several commands sampled disjoint NFEs of it.
"""

import json
from dataclasses import replace
from pathlib import Path

from untied_sc.generation import run_samples

from ..runs.store import RunKey, RunStore, StoredSamples
from .generation_record import BankSample, Generation
from .records import RunRecord
from .sweep_parts import SHARED_SETTINGS, merge_generations


def sweep_run_key(generation: Generation, run: RunRecord | BankSample) -> RunKey:
    """The [`RunKey`] of one run of a [`generate_sweep`] result: its sampler's spec and coefficients at its NFE; for a
    tuning-bank run of `--experiment baselines --tune-here`, its spec and call arguments on the tuning seeds."""
    settings = generation.run_settings
    if isinstance(run, BankSample):
        spec = {"spec": run.spec.to_json(), "call": dict(run.call)}
        return RunKey.of(settings, spec, None, run.nfe, run.seed, seed_space="tuning", num_samples=run.num_samples)
    coefficients = generation.coefficients_at(run.sampler, run.nfe)
    return RunKey.of(settings, generation.samplers[run.sampler], coefficients, run.nfe, run.seed, run.value)


def store_sweep(store: RunStore, generation: Generation) -> Path:
    """
    Records `generation` (a [`generate_sweep`] result) in `store`: every run's samples under its [`sweep_run_key`]
    (already there when the sweep sampled into the store) and the sweep's settings, its runs without their samples,
    under the part it is (its shared settings and NFEs: sampling the same part again replaces it). Returns the file.

    Raises:
        `ValueError`: the store holds other samples under a run's key (the store mixes two machines' draws).
    """
    keys = []
    for run in generation.sampled_runs:
        key = sweep_run_key(generation, run)
        texts, ids = [s.text for s in run.samples], [s.ids for s in run.samples]
        stored = store.samples(key)
        if stored is None:
            store.put_samples(key, StoredSamples(texts, ids, run.seconds))
        elif (stored.texts, stored.ids) != (texts, ids):
            raise ValueError(
                f"--store: {store.samples_path(key)} holds other samples of {key.label(run.sampler)} than this "
                "sweep drew: another machine, torch or weights sampled it. Give another --store."
            )
        keys.append(key)
    data = generation.to_json()
    identity = {key: data.get(key) for key in (*SHARED_SETTINGS, "nfe", "diversity_nfe", "knob_tuning")}
    return store.put_sweep(identity, data, keys)


def read_stored_sweeps(store: RunStore) -> Generation:
    """
    The sweep sampled into `store` by `--generate-only`, each run with its samples read back; several parts (one per
    `--generate-only` command) are merged as [`merge_generations`] merges them, and its errors name the store's files.

    Raises:
        `ValueError`: the store holds no sweep, a run's samples are missing or incomplete, or the parts are not of one
        sweep.
    """
    parts, names = [], []
    for path, sweep, keys in store.sweeps():
        part = Generation.from_json(sweep, f"--store: {path}")
        runs = []
        for run, key in zip(part.sampled_runs, keys, strict=True):
            stored = store.samples(key)
            if stored is None:
                raise ValueError(
                    f"--store: {path} lists {key.label(run.sampler)}, whose samples {store.samples_path(key)} "
                    "the store does not hold (deleted or not copied). Sample that part again with --generate-only."
                )
            expected = run.num_samples if isinstance(run, BankSample) else part.num_samples
            if len(stored.texts) != expected or len(stored.ids) != expected:
                raise ValueError(
                    f"--store: {store.samples_path(key)} holds {len(stored.texts)} samples of "
                    f"{key.label(run.sampler)}, not the {expected} that {path} lists: the entry was edited. Delete "
                    "it and sample that part again with --generate-only."
                )
            value = None if isinstance(run, BankSample) else run.value
            samples = run_samples(
                stored.texts, stored.ids, run.seed, part.batch_size, run.sampler, run.nfe,
                **{part.diversity_knob: value},
            )  # fmt: skip
            runs.append(replace(run, samples=samples))
        count = len(part.runs)
        parts.append(replace(part, runs=tuple(runs[:count]), bank_runs=tuple(runs[count:])))
        names.append(str(path))
    if not parts:
        raise ValueError(
            f"--store {store.folder}: holds no sampled sweep to score. Sample one into it with `untied-sc benchmark "
            f"PIPELINE --generate-only --store {store.folder}`, or name a PIPELINE to sample and score here."
        )
    return merge_generations(parts, names)


def stored_model(folder) -> str | None:
    """The model name of the first sweep stored in `folder` (what the scoring command's outputs are named after), or
    `None` when it holds none yet (the scoring says why)."""
    for path in sorted((Path(folder) / "sweeps").glob("*.json")):
        try:
            return json.loads(path.read_text())["sweep"]["model"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
    return None
