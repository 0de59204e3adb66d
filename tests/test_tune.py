"""`untied-sc tune`: the coordinate search on a held-out bank, written into the scheduler config."""

import copy
import json
import math
import re
from dataclasses import replace

import pytest
import torch

from untied_sc import LangFlowPipeline, LangFlowScheduler, UntiedSelfConditioningScheduler
from untied_sc.calibration.calibrate import CALIBRATION_SEED
from untied_sc.cli import main
from untied_sc.generation import refuse_leaked_seeds
from untied_sc.generation.sampling import tuning_seeds
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.sampler_statistics import COEFFICIENT_NAMES
from untied_sc.seeds import calibration_seeds
from untied_sc_lab.experiments import ScoringSettings, SweepSettings, run_sweep
from untied_sc_lab.runs import RunStore
from untied_sc_lab.tuning.search import RULE
from untied_sc_lab.tuning.tune import TUNE_SEED, BankScorer, tune_coefficients

from .conftest import langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


def calibrated_pipe(golden):
    pipe = LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    return pipe


@pytest.fixture(scope="module")
def tuned(langflow_golden, evaluator):
    pipe = calibrated_pipe(langflow_golden)
    before = dict(pipe.scheduler.config.coefficients_by_steps["8"])  # what calibration ran at
    results = tune_coefficients(pipe, [8], evaluator=evaluator, **OPTIONS)
    return pipe, before, results[0]


OPTIONS = {"num_samples": 4, "batch_size": 2, "budget": 6, "progress": False}


def per_sample(ppl: float, spread: float = 0.01, n: int = 16) -> list[float]:
    """Per-sample NLLs around log(ppl) with a fixed ±spread pattern (mean exactly log(ppl))."""
    return [math.log(ppl) + (spread if i % 2 else -spread) for i in range(n)]


def test_search_starts_from_the_calibrated_coefficients_and_records_the_rule(tuned):
    pipe, before, result = tuned
    assert result.candidates[0].knobs == pytest.approx(before) and result.candidates[0].phase == "start"
    assert 1 < len(result.candidates) <= OPTIONS["budget"]
    record = pipe.scheduler.config.tuning_by_steps["8"]
    assert record["rule"] == RULE and record["budget"] == OPTIONS["budget"]
    assert record["candidates_tried"] == len(result.candidates) == len(record["candidates"])
    curve = record["official_curve"]
    assert [p["temperature"] for p in curve["points"]] == [1.0, 0.8, 0.9, 1.1, 1.2]
    low, high = curve["entropy_range"]
    for candidate in record["candidates"]:  # each candidate's score: its GenPPL over official's at its entropy
        inside = low - curve["extrapolate"] <= candidate["entropy"] <= high + curve["extrapolate"]
        assert (candidate["objective"] is not None) == inside
        if inside:
            ratio = candidate["gen_ppl"] / candidate["official_gen_ppl_at_entropy"]
            assert candidate["objective"] == pytest.approx(math.log(ratio))
    inside = [c for c in result.candidates if c.objective is not None]
    if inside:
        assert result.best.objective == min(c.objective for c in inside)
        assert set(record["edges"]) == set(COEFFICIENT_NAMES)
    if result.kept:
        assert record["chosen"] == result.best.knobs and record["best_vs_official"]["ratio_ci"][1] < 1
    else:  # switched off: bitwise the official sampler, and no stored temperature
        assert record["chosen"]["eta_r"] == record["chosen"]["eta_t"] == 0.0
        assert set(pipe.scheduler.config.coefficients_by_steps["8"]) == set(COEFFICIENT_NAMES)


def test_tuned_coefficients_are_what_the_untied_scheduler_uses(tuned):
    pipe, _, result = tuned
    entry = pipe.scheduler.config.coefficients_by_steps["8"]
    assert {name: entry[name] for name in COEFFICIENT_NAMES} == result.chosen  # plain floats, exact
    scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    assert scheduler.resolve_coefficients(8) == result.chosen
    record = pipe.scheduler.config.tuning_by_steps["8"]
    assert record["seed"] == TUNE_SEED and record["num_samples"] == 4 and record["seed_space"] == "tuning"
    assert record["chosen_scores"]["gen_ppl"] == pytest.approx(
        (result.best.run if result.kept else result.curve.default).gen_ppl
    )
    assert record["confidence"] == 0.95


