"""A run store as the carrier of a benchmark sweep from the machine that samples to the machine that scores
(`untied-sc benchmark PIPELINE --generate-only --store DIR`, then `untied-sc benchmark --store DIR`): [`store_sweep`]
records a [`generate_sweep`] result's settings beside its samples, [`read_stored_sweeps`] gives back the sweep, its
parts merged ([`merge_generations`]) when several commands sampled disjoint NFEs of it.
"""

import json
from collections.abc import Mapping
from pathlib import Path

from untied_sc.generation import SamplerSpec, run_samples
from untied_sc.per_nfe import read_steps_table

from ..runs.store import RunKey, RunStore, StoredSamples
from .sweep_parts import SHARED_SETTINGS, merge_generations


def sweep_run_key(generation: Mapping, run: Mapping) -> RunKey:
    """The [`RunKey`] of one run of a [`generate_sweep`] result: its sampler's spec and coefficients at its NFE; for a
    tuning-bank run of `--experiment baselines --tune-here`, its spec and call arguments on the tuning seeds."""
    if "bank_key" in run:
        spec = {"spec": run["spec"], "call": run["call"]}
        return RunKey.of(
            generation, spec, None, run["nfe"], run["seed"], seed_space="tuning", num_samples=run["num_samples"]
        )
    coefficients = read_steps_table(generation["coefficients"].get(run["sampler"], {}), "coefficients")
    knob = generation["diversity_knob"]
    spec = SamplerSpec.from_json(generation["samplers"][run["sampler"]], f"samplers[{run['sampler']!r}]")
    return RunKey.of(generation, spec, coefficients.get(run["nfe"]), run["nfe"], run["seed"], run[knob])


def store_sweep(store: RunStore, generation: Mapping) -> Path:
    """
    Records `generation` (a [`generate_sweep`] result) in `store`: every run's samples under its [`sweep_run_key`]
    (already there when the sweep sampled into the store) and the sweep's settings, its runs without their samples,
    under the part it is (its shared settings and NFEs: sampling the same part again replaces it). Returns the file.

    Raises:
        `ValueError`: the store holds other samples under a run's key (the store mixes two machines' draws).
    """
    keys = []
    for run in generation["runs"]:
        key = sweep_run_key(generation, run)
        texts, ids = [s.text for s in run["samples"]], [s.ids for s in run["samples"]]
        stored = store.samples(key)
        if stored is None:
            store.put_samples(key, StoredSamples(texts, ids, run["seconds"]))
        elif (stored.texts, stored.ids) != (texts, ids):
            raise ValueError(
                f"--store: {store.samples_path(key)} holds other samples of {key.label(run['sampler'])} than this "
                "sweep drew: another machine, torch or weights sampled it. Give another --store."
            )
        keys.append(key)
    header = {key: value for key, value in generation.items() if key != "runs"}
    header["runs"] = [{k: v for k, v in run.items() if k != "samples"} for run in generation["runs"]]
    identity = {key: generation.get(key) for key in (*SHARED_SETTINGS, "nfe", "diversity_nfe", "knob_tuning")}
    return store.put_sweep(identity, header, keys)


def read_stored_sweeps(store: RunStore) -> dict:
    """
    The sweep sampled into `store` by `--generate-only`, each run with its samples read back; several parts (one per
    `--generate-only` command) are merged as [`merge_generations`] merges them, and its errors name the store's files.

    Raises:
        `ValueError`: the store holds no sweep, a run's samples are missing or incomplete, or the parts are not of one
        sweep.
    """
    parts, names = [], []
    for path, sweep, keys in store.sweeps():
        knob = sweep["diversity_knob"]
        for run, key in zip(sweep["runs"], keys, strict=True):
            stored = store.samples(key)
            if stored is None:
                raise ValueError(
                    f"--store: {path} lists {key.label(run['sampler'])}, whose samples {store.samples_path(key)} "
                    "the store does not hold (deleted or not copied). Sample that part again with --generate-only."
                )
            expected = run.get("num_samples", sweep["num_samples"])  # a tuning bank's runs have their own size
            if len(stored.texts) != expected or len(stored.ids) != expected:
                raise ValueError(
                    f"--store: {store.samples_path(key)} holds {len(stored.texts)} samples of "
                    f"{key.label(run['sampler'])}, not the {expected} that {path} lists: the entry was edited. Delete "
                    "it and sample that part again with --generate-only."
                )
            run["samples"] = run_samples(
                stored.texts, stored.ids, run["seed"], sweep["batch_size"], run["sampler"], run["nfe"],
                **{knob: run[knob]},
            )  # fmt: skip
        parts.append(sweep)
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
