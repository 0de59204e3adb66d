"""The run store (`--store`): a stopped sweep or scoring resumes from it, doing only the missing work, and writes the
report a whole run writes; a run with another setting is not read; a half-written or mismatching entry is never read.
On the tiny golden LangFlow pipeline under a tiny evaluator."""

import gzip
import json
from dataclasses import replace

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc.generation import SamplerSpec
from untied_sc_lab.experiments import ScoringSettings, SweepSettings, generate_sweep, run_sweep, score_sweep, sweep
from untied_sc_lab.runs import BankRun
from untied_sc_lab.runs.store import RUN_SETTINGS, BankRunKey, RunKey, RunStore, ScoreKey, StoredSamples

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


TINY = SweepSettings(nfe=[8], seeds=[0, 1], num_samples=4, batch_size=2)
WITH_DIVERSITY = replace(TINY, diversity_values=[0.5])
OPTIONS = {"progress": False, "name": "tiny"}
SETTINGS = {
    "family": "langflow",
    "pipeline_class": "LangFlowPipeline",
    "generator_tokenizer": "tiny",
    "num_samples": 4,
    "batch_size": 2,
    "batch_seed": sweep.BATCH_SEED_RULE,
    "diversity_knob": "temperature",
}


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


@pytest.fixture(scope="module")
def pipe(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    return pipe


@pytest.fixture(scope="module")
def generation(pipe):
    return generate_sweep(pipe, WITH_DIVERSITY, command="pytest", **OPTIONS)


@pytest.fixture
def counted(monkeypatch):
    """The batches sampled, counted through the sweep's `generate`."""
    calls = []
    generate = sweep.generate

    def counting(pipe, n, seed, num_samples, batch_size, **kwargs):
        calls.append(num_samples // batch_size)
        return generate(pipe, n, seed, num_samples, batch_size, **kwargs)

    monkeypatch.setattr(sweep, "generate", counting)
    return calls


def _score(generation, evaluator, max_length=None, **kwargs) -> dict:
    scoring = ScoringSettings(evaluator, max_length=max_length, num_resamples=20)
    return score_sweep(generation, scoring, progress=False, **kwargs)


def _without_timing(results: dict) -> dict:
    drop = ("scoring_seconds", "wall_seconds", "store")
    return json.loads(json.dumps({key: value for key, value in results.items() if key not in drop}))


def _entries(store, kind: str) -> list:
    folder = store / kind
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


class Stop(Exception):
    pass


def test_the_run_key_is_the_one_list_of_run_settings():
    assert RUN_SETTINGS == (
        "family",
        "pipeline_class",
        "generator_tokenizer",
        "num_samples",
        "batch_size",
        "batch_seed",
        "diversity_knob",
    )
    key = RunKey.of(SETTINGS, {"scheduler": "untied"}, {"eta_r": 0.5}, 8, 0)
    assert key == RunKey.of(dict(reversed(list(SETTINGS.items()))), {"scheduler": "untied"}, {"eta_r": 0.5}, 8, 0)
    assert key != RunKey.of({**SETTINGS, "batch_size": 4}, {"scheduler": "untied"}, {"eta_r": 0.5}, 8, 0)
    assert key != RunKey.of(SETTINGS, {"scheduler": "untied"}, {"eta_r": 0.25}, 8, 0)
    assert key != RunKey.of(SETTINGS, {"scheduler": "untied"}, {"eta_r": 0.5}, 8, 0, seed_space="tuning")
    # a tuned comparison sampler's knobs at this NFE only
    knobs = {"scheduler": "momentum", "knobs_by_steps": {"8": {"beta": 0.5}, "16": {"beta": 0.7}}}
    other = {"scheduler": "momentum", "knobs_by_steps": {"8": {"beta": 0.5}, "16": {"beta": 0.9}}}
    assert RunKey.of(SETTINGS, knobs, None, 8, 0) == RunKey.of(SETTINGS, other, None, 8, 0)
    assert RunKey.of(SETTINGS, knobs, None, 16, 0) != RunKey.of(SETTINGS, other, None, 16, 0)
    # at an NFE it was not tuned at, the run is named with no knobs (sampling it there is refused)
    untuned = RunKey.of(SETTINGS, knobs, None, 4, 0)
    assert json.loads(untuned.spec) == {"scheduler": "momentum", "knobs_by_steps": None}
    with pytest.raises(ValueError, match="knobs for NFE \\[8, 16\\] only, not 4"):
        SamplerSpec.from_json(knobs).knobs_at(4)


def test_a_half_written_entry_is_never_read_and_a_mismatching_one_is_refused(tmp_path):
    store = RunStore(tmp_path / "store")
    key = RunKey.of(SETTINGS, {"scheduler": "official"}, None, 8, 0)
    assert store.samples(key) is None
    staged = store.samples_path(key).with_name(f".{store.samples_path(key).name}.123.partial")
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b"half an entry")  # a process stopped while writing: not under the entry's name
    assert store.samples(key) is None
    store.put_samples(key, StoredSamples(["a b"], [[1, 2]], 1.5))
    assert store.samples(key) == StoredSamples(["a b"], [[1, 2]], 1.5)
    other = RunKey.of(SETTINGS, {"scheduler": "official"}, None, 8, 1)
    store.samples_path(other).write_bytes(store.samples_path(key).read_bytes())  # copied in under another name
    with pytest.raises(ValueError, match=f"{store.samples_path(other)} is not the run it is named after \\(its seed"):
        store.samples(other)
    store.samples_path(other).write_bytes(b"\x1f\x8b half")
    with pytest.raises(ValueError, match=f"{store.samples_path(other)} \\(a stored run\\) cannot be read"):
        store.samples(other)
    score = ScoreKey("abc", "tiny", "langflow", None, None)
    store.put_score(score, {"gen_ppl": 2.0})
    assert store.score(score) == {"gen_ppl": 2.0} and store.score(ScoreKey("abc", "tiny", "elf", None, None)) is None
    assert store.record()["scores_written"] == 1 and store.record()["samples_written"] == 1

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("a user's file")
    with pytest.raises(ValueError, match="holds other files and no store.json: not a run store"):
        RunStore(tmp_path / "mine")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="a file, not a folder"):
        RunStore(tmp_path / "file")