def test_tuning_survives_save_and_load_and_the_benchmark_refuses_the_tuning_bank(tuned, evaluator, tmp_path):
    pipe, _, result = tuned
    pipe.save_pretrained(tmp_path)
    loaded = load_pipeline(tmp_path)
    assert loaded.scheduler.config.coefficients_by_steps == pipe.scheduler.config.coefficients_by_steps
    assert loaded.scheduler.config.tuning_by_steps == pipe.scheduler.config.tuning_by_steps
    # the tuning bank and the calibration banks lie in seed spaces of their own: no benchmark seed is theirs
    assert loaded.scheduler.config.tuning_by_steps["8"]["seed_space"] == "tuning" and tuning_seeds(loaded) == set()
    assert calibration_seeds(loaded.sampler_statistics) == set()
    refuse_leaked_seeds([0, TUNE_SEED, 2 * CALIBRATION_SEED, 2 * CALIBRATION_SEED + 1], loaded)
    # a record written before the spaces names a benchmark seed, which is still refused
    old = {**loaded.scheduler.config.tuning_by_steps["8"]}
    del old["seed_space"]
    loaded.scheduler.register_to_config(tuning_by_steps={"8": old})
    with pytest.raises(ValueError, match=f"Seeds \\[{TUNE_SEED}\\] are the bank .* tuned on"):
        run_sweep(loaded, SweepSettings([8], [0, TUNE_SEED], num_samples=2, batch_size=2), ScoringSettings(evaluator))


def test_tuning_is_deterministic(langflow_golden, evaluator, tuned):
    _, _, first = tuned
    again = tune_coefficients(calibrated_pipe(langflow_golden), [8], evaluator=evaluator, **OPTIONS)[0]
    assert again.chosen == first.chosen
    assert [c.run.gen_ppl for c in again.candidates] == [c.run.gen_ppl for c in first.candidates]


def test_tuning_again_restarts_from_the_calibrated_coefficients(langflow_golden, evaluator, tuned):
    _, before, first = tuned
    pipe = calibrated_pipe(langflow_golden)
    options = {**OPTIONS, "evaluator": evaluator}
    tune_coefficients(pipe, [8], **options)
    # pretend the last choice switched the untied sampler off: a search from there could never switch it back on
    pipe.scheduler.register_to_config(
        coefficients_by_steps={"8": {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 1.0, "alpha": 1.0}}
    )
    again = tune_coefficients(pipe, [8], **options)[0]
    assert again.start == pytest.approx(before)
    assert again.chosen == first.chosen
    assert [c.run.gen_ppl for c in again.candidates] == [c.run.gen_ppl for c in first.candidates]
    assert pipe.scheduler.config.tuning_by_steps["8"]["calibrated"] == pytest.approx(before)


def test_tune_rejects_uncalibrated_nfe_and_pipelines_without_statistics(langflow_golden, evaluator):
    pipe = calibrated_pipe(langflow_golden)
    with pytest.raises(ValueError, match=r"not calibrated at NFE \[16\].*untied-sc calibrate PIPELINE_DIR --nfe 16"):
        tune_coefficients(pipe, [16], num_samples=4, evaluator=evaluator)
    with pytest.raises(ValueError, match="extrapolate must be ≥ 0"):
        tune_coefficients(pipe, [8], num_samples=4, evaluator=evaluator, extrapolate=-1.0)
    bare = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    with pytest.raises(ValueError, match="no sampler statistics"):
        tune_coefficients(bare, [8], num_samples=4, evaluator=evaluator)


def test_tune_command_writes_the_folder(langflow_golden, evaluator, tmp_path, capsys):
    calibrated_pipe(langflow_golden).save_pretrained(tmp_path / "pipe")
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["tune", str(tmp_path / "pipe"), "--nfe", "8", "--num-samples", "4", "--batch-size", "2", "--budget", "3"]
    assert main([*argv, "--evaluator", str(tmp_path / "evaluator"), "--no-progress"]) == 0
    assert "| 8 | untied | start |" in capsys.readouterr().out
    assert "8" in load_pipeline(tmp_path / "pipe").scheduler.config.tuning_by_steps
    assert "coefficients_by_steps" in (tmp_path / "pipe" / "scheduler" / "scheduler_config.json").read_text()


