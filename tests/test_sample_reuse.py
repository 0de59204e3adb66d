"""`--reuse-samples`: a report's runs lend their samples to the same runs of a larger sweep, checked by sampling one
batch of each lent sampler again; on the tiny golden LangFlow pipeline under a tiny evaluator."""

import gzip
import json

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc_lab.experiments import run_sweep, sweep

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


OPTIONS = {"nfe": [8], "seeds": [0, 1], "num_samples": 4, "batch_size": 2, "progress": False, "name": "tiny"}


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


@pytest.fixture(scope="module")
def pipe(langflow_golden):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    return pipe


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


def score(evaluator) -> dict:
    return {"evaluator": evaluator, "num_resamples": 50}


def test_a_report_lends_its_runs_and_only_the_new_ones_are_sampled(tmp_path, pipe, evaluator, counted):
    run_sweep(pipe, diversity_values=[0.5], output_dir=tmp_path / "first", **OPTIONS, **score(evaluator))
    whole = run_sweep(pipe, diversity_values=[0.5, 2.0], **OPTIONS, **score(evaluator))
    counted.clear()
    extended = run_sweep(
        pipe,
        diversity_values=[0.5, 2.0],
        reuse_samples=tmp_path / "first" / "tiny.json",
        output_dir=tmp_path / "second",
        **OPTIONS,
        **score(evaluator),
    )
    # 6 runs lent (2 seeds × 2 samplers main, 2 seeds at 0.5), one batch sampled again per sampler (official,
    # untied), and the 2 runs at temperature 2.0 (2 batches each) sampled here.
    assert extended["reused_samples"]["runs"] == 6 and counted == [1, 1, 2, 2]
    assert extended["reused_samples"]["checked_runs"] == ["official at NFE 8, seed 0", "untied at NFE 8, seed 0"]
    untimed = ("seconds", "samples_per_second")
    strip = [
        [{k: v for k, v in r.items() if k not in untimed} for r in report["runs"]] for report in (whole, extended)
    ]
    assert strip[0] == strip[1]  # the same samples, so the same scores and tables
    first = json.loads((tmp_path / "first" / "tiny.json").read_text())
    assert [r["seconds"] for r in extended["runs"][:6]] == [r["seconds"] for r in first["runs"]]  # its times too
    with gzip.open(tmp_path / "second" / "tiny.samples.jsonl.gz", "rt") as f:
        assert len(f.read().splitlines()) == 8 * 4  # every run's samples, the lent ones included: one file
    markdown = (tmp_path / "second" / "tiny.md").read_text()
    assert "Samples and sampling times of 6 runs were taken from" in markdown
    assert "it is not a speed result" in markdown  # the lent runs' times are another step's
    assert "of this step (runs taken from an earlier report: below) on cpu" in markdown


def test_a_run_with_another_spec_or_coefficients_is_sampled_again(tmp_path, pipe, evaluator, counted):
    run_sweep(pipe, output_dir=tmp_path, **OPTIONS, **score(evaluator))
    counted.clear()
    other = {"official": {}, "untied": {"eta_r": 0.25}}
    extended = run_sweep(pipe, samplers=other, reuse_samples=tmp_path / "tiny.json", **OPTIONS, **score(evaluator))
    assert extended["reused_samples"]["runs"] == 2 and counted == [1, 2, 2]  # official lent; untied sampled
    with pytest.warns(UserWarning, match="holds none of these runs"):
        sweep.generate_sweep(pipe, **{**OPTIONS, "seeds": [3]}, reuse_samples=tmp_path / "tiny.json")


def test_a_report_drawn_elsewhere_or_with_other_settings_is_refused(tmp_path, pipe, evaluator):
    run_sweep(pipe, output_dir=tmp_path, **OPTIONS, **score(evaluator))
    with pytest.raises(ValueError, match="sampled with batch_size 2 \\(here 4\\)"):
        sweep.generate_sweep(pipe, **{**OPTIONS, "batch_size": 4}, reuse_samples=tmp_path / "tiny.json")
    # one token of the first sample changed: the batch sampled again no longer matches it
    path = tmp_path / "tiny.samples.jsonl.gz"
    with gzip.open(path, "rt") as f:
        records = [json.loads(line) for line in f]
    records[0]["ids"][0] = (records[0]["ids"][0] + 1) % 64
    with gzip.open(path, "wt") as f:
        f.write("".join(json.dumps(record) + "\n" for record in records))
    with pytest.raises(ValueError, match="the first batch of official at NFE 8, seed 0, sampled here, differs"):
        sweep.generate_sweep(pipe, **OPTIONS, reuse_samples=tmp_path / "tiny.json")


def test_the_command_line_refuses_reuse_samples_where_nothing_is_sampled_here(tmp_path, pipe, evaluator, capsys):
    from untied_sc.cli import main

    run_sweep(pipe, output_dir=tmp_path, **OPTIONS, **score(evaluator))
    report = str(tmp_path / "tiny.json")
    with pytest.raises(SystemExit, match="drop --reuse-samples"):
        main(["benchmark", "--from", str(tmp_path / "x.generation.json"), "--reuse-samples", report])
    with pytest.raises(SystemExit, match="drop --reuse-samples"):
        main(["benchmark", "--rescore", report, "--reuse-samples", report, "--dtype", "float32"])
    pipe.save_pretrained(tmp_path / "pipe")
    argv = ["benchmark", str(tmp_path / "pipe"), "--experiment", "baselines", "--generate-only", "--tune-here"]
    with pytest.raises(SystemExit, match="--tune-here chooses its runs while sampling"):
        main([*argv, "--reuse-samples", report])
    assert main(["benchmark", str(tmp_path / "pipe"), "--reuse-samples", str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file; give a benchmark report" in capsys.readouterr().err


def test_a_sampler_that_draws_officials_samples_is_stored_once_and_lent_whole(tmp_path, pipe, evaluator, counted):
    from untied_sc.generation import read_samples

    neutral = {"official": {}, "untied": {"eta_r": 0.0, "eta_t": 0.0}}  # the official sampler, bit for bit
    first = run_sweep(pipe, samplers=neutral, output_dir=tmp_path / "first", **OPTIONS, **score(evaluator))
    path = tmp_path / "first" / "tiny.samples.jsonl.gz"
    with gzip.open(path, "rt") as f:
        lines = [json.loads(line) for line in f]
    references = [line for line in lines if "same_samples_as" in line]
    assert len(lines) == 2 * 4 + 2 and [r["same_samples_as"]["sampler"] for r in references] == ["official"] * 2
    samples = read_samples(path)
    assert [s.sampler for s in samples] == ["official"] * 4 + ["untied"] * 4 + ["official"] * 4 + ["untied"] * 4
    assert [s.text for s in samples[:4]] == [s.text for s in samples[4:8]]
    counted.clear()
    again = run_sweep(
        pipe, samplers=neutral, reuse_samples=tmp_path / "first" / "tiny.json", **OPTIONS, **score(evaluator)
    )
    assert again["reused_samples"]["runs"] == 4 and counted == [1, 1]  # one batch per sampler sampled again
    assert [r["gen_ppl"] for r in again["runs"]] == [r["gen_ppl"] for r in first["runs"]]