BANK = {
    "pipeline": "hub_artifacts/langflow-small",
    "seed": 10000,
    "seed_space": "tuning",
    "num_samples": 2,
    "batch_size": 2,
    "evaluator": "smollm2-135m",
    "evaluator_dtype": "float32",
    "protocol": "langflow",
}


def test_a_bank_run_is_stored_whole_under_its_key_and_a_mismatching_one_is_refused(tmp_path):
    store = RunStore(tmp_path / "store")
    key = BankRunKey.of(BANK, 8, {"scheduler": "untied", "eta_r": 2.5}, {"temperature": 1.1})
    assert key.spec == '{"eta_r":2.5,"scheduler":"untied"}' and key.call == '{"temperature":1.1}'
    assert key.bank() == BANK and store.bank_run(key) is None
    staged = store.bank_path(key).with_name(f".{store.bank_path(key).name}.123.partial")
    staged.parent.mkdir(parents=True)
    staged.write_bytes(b'{"format": ')  # a process stopped while writing: not under the entry's name
    assert store.bank_run(key) is None and store.bank_runs() == []
    run = BankRun(2.0, 3.5, [1.0, 2.0], [3.0, 4.0], [3.4, None])
    store.put_bank_run(key, run)
    assert store.bank_run(key) == run and store.bank_runs() == [(key, run)]
    # the counters join the store's record only where bank runs were read or written
    assert (store.record()["banks_read"], store.record()["banks_written"]) == (1, 1)
    assert "banks_read" not in RunStore(tmp_path / "store").record()
    other = replace(key, evaluator_dtype="bfloat16")
    store.bank_path(other).write_bytes(store.bank_path(key).read_bytes())  # copied in under another name
    named = f"{store.bank_path(other)} is not the run it is named after \\(its evaluator_dtype differ"
    with pytest.raises(ValueError, match=named):
        store.bank_run(other)
    with pytest.raises(ValueError, match=f"{store.bank_path(other)} is not the bank run it is named after"):
        store.bank_runs()


