"""`make demo` (`python -m untied_sc_lab.demo`) on a saved tiny pipeline with a tiny evaluator."""

from pathlib import Path

import torch

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc_lab.demo import main, sample_both

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def test_demo_prints_official_and_untied_samples_with_metrics(tmp_path, langflow_golden, capsys, monkeypatch):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    pipe.save_pretrained(tmp_path / "artifacts" / "tiny")
    model, tokenizer = tiny_evaluator()
    model.save_pretrained(tmp_path / "evaluator")
    tokenizer.save_pretrained(tmp_path / "evaluator")

    results = sample_both(pipe, 8, 2, seed=0)
    assert list(results) == ["official", "untied", "untied (langflow-lm1b preset)"]
    assert isinstance(pipe.scheduler, LangFlowScheduler)  # restored
    # same seed: every sampler starts from the same latent, so the untied samplers differ only through the method
    assert not torch.equal(results["official"].sequences, results["untied (langflow-lm1b preset)"].sequences)

    argv = [
        "--artifacts",
        str(tmp_path / "artifacts"),
        "--evaluator",
        str(tmp_path / "evaluator"),
        "--batch-size",
        "2",
    ]
    capsys.readouterr()  # what saving the evaluator printed
    monkeypatch.chdir(tmp_path)  # no benchmarks/results here or beside the artifacts: it says where it looked
    assert main([*argv, "--results", str(tmp_path / "none")]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "=== tiny (LangFlowPipeline), 8 steps, seed 0 ===" in out
    for name in results:
        assert f"--- {name} (2 samples): GenPPL" in out
    assert "(langflow protocol: generator ids), word Rep-4" in out and ", token Rep-4 " in out
    lines = out.splitlines()
    assert (
        lines[0] == f"No committed benchmarks found (looked in {tmp_path / 'none'}): the summary gives the demo's "
        "own samples only; pass --results benchmarks/results of a checkout for the verdicts."
    )
    assert lines[1].startswith("Loading the evaluator") and lines[2].startswith("Evaluator: ")
    assert "run in float32" in lines[2]  # the committed benchmarks' dtype, and the one it really ran in
    assert "lower reads as more fluent, but only at similar entropy" in out
    # progress: one bar per model on stderr, redrawn in place, none of the pipelines' per-step bars
    assert "tiny" in captured.err and captured.err.count("\n") <= 2
    summary = out[out.index("=== Summary (8 steps) ===") :]
    line = next(line for line in summary.splitlines() if "These 2 samples per sampler" in line)
    assert "(a glimpse at their own entropies, no interval): official GenPPL" in line
    assert "untied (langflow-lm1b preset)" in line and "official's, entropy" in line
    assert "No equal-entropy benchmark of this model at this NFE" in summary
    assert summary.rstrip().endswith("docs/results.md.")
    assert main(["--artifacts", str(tmp_path / "empty")]) == 1


def test_the_demo_says_why_an_untied_block_equals_the_official_one(langflow_golden):
    from untied_sc_lab.demo import correction_off_note

    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    off = {"8": {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 1.0, "alpha": 1.0}}
    pipe.scheduler.register_to_config(coefficients_by_steps=off)
    assert "η_R = η_T = 0: `untied-sc tune` kept the official sampler" in correction_off_note(pipe, 8)
    pipe.scheduler.register_to_config(coefficients_by_steps={"8": {**off["8"], "eta_t": 0.5}})
    assert correction_off_note(pipe, 8) is None


def test_the_demo_takes_its_verdict_from_the_equal_entropy_benchmark(tmp_path):
    import json

    from untied_sc_lab.demo import equal_entropy_verdict

    # the committed report, its untied readings at 8 NFE set to each case (read as the demo reads any report)
    committed = json.loads((RESULTS / "langflow-small-equal-entropy-8-baselines.json").read_text())

    def report(frontier: dict, own: dict) -> Path:
        results = json.loads(json.dumps(committed))
        results["frontiers"]["by_sampler"]["untied"]["8"].update(frontier)
        results["equal_entropy"]["untied"]["8"].update(own)
        (tmp_path / "tiny-equal-entropy-8-baselines.json").write_text(json.dumps(results))
        return tmp_path

    folder = Path("hub_artifacts/tiny")
    assert equal_entropy_verdict(folder, 8, tmp_path) is None  # no report: no verdict
    at_official = {"ratio": 0.66, "ratio_ci": [0.63, 0.69]}
    line = equal_entropy_verdict(folder, 8, report(at_official, {"ratio": 0.7, "ratio_ci": [0.6, 0.8]}))
    assert "(tiny-equal-entropy-8-baselines.json, 3 seeds × 128 pairs)" in line
    assert line.endswith(
        "0.660 of official's (95 % interval [0.630, 0.690]) at official's entropy: untied did better."
    )
    # a frontier that does not reach official's entropy: read at untied's own entropy on official's curve
    own = {"ratio": 1.2, "ratio_ci": [1.05, 1.4], "entropy": 4.24}
    line = equal_entropy_verdict(folder, 8, report({"ratio": None, "ratio_ci": None}, own))
    assert "at untied's own entropy (4.24 nats; official's is lower): official did better." in line
    line = equal_entropy_verdict(folder, 8, report({"ratio": 0.97, "ratio_ci": [0.9, 1.04]}, own))
    assert line.endswith(": no clear difference.") and equal_entropy_verdict(folder, 16, tmp_path) is None
    # neither reading has an interval (the committed one at its own entropy has none): no verdict
    assert equal_entropy_verdict(folder, 8, report({"ratio": None, "ratio_ci": None}, {"ratio_ci": None})) is None


def test_the_demo_verdict_reads_the_committed_benchmark():
    from untied_sc_lab.demo import equal_entropy_verdict

    line = equal_entropy_verdict(Path("hub_artifacts/langflow-small"), 8, RESULTS)
    assert line == (
        "The benchmark at equal entropy (langflow-small-equal-entropy-8-baselines.json, 3 seeds × 128 pairs): "
        "untied's GenPPL is 0.663 of official's (95 % interval [0.636, 0.692]) at official's entropy: untied did "
        "better."
    )


def test_the_demo_finds_the_benchmarks_wherever_it_is_run_from(tmp_path, monkeypatch):
    from pathlib import Path

    from untied_sc_lab.demo import find_results, results_candidates

    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)  # outside the clone
    assert find_results(checkout / "hub_artifacts") == checkout / "benchmarks" / "results"
    assert find_results(tmp_path / "artifacts") == checkout / "benchmarks" / "results"  # the source checkout
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "mine" / "artifacts").mkdir(parents=True)
    assert find_results(tmp_path / "mine" / "artifacts") == tmp_path / "benchmarks" / "results"  # the working dir
    (tmp_path / "mine" / "benchmarks" / "results").mkdir(parents=True)
    assert find_results(tmp_path / "mine" / "artifacts") == tmp_path / "mine" / "benchmarks" / "results"
    assert results_candidates(tmp_path / "mine" / "artifacts")[0] == tmp_path / "mine" / "benchmarks" / "results"
