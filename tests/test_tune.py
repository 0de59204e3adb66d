"""`untied-sc tune`: the coordinate search on a held-out bank, written into the scheduler config."""

import math

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler, UntiedSelfConditioningScheduler
from untied_sc.calibration.calibrate import CALIBRATION_SEED, calibration_seeds
from untied_sc.calibration.tune import (
    TUNE_SEED,
    candidate_values,
    coordinate_search,
    format_tuning,
    tune_coefficients,
)
from untied_sc.cli import main
from untied_sc.evaluation.sampling import tuning_seeds
from untied_sc.experiments import run_sweep
from untied_sc.experiments.sweep import refuse_leaked_seeds
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.sampler_statistics import COEFFICIENT_NAMES

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
    results = tune_coefficients(pipe, [8], num_samples=4, batch_size=2, evaluator=evaluator, progress=False)
    return pipe, before, results[0]


def test_candidate_values_stay_in_range_and_skip_duplicates():
    assert candidate_values("eta_t", 0.6, (0.0, 0.5, 2.0)) == [0.0, 0.3, 1.2]
    assert candidate_values("alpha", 0.8, (0.0, 0.5, 2.0)) == [0.4, 1.0]  # α > 0, clipped to 1
    assert candidate_values("alpha", 1.0, (0.0, 0.5, 2.0)) == [0.5]  # ×2 clips back onto the current value
    assert candidate_values("eta_o", 0.0, (0.0, 0.5, 2.0)) == []  # a switched-off component stays off


def per_sample(ppl: float, spread: float = 0.01, n: int = 16) -> list[float]:
    """Per-sample NLLs around log(ppl) with a fixed ±spread pattern (mean exactly log(ppl))."""
    return [math.log(ppl) + (spread if i % 2 else -spread) for i in range(n)]


def test_coordinate_search_on_a_known_objective():
    """GenPPL = 100 + (η_T - 2)² + (α - 0.5)²; entropy drops by 0.1 nats when η_R = 0 (inadmissible at 0.05)."""
    calls = []

    def score(spec):
        calls.append(spec)
        if spec["scheduler"] == "official":
            return 200.0, 5.0, per_sample(200.0)
        ppl = 100 + (spec["eta_t"] - 2) ** 2 + (spec["alpha"] - 0.5) ** 2 + spec["eta_r"]
        return ppl, 5.0 - (0.1 if spec["eta_r"] == 0 else 0.0), per_sample(ppl)

    start = {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 1.0}
    result = coordinate_search(8, start, score)
    # η_R = 0 scores best but loses 0.1 nats of entropy: rejected; η_R ×½ kept; η_T ×2 = 2; α ×½ = 0.5.
    assert result.best.coefficients == {"eta_r": 0.5, "eta_t": 2.0, "eta_o": 1.0, "alpha": 0.5}
    assert result.best.gen_ppl == pytest.approx(100.5)
    assert [c.admissible for c in result.candidates if c.coefficients["eta_r"] == 0] == [False]
    assert result.official.gen_ppl == 200.0 and len(calls) == 1 + len(result.candidates)
    # the paired comparison that admitted it: every pair better by log(200 / 100.5)
    assert result.best_vs_official.mean_delta == pytest.approx(math.log(100.5 / 200))
    assert result.best_vs_official.mean_delta_ci[1] < 0 and result.best_vs_official.fraction_b_worse == 0
    # nothing admissible (every candidate loses entropy): the untied components are switched off
    off = coordinate_search(
        8,
        start,
        lambda spec: (1.0, 5.0, per_sample(1.0)) if spec["scheduler"] == "official" else (0.5, 4.0, per_sample(0.5)),
    )
    assert off.best.coefficients["eta_r"] == off.best.coefficients["eta_t"] == 0.0
    assert off.best.gen_ppl == 1.0 and off.best_vs_official is None
    # admissible but no better than official: off as well (the untied sampler must earn its place)
    worse = coordinate_search(
        8,
        start,
        lambda spec: (1.0, 5.0, per_sample(1.0)) if spec["scheduler"] == "official" else (1.5, 5.0, per_sample(1.5)),
    )
    assert worse.best.coefficients["eta_r"] == worse.best.coefficients["eta_t"] == 0.0
    assert worse.best_vs_official.mean_delta > 0


def test_a_win_within_noise_keeps_the_official_sampler():
    """1 % lower GenPPL, but the pairs scatter by ±0.5 nats: the paired interval contains 0, so nothing changes."""

    def score(spec, spread=0.5):
        if spec["scheduler"] == "official":
            return 100.0, 5.0, per_sample(100.0, spread=0.0)
        return 99.0, 5.0, per_sample(99.0, spread=spread)

    start = {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 1.0}
    noisy = coordinate_search(8, start, score)
    low, high = noisy.best_vs_official.mean_delta_ci
    assert low < 0 < high
    assert noisy.best.coefficients["eta_r"] == noisy.best.coefficients["eta_t"] == 0.0
    assert noisy.best.gen_ppl == 100.0
    # the same 1 % on consistent pairs is a real win and is kept
    steady = coordinate_search(8, start, lambda spec: score(spec, spread=0.0))
    assert steady.best.coefficients == start and steady.best_vs_official.mean_delta_ci[1] < 0
    assert "within noise, the official sampler is kept" in format_tuning([noisy])
    assert "accepted" in format_tuning([steady])