def test_a_stopped_scoring_resumes_from_the_store_and_gives_the_whole_scorings_report(
    tmp_path, generation, evaluator, monkeypatch
):
    import untied_sc_lab.experiments.sweep as sweep_module

    whole = _score(generation, evaluator)
    runs = len(generation.runs)
    scorer, calls = sweep_module.evaluate_samples, []

    def stopping(*args, **kwargs):  # the process is stopped while it scores its fourth run
        if len(calls) == 3:
            raise Stop
        calls.append(1)
        return scorer(*args, **kwargs)

    monkeypatch.setattr(sweep_module, "evaluate_samples", stopping)
    store = tmp_path / "store"
    with pytest.raises(Stop):
        _score(generation, evaluator, store=store)
    assert [name.endswith(".json") and not name.startswith(".") for name in _entries(store, "scores")] == [True] * 3

    calls.clear()
    monkeypatch.setattr(sweep_module, "evaluate_samples", lambda *a, **k: calls.append(1) or scorer(*a, **k))
    resumed = _score(generation, evaluator, store=store)
    assert len(calls) == runs - 3
    assert (resumed["store"]["scores_read"], resumed["store"]["scores_written"]) == (3, runs - 3)
    assert _without_timing(resumed) == _without_timing(whole)

    calls.clear()
    again = _score(generation, evaluator, store=store)
    assert calls == [] and again["store"]["scores_read"] == runs
    assert _without_timing(again) == _without_timing(whole)


def test_scores_of_another_scoring_are_not_read_and_an_edited_entry_is_refused(tmp_path, generation, evaluator):
    store = tmp_path / "store"
    first = _score(generation, evaluator, store=store)
    other = _score(generation, evaluator, store=store, max_length=6)  # other settings: other entries
    assert other["store"]["scores_read"] == 0 and other["store"]["scores_written"] == first["store"]["scores_written"]
    assert other["runs"] != first["runs"]

    path = next(
        p for p in sorted((store / "scores").iterdir()) if json.loads(p.read_text())["key"]["max_length"] is None
    )
    entry = json.loads(path.read_text())
    path.write_text(json.dumps({**entry, "key": {**entry["key"], "protocol": "elf"}}))
    with pytest.raises(ValueError, match=f"{path.name} is not the run it is named after \\(its protocol differ"):
        _score(generation, evaluator, store=store)
    path.write_text("{half a file")
    with pytest.raises(ValueError, match=f"{path.name} \\(a stored run\\) cannot be read"):
        _score(generation, evaluator, store=store)


def test_a_stopped_sweep_resumes_from_the_store_doing_only_the_missing_work(
    tmp_path, pipe, evaluator, counted, monkeypatch
):
    score = ScoringSettings(evaluator, num_resamples=50)
    whole = run_sweep(pipe, WITH_DIVERSITY, score, output_dir=tmp_path / "whole", **OPTIONS)
    counted.clear()
    generate = sweep.generate

    def stopping(*args, **kwargs):  # stopped while it samples its fourth run
        if len(counted) == 3:
            raise Stop
        return generate(*args, **kwargs)

    monkeypatch.setattr(sweep, "generate", stopping)
    store = tmp_path / "store"
    with pytest.raises(Stop):
        run_sweep(pipe, WITH_DIVERSITY, score, store=store, **OPTIONS)
    assert len(_entries(store, "samples")) == 3 and _entries(store, "scores") == []
    monkeypatch.setattr(sweep, "generate", generate)
    counted.clear()
    resumed = run_sweep(pipe, WITH_DIVERSITY, score, store=store, output_dir=tmp_path / "resumed", **OPTIONS)
    # 3 runs read (one batch of official and of untied sampled again as the check), the other 3 sampled here
    assert counted == [1, 1, 2, 2, 2] and resumed["store"]["samples_read"] == 3
    assert resumed["store"]["checked_runs"] == ["official at NFE 8, seed 0", "untied at NFE 8, seed 0"]
    untimed = ("seconds", "samples_per_second")
    strip = [[{k: v for k, v in r.items() if k not in untimed} for r in report["runs"]] for report in (whole, resumed)]
    assert strip[0] == strip[1]  # the same samples, so the same scores and tables
    markdown = (tmp_path / "resumed" / "tiny.md").read_text()
    assert "Samples of 3 runs and scores of 0 runs were read from the run store" in markdown
    assert "of this step (runs read from the run store: below) on cpu" in markdown

    counted.clear()
    again = run_sweep(pipe, replace(TINY, diversity_values=[0.5, 2.0]), score, store=store, **OPTIONS)
    # every run of the first sweep read (samples and scores), the 2 runs at temperature 2.0 sampled and scored here
    assert counted == [1, 1, 2, 2] and again["store"]["scores_read"] == 6 and again["store"]["scores_written"] == 2
    assert [r["gen_ppl"] for r in again["runs"][:6]] == [r["gen_ppl"] for r in whole["runs"]]