def test_a_stopped_tuning_resumes_from_its_store(langflow_golden, evaluator, tuned, tmp_path):
    _, _, first = tuned
    lines = []
    pipe = calibrated_pipe(langflow_golden)
    folder = tmp_path / "store"
    options = {**OPTIONS, "evaluator": evaluator, "store": folder}
    tune_coefficients(pipe, [8], **options, log=lines.append)
    entries = sorted((folder / "banks").glob("*.json"))
    assert (
        len(entries)
        == len(lines)
        == 5 + len(first.candidates) + (len(first.entropy_matching.runs) if first.entropy_matching else 0)
    )
    stored = RunStore(folder).bank_runs()
    assert {(key.nfe, key.num_samples, key.evaluator_dtype, key.seed_space) for key, _ in stored} == {
        (8, 4, "float32", "tuning")
    }
    # as if stopped before its last run: that entry is missing and a half-written one lies beside it (never read)
    entries[-1].unlink()
    half = entries[-1].with_name(f".{entries[-1].name}.123.partial")
    half.write_text('{"format": ')
    again, store = [], RunStore(folder)
    resumed = {**options, "store": store}
    result = tune_coefficients(calibrated_pipe(langflow_golden), [8], **resumed, log=again.append)[0]
    assert len(again) == 1 and result.chosen == first.chosen  # one run sampled again, the rest read
    assert (store.banks_read, store.banks_written) == (len(entries) - 1, 1) and entries[-1].exists()
    assert len(store.bank_runs()) == len(entries)
    # another bank in the same store reads none of these runs: it is sampled and stored beside them
    six, store = [], RunStore(folder)
    six_samples = {**options, "num_samples": 6, "store": store}
    tune_coefficients(calibrated_pipe(langflow_golden), [8], **six_samples, log=six.append)
    assert store.banks_read == 0 and store.banks_written == len(six) > 0
    assert len(list((folder / "banks").glob("*.json"))) == len(entries) + len(six)
    # the evaluator's dtype is part of the bank: the same evaluator in another dtype is another bank
    bfloat = (copy.deepcopy(evaluator[0]).to(torch.bfloat16), evaluator[1])
    store = RunStore(folder)
    scorer = BankScorer(pipe, pipe.scheduler.config, TUNE_SEED, 4, 2, bfloat, "langflow", store=store)
    scorer(8, {"scheduler": "official"})
    assert (store.banks_read, store.banks_written) == (0, 1) and scorer.bank()["evaluator_dtype"] == "bfloat16"
    # an entry of one bank under another bank's name (copied in) is refused, naming the file and the fields
    key = next(key for key, _ in stored if key.spec == '{"scheduler":"official"}' and key.call == "{}")
    other = RunStore(folder).bank_path(replace(key, num_samples=6))
    other.write_bytes(RunStore(folder).bank_path(key).read_bytes())
    named = f"{re.escape(str(other))} is not the run it is named after .its num_samples differ"
    with pytest.raises(ValueError, match=named):
        tune_coefficients(calibrated_pipe(langflow_golden), [8], **{**options, "num_samples": 6})
    with pytest.raises(ValueError, match=f"{re.escape(str(other))} is not the bank run it is named after"):
        RunStore(folder).bank_runs()
    # an edited entry is refused, naming the file and what differs
    edited = json.loads(entries[0].read_text())
    edited["key"]["seed"] += 1
    entries[0].write_text(json.dumps(edited))
    named = f"{re.escape(str(entries[0]))} is not the run it is named after .its seed differ"
    with pytest.raises(ValueError, match=named):
        tune_coefficients(calibrated_pipe(langflow_golden), [8], **options)


def test_the_stored_temperature_runs_the_untied_sampler_unless_the_call_or_the_config_says_otherwise(
    langflow_golden,
):
    pipe = calibrated_pipe(langflow_golden)
    entry = {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 1.0}
    untied = UntiedSelfConditioningScheduler.from_config(
        pipe.scheduler.config, coefficients_by_steps={"8": {**entry, "temperature": 0.7}}
    )
    pipe.scheduler = untied

    def texts(**kwargs):
        return pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0), **kwargs).texts

    stored = texts()
    assert stored == texts(temperature=0.7)  # the stored temperature is the call's default
    assert texts(temperature=1.0) != stored  # an explicit argument overrides it
    # coefficients that do not come from that entry (an explicit coefficient) run at T = 1
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(untied.config, eta_o=1.0)
    assert texts() == texts(temperature=1.0)
    # the official scheduler on the same config never reads it
    pipe.scheduler = LangFlowScheduler.from_config(untied.config)
    assert texts() == texts(temperature=1.0)
    # an entry that switches the untied components off is the official sampler: it may not hold a temperature
    with pytest.raises(ValueError, match=r"η_R = η_T = 0 .* must leave temperature out"):
        UntiedSelfConditioningScheduler.from_config(
            untied.config, coefficients_by_steps={"8": {**entry, "eta_r": 0.0, "eta_t": 0.0, "temperature": 0.7}}
        )
    with pytest.raises(ValueError, match="at most one of"):
        UntiedSelfConditioningScheduler.from_config(
            untied.config, coefficients_by_steps={"8": {**entry, "temperature": 0.7, "decode_temperature": 0.1}}
        )