def test_the_keep_rule_resamples_whole_batches():
    """A 64-sample ELF bank is two batches of 32, two time grids: the candidate wins by 0.2 nats on every sample of
    one and loses by 0.1 on the other. As 64 independent pairs that looks like a sure win; as 2 grids the interval
    reaches above 0 and the official sampler stays."""
    official = [5.0] * 64
    candidate = [4.8] * 32 + [5.1] * 32

    def score(spec):
        if spec["scheduler"] == "official":
            return 100.0, 5.0, official
        return 99.0, 5.0, candidate

    start = {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 1.0}
    pairs = coordinate_search(8, start, score)
    batches = coordinate_search(8, start, score, clusters=[i // 32 for i in range(64)])
    assert pairs.best.coefficients == start and pairs.best_vs_official.mean_delta_ci[1] < 0
    assert batches.best_vs_official.mean_delta_ci[1] > 0
    assert batches.best.coefficients["eta_r"] == batches.best.coefficients["eta_t"] == 0.0


def test_search_starts_from_the_calibrated_coefficients_and_keeps_the_best_admissible_candidate(tuned):
    pipe, before, result = tuned
    assert result.start.coefficients == pytest.approx(before)
    floor = result.official.entropy - 0.05
    for candidate in result.candidates:
        assert candidate.admissible == (math.isfinite(candidate.gen_ppl) and candidate.entropy >= floor)
    admissible = [c.gen_ppl for c in result.candidates if c.admissible]
    assert (result.best_vs_official is None) == (not admissible)
    if result.best_vs_official is not None and result.best_vs_official.mean_delta_ci[1] < 0:
        assert result.best.gen_ppl == min(admissible)  # compared with a monotonically improving best
    else:
        assert result.best.coefficients["eta_r"] == result.best.coefficients["eta_t"] == 0.0
    # one value per factor and coefficient around the running best, plus the start
    assert 1 < len(result.candidates) <= 1 + 3 * len(COEFFICIENT_NAMES)


def test_tuned_coefficients_are_what_the_untied_scheduler_uses(tuned):
    pipe, _, result = tuned
    statistics = pipe.sampler_statistics
    assert pipe.scheduler.config.coefficients_by_steps["8"] == result.best.coefficients  # plain floats, exact
    scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    assert scheduler.resolve_coefficients(8, statistics) == result.best.coefficients
    record = pipe.scheduler.config.tuning_by_steps["8"]
    assert record["seed"] == TUNE_SEED and record["num_samples"] == 4
    assert record["chosen"]["gen_ppl"] == pytest.approx(result.best.gen_ppl)
    assert record["confidence"] == 0.95
    if result.best_vs_official is not None:
        assert record["best_vs_official"]["num_pairs"] == 4
        assert record["best_vs_official"]["mean_delta_nll"] == pytest.approx(result.best_vs_official.mean_delta)


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
        run_sweep(loaded, nfe=[8], seeds=[0, TUNE_SEED], num_samples=2, batch_size=2, evaluator=evaluator)


def test_tuning_is_deterministic(langflow_golden, evaluator, tuned):
    _, _, first = tuned
    again = tune_coefficients(
        calibrated_pipe(langflow_golden), [8], num_samples=4, batch_size=2, evaluator=evaluator, progress=False
    )[0]
    assert again.best.coefficients == first.best.coefficients
    assert [c.gen_ppl for c in again.candidates] == [c.gen_ppl for c in first.candidates]


def test_tuning_again_restarts_from_the_calibrated_coefficients(langflow_golden, evaluator, tuned):
    _, before, first = tuned
    pipe = calibrated_pipe(langflow_golden)
    options = {"num_samples": 4, "batch_size": 2, "evaluator": evaluator, "progress": False}
    tune_coefficients(pipe, [8], **options)
    # pretend the last choice switched the untied sampler off: a search from there could never switch it back on
    pipe.scheduler.register_to_config(
        coefficients_by_steps={"8": {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 1.0, "alpha": 1.0}}
    )
    again = tune_coefficients(pipe, [8], **options)[0]
    assert again.start.coefficients == pytest.approx(before)
    assert again.best.coefficients == first.best.coefficients
    assert [c.gen_ppl for c in again.candidates] == [c.gen_ppl for c in first.candidates]
    assert pipe.scheduler.config.tuning_by_steps["8"]["calibrated"] == pytest.approx(before)


def test_tune_rejects_uncalibrated_nfe_and_pipelines_without_statistics(langflow_golden, evaluator):
    pipe = calibrated_pipe(langflow_golden)
    with pytest.raises(ValueError, match=r"not calibrated at NFE \[16\].*untied-sc calibrate PIPELINE_DIR --nfe 16"):
        tune_coefficients(pipe, [16], num_samples=4, evaluator=evaluator)
    with pytest.raises(ValueError, match="max_entropy_drop"):
        tune_coefficients(pipe, [8], num_samples=4, evaluator=evaluator, max_entropy_drop=-1.0)
    bare = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    with pytest.raises(ValueError, match="no sampler statistics"):
        tune_coefficients(bare, [8], num_samples=4, evaluator=evaluator)


def test_tune_command_writes_the_folder(langflow_golden, evaluator, tmp_path, capsys):
    calibrated_pipe(langflow_golden).save_pretrained(tmp_path / "pipe")
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["tune", str(tmp_path / "pipe"), "--nfe", "8", "--num-samples", "4", "--batch-size", "2"]
    assert main([*argv, "--evaluator", str(tmp_path / "evaluator"), "--no-progress"]) == 0
    assert "untied (tuned)" in capsys.readouterr().out
    assert "8" in load_pipeline(tmp_path / "pipe").scheduler.config.tuning_by_steps
    assert "coefficients_by_steps" in (tmp_path / "pipe" / "scheduler" / "scheduler_config.json").read_text()