def test_a_run_with_another_spec_or_setting_is_sampled_again(tmp_path, pipe, counted):
    store = tmp_path / "store"
    generate_sweep(pipe, TINY, store=store, **OPTIONS)
    counted.clear()
    other = {"official": {}, "untied": {"eta_r": 0.25}}
    extended = generate_sweep(pipe, replace(TINY, samplers=other), store=store, **OPTIONS)
    assert extended.store.samples_read == 2 and counted == [1, 2, 2]  # official read; untied sampled
    counted.clear()
    more = generate_sweep(pipe, replace(TINY, batch_size=4), store=store, **OPTIONS)
    assert more.store.samples_read == 0 and counted == [1] * 4  # another batch size: other samples


def test_samples_drawn_elsewhere_are_refused(tmp_path, pipe):
    store = tmp_path / "store"
    generate_sweep(pipe, TINY, store=store, **OPTIONS)
    # one token of the first sample of each seed-0 run changed: the batch sampled again no longer matches it
    for path in sorted((store / "samples").iterdir()):
        entry = json.loads(gzip.decompress(path.read_bytes()))
        if entry["key"]["seed"] == 0:
            entry["ids"][0][0] = (entry["ids"][0][0] + 1) % 64
            path.write_bytes(gzip.compress(json.dumps(entry).encode()))
    with pytest.raises(ValueError, match=", sampled here, differs from .*another machine, torch or weights drew it"):
        generate_sweep(pipe, TINY, store=store, **OPTIONS)


def test_a_sampler_that_draws_officials_samples_is_read_from_the_store_whole(tmp_path, pipe, evaluator, counted):
    neutral = {"official": {}, "untied": {"eta_r": 0.0, "eta_t": 0.0}}  # the official sampler, bit for bit
    score = ScoringSettings(evaluator, num_resamples=50)
    first = run_sweep(pipe, replace(TINY, samplers=neutral), score, store=tmp_path / "store", **OPTIONS)
    counted.clear()
    again = run_sweep(pipe, replace(TINY, samplers=neutral), score, store=tmp_path / "store", **OPTIONS)
    assert again["store"]["samples_read"] == 4 and counted == [1, 1]  # one batch per sampler sampled again
    assert [r["gen_ppl"] for r in again["runs"]] == [r["gen_ppl"] for r in first["runs"]]


def test_a_sweep_sampled_in_parts_into_a_store_scores_as_the_one_command_sweep(tmp_path, langflow_golden, evaluator):
    from untied_sc_lab.experiments.stored_sweeps import read_stored_sweeps, store_sweep

    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[4, 8], bank_size=4, batch_size=4, progress=False)
    whole = generate_sweep(pipe, replace(WITH_DIVERSITY, nfe=[4, 8]), command="both", **OPTIONS)
    store = RunStore(tmp_path / "store")
    with pytest.raises(ValueError, match="holds no sampled sweep to score.*--generate-only --store"):
        read_stored_sweeps(store)
    for n in (8, 4, 8):  # in either order; the part sampled again replaces its entry
        store_sweep(
            store, generate_sweep(pipe, replace(WITH_DIVERSITY, nfe=[n]), command=f"nfe {n}", store=store, **OPTIONS)
        )
    assert len(_entries(tmp_path / "store", "sweeps")) == 2
    merged = read_stored_sweeps(RunStore(tmp_path / "store"))
    assert merged.nfe == (4, 8) and sorted(merged.command.split(" ; ")) == ["nfe 4", "nfe 8"]
    assert [r.key for r in merged.runs] == [r.key for r in whole.runs]
    assert [r.samples for r in merged.runs] == [r.samples for r in whole.runs]
    assert merged.coefficients == whole.coefficients
    scored = [_score(g, evaluator) for g in (whole, merged)]
    untimed = ("seconds", "samples_per_second")
    assert [[{k: v for k, v in r.items() if k not in untimed} for r in s["runs"]] for s in scored] == 2 * [
        [{k: v for k, v in r.items() if k not in untimed} for r in scored[0]["runs"]]
    ]
    assert scored[0]["equal_entropy"] == scored[1]["equal_entropy"]

    # a part of another sweep in the same store, or a run's samples gone: refused, naming the store's file
    other = generate_sweep(pipe, replace(WITH_DIVERSITY, nfe=[4], seeds=[5]), command="seed 5", store=store, **OPTIONS)
    other_path = store_sweep(store, other)
    with pytest.raises(ValueError, match=f"{other_path}.*not parts of one sweep: they differ in seeds"):
        read_stored_sweeps(store)
    other_path.unlink()
    (tmp_path / "store" / "samples" / _entries(tmp_path / "store", "samples")[0]).unlink()
    with pytest.raises(ValueError, match="sweeps/.*json lists .*, whose samples .* the store does not hold"):
        read_stored_sweeps(store)


def test_a_stored_sweep_with_an_edited_or_foreign_entry_is_refused(tmp_path, generation):
    from untied_sc_lab.experiments.stored_sweeps import read_stored_sweeps, store_sweep, sweep_run_key

    store = RunStore(tmp_path / "store")
    path = store_sweep(store, generation)
    entry = store.samples_path(sweep_run_key(generation, generation.runs[-1]))
    stored = json.loads(gzip.decompress(entry.read_bytes()))
    entry.write_bytes(gzip.compress(json.dumps({**stored, "texts": stored["texts"][:-1]}).encode()))
    with pytest.raises(ValueError, match=f"{entry} holds 3 samples of .*, not the 4 that {path} lists: .*edited"):
        read_stored_sweeps(store)
    entry.write_bytes(gzip.compress(json.dumps(stored).encode()))
    assert [run.samples for run in read_stored_sweeps(store).runs] == [run.samples for run in generation.runs]
    foreign = tmp_path / "store" / "sweeps" / "copied.json"
    foreign.write_text(json.dumps({"model": "tiny"}))
    with pytest.raises(ValueError, match=f"{foreign} is not a sampled sweep of this store"):
        read_stored_sweeps(store)


def test_the_command_line_samples_into_a_store_and_scores_the_stored_sweep(tmp_path, pipe, evaluator, capsys):
    from untied_sc.cli import main

    pipe.save_pretrained(tmp_path / "tiny")
    for part in evaluator:
        part.save_pretrained(tmp_path / "evaluator")
    store = str(tmp_path / "store")
    argv = ["benchmark", str(tmp_path / "tiny"), "--nfe", "8", "--seeds", "0", "--num-samples", "2"]
    argv += ["--batch-size", "2", "--temperatures", "0.5", "--no-progress"]
    assert main([*argv, "--generate-only", "--store", store, "--output-dir", str(tmp_path / "gen")]) == 0
    assert not (tmp_path / "gen").exists()  # the store carries the sweep: nothing in --output-dir
    assert f"Score them with: untied-sc benchmark --store {store}\n" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=f"--store scores the sweep stored in {store}; drop --nfe"):
        main(["benchmark", "--store", store, "--nfe", "8"])
    score = ["--evaluator", str(tmp_path / "evaluator"), "--num-resamples", "20"]
    assert main([*argv, *score, "--output-dir", str(tmp_path / "whole")]) == 0
    score = ["benchmark", "--store", store, *score, "--no-progress"]
    assert main([*score, "--output-dir", str(tmp_path / "apart")]) == 0
    whole, apart = (json.loads((tmp_path / name / "tiny.json").read_text()) for name in ("whole", "apart"))
    untimed = ("seconds", "samples_per_second")
    assert [{k: v for k, v in r.items() if k not in untimed} for r in apart["runs"]] == [
        {k: v for k, v in r.items() if k not in untimed} for r in whole["runs"]
    ]
    assert len(apart["runs"]) == 3 and f"--store {store}" in apart["scoring_command"]
    assert main([*score, "--main-only", "--output-dir", str(tmp_path / "main")]) == 0
    main_only = json.loads((tmp_path / "main" / "tiny.json").read_text())
    assert main_only["runs"] == apart["runs"][:2] and main_only["store"]["scores_read"] == 2  # scored once
    capsys.readouterr()
    assert main(["benchmark", "--store", str(tmp_path / "empty"), *score[3:], "--output-dir", str(tmp_path)]) == 2
    assert f"--store {tmp_path / 'empty'}: holds no sampled sweep to score" in capsys.readouterr().err
