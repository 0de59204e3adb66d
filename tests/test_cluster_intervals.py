"""Intervals with few clusters: Student's t quantile, the t-interval and bootstrap-t over clusters, their coverage on
simulated clustered data against the cluster bootstrap, and how reports carry them."""

import math

import pytest
import torch

from untied_sc.generation.sampling import MIN_INDEPENDENT_CLUSTERS, independent_clusters, warn_few_clusters
from untied_sc_lab.evaluation.statistics import (
    SMALL_SAMPLE_CLUSTERS,
    cluster_mean_intervals,
    cluster_totals,
    headline_interval,
    ratio_difference_intervals,
    student_t_quantile,
)
from untied_sc_lab.experiments.aggregation import aggregate, analyse, genppl_ratio_ci, genppl_ratio_intervals
from untied_sc_lab.experiments.records import RunRecord
from untied_sc_lab.experiments.report import format_markdown
from untied_sc_lab.experiments.report_record import Report

from .tiny import scored_run


pytestmark = pytest.mark.usefixtures("one_thread")  # small matrices: a second thread only contends


def test_student_t_quantile_matches_the_tables():
    # Two-sided 95 % and one-sided 95 % points from printed t tables; the normal's 1.95996 in the limit.
    table = {1: 12.7062, 2: 4.3027, 3: 3.1824, 5: 2.5706, 11: 2.2010, 30: 2.0423, 120: 1.9799}
    for nu, value in table.items():
        assert student_t_quantile(0.975, nu) == pytest.approx(value, abs=1e-4)
    assert student_t_quantile(0.95, 7) == pytest.approx(1.8946, abs=1e-4)
    assert student_t_quantile(0.025, 11) == -student_t_quantile(0.975, 11)
    # both sides of the switch to the 1/ν expansion agree, and the limit is the normal quantile
    assert student_t_quantile(0.975, 1000) == pytest.approx(student_t_quantile(0.975, 1001), abs=1e-5)
    assert student_t_quantile(0.975, 10**7) == pytest.approx(1.959964, abs=1e-6)
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        student_t_quantile(0.975, 2.5)


def test_cluster_totals_sum_rows_within_clusters():
    totals, labels = cluster_totals([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], ["b", "a", "b"])
    assert labels == ["b", "a"] and torch.equal(totals, torch.tensor([[6.0, 8.0], [3.0, 4.0]], dtype=torch.float64))


def test_log_ratio_t_interval_by_hand_with_equal_tokens():
    # Equal token counts on both sides: u_c is the token-weighted deviation of cluster c's log ratio from θ, scaled
    # by the mean cluster size, and θ is the pooled NLL difference per token.
    nll_a = [10.0, 12.0, 9.0, 14.0, 11.0, 8.0]
    nll_b = [9.0, 12.5, 8.0, 12.0, 11.5, 7.0]
    tokens = [4.0, 5.0, 3.0, 6.0, 4.0, 3.0]
    clusters = [0, 0, 1, 1, 2, 2]
    result = ratio_difference_intervals(nll_b, tokens, nll_a, tokens, clusters=clusters, num_resamples=200)
    theta = (sum(nll_b) - sum(nll_a)) / sum(tokens)
    cluster_tokens = [9.0, 9.0, 7.0]
    cluster_delta = [-0.5, -3.0, -0.5]
    mean_tokens = sum(cluster_tokens) / 3
    u = [(d - theta * t) / mean_tokens for d, t in zip(cluster_delta, cluster_tokens, strict=True)]
    se = math.sqrt(sum(x * x for x in u) / (3 * 2))
    assert result.estimate == pytest.approx(theta) and result.standard_error == pytest.approx(se)
    assert result.num_clusters == 3 and result.degrees_of_freedom == 2
    half = student_t_quantile(0.975, 2) * se
    assert result.t_interval == pytest.approx((theta - half, theta + half))
    low, high = result.bootstrap_t_interval
    assert low < theta < high
    ratio = result.exp()
    assert ratio.estimate == pytest.approx(math.exp(theta))
    assert ratio.t_interval == pytest.approx((math.exp(theta - half), math.exp(theta + half)))


def test_identical_samplers_give_a_point_and_errors_are_explicit():
    run = scored_run([2.0, 3.0, 4.0, 1.0], [2, 3, 4, 2])
    same = genppl_ratio_intervals([run], [run], clusters=[0, 0, 1, 1], num_resamples=20)
    assert same.estimate == 1.0 and same.t_interval == (1.0, 1.0) and same.bootstrap_t_interval == (1.0, 1.0)
    with pytest.raises(ValueError, match="at least 2 clusters"):
        ratio_difference_intervals([1.0, 2.0], [1.0, 1.0], clusters=[0, 0])
    with pytest.raises(ValueError, match="both"):
        ratio_difference_intervals([1.0, 2.0], [1.0, 1.0], numerators_a=[1.0, 1.0])
    mean = cluster_mean_intervals([1.0, float("nan"), 3.0, 5.0], clusters=[0, 0, 1, 2], num_resamples=20)
    assert mean.estimate == pytest.approx(3.0) and mean.num_clusters == 3


def _clustered_runs(generator, seeds: int, per_seed: int, size: int, log_ratio: float):
    """Matched baseline/candidate runs whose per-token NLLs share a random effect per cluster (a time grid): within a
    cluster the samples are strongly correlated (intra-cluster correlation 1/2). Token counts differ per sample and
    per side. The population log GenPPL ratio is `log_ratio`."""
    baseline, candidate = [], []
    for _ in range(seeds):
        n = per_seed * size
        grid_a = torch.randn(per_seed, generator=generator, dtype=torch.float64).repeat_interleave(size) * 0.2
        grid_b = torch.randn(per_seed, generator=generator, dtype=torch.float64).repeat_interleave(size) * 0.2
        tokens_a = torch.randint(60, 160, (n,), generator=generator).double()
        tokens_b = torch.randint(60, 160, (n,), generator=generator).double()
        noise_a, noise_b = torch.randn(2, n, generator=generator, dtype=torch.float64) * 0.2
        per_token_a = 5.0 + grid_a + noise_a
        per_token_b = 5.0 + log_ratio + grid_a + grid_b + noise_b
        baseline.append(scored_run((tokens_a * per_token_a).tolist(), tokens_a.tolist()))
        candidate.append(scored_run((tokens_b * per_token_b).tolist(), tokens_b.tolist()))
    return baseline, candidate


def _coverage(seeds: int, per_seed: int, size: int, trials: int, resamples: int = 300) -> tuple[float, float, float]:
    """Coverage of the true ratio by the reports' cluster bootstrap, the t-interval and the bootstrap-t."""
    generator = torch.Generator().manual_seed(0)
    truth = math.exp(-0.2)
    clusters = [i // size for i in range(per_seed * size)]
    covered = [0, 0, 0]
    for _ in range(trials):
        baseline, candidate = _clustered_runs(generator, seeds, per_seed, size, -0.2)
        _, bootstrap = genppl_ratio_ci(baseline, candidate, clusters, num_resamples=resamples, generator=generator)
        small = genppl_ratio_intervals(baseline, candidate, clusters, num_resamples=resamples, generator=generator)
        for i, (low, high) in enumerate((bootstrap, small.t_interval, small.bootstrap_t_interval)):
            covered[i] += low <= truth <= high
    return tuple(c / trials for c in covered)


def test_t_interval_covers_at_the_nominal_rate_with_12_clusters_where_the_cluster_bootstrap_falls_short():
    # 3 seeds x 4 grids of 4 samples, as a 3 x 128-pair ELF cell in batches of 32 (fewer samples per grid, to stay
    # fast: the grids, not the samples, set the coverage). The bootstrap redraws 4 grids within each seed (variance
    # x 3/4) and uses normal quantiles; the t-interval uses t with 11 degrees of freedom.
    bootstrap, t, bootstrap_t = _coverage(seeds=3, per_seed=4, size=4, trials=400)
    assert 0.90 <= t <= 0.98
    assert 0.88 <= bootstrap_t <= 0.99
    assert bootstrap <= t - 0.04 and bootstrap < 0.90


def test_both_intervals_cover_at_the_nominal_rate_with_100_clusters():
    bootstrap, t, _ = _coverage(seeds=4, per_seed=25, size=2, trials=200)
    assert 0.90 <= bootstrap <= 0.98 and 0.90 <= t <= 0.98


def test_headline_is_the_t_interval_below_the_threshold():
    few = ratio_difference_intervals([1.0, 2.0, 4.0, 3.0], [1.0] * 4, clusters=[0, 1, 2, 3], num_resamples=20)
    assert headline_interval((0.5, 0.6), few) == (few.t_interval, "t")
    assert headline_interval((0.5, 0.6), few, threshold=4) == ((0.5, 0.6), "bootstrap")
    assert SMALL_SAMPLE_CLUSTERS == 50


def _results(num_samples: int = 8, batch_size: int = 2) -> dict:
    generator = torch.Generator().manual_seed(5)
    baseline, candidate = _clustered_runs(generator, 2, num_samples // batch_size, batch_size, -0.1)
    runs = []
    for sampler, group in (("official", baseline), ("untied", candidate)):
        for seed, run in enumerate(group):
            nll_sum, num_tokens = run.scores.per_sample.nll_sum, run.scores.per_sample.num_tokens
            gen_ppl = math.exp(sum(nll_sum) / sum(num_tokens))
            record = scored_run(nll_sum, num_tokens, sampler=sampler, seed=seed, entropy=4.0, gen_ppl=gen_ppl)
            runs.append(record.to_json("decode_temperature"))
    return {
        "model": "tiny",
        "pipeline_class": "ELFPipeline",
        "family": "elf",
        "protocol": "elf",
        "evaluator": "tiny-evaluator",
        "nfe": [8],
        "seeds": [0, 1],
        "num_samples": num_samples,
        "batch_size": batch_size,
        "samplers": {"official": {}, "untied": {}},
        "baseline": "official",
        "diversity_knob": "decode_temperature",
        "diversity_default": 0.0,
        "runs": runs,
        "command": "untied-sc benchmark tiny",
        "device": "cpu",
        "torch": torch.__version__,
        "wall_seconds": 1.0,
    }


def _records(results: dict) -> list[RunRecord]:
    return [RunRecord.from_json(run, results["diversity_knob"]) for run in results["runs"]]


def test_reports_carry_the_small_sample_intervals_only_when_analysed_with_them():
    fresh = analyse(_results(), num_resamples=50)
    cell = fresh["aggregates"]["paired"]["untied"]["8"]
    assert fresh["interval_rule"]["threshold_clusters"] == SMALL_SAMPLE_CLUSTERS
    assert cell["num_clusters"] == 8 and cell["interval_method"] == "t"  # 2 seeds x 4 batches of 2
    assert cell["gen_ppl_ratio_headline_ci"] == cell["gen_ppl_ratio_t_ci"]
    assert cell["mean_delta_headline_ci"] == cell["mean_delta_t_ci"]
    low, high = cell["gen_ppl_ratio_t_ci"]
    assert low < cell["gen_ppl_ratio"] < high
    text = format_markdown(Report.from_json(fresh))
    assert "8 independent time grids per cell (2 seeds × 4 batches of 2)" in text
    assert "fewer than 50 clusters: the three intervals side by side" in text and "]† |" in text
    # re-analysed as it was: the same statistics
    assert analyse(dict(fresh), num_resamples=50)["aggregates"] == fresh["aggregates"]
    # a report analysed before the intervals existed keeps its tables unless asked
    old = _results()
    old["aggregates"] = aggregate(_records(old), num_resamples=50).to_json()
    analyse(old, num_resamples=50)
    assert "interval_rule" not in old and "num_clusters" not in old["aggregates"]["paired"]["untied"]["8"]
    assert "independent time grids" not in format_markdown(Report.from_json(old))
    assert "num_clusters" in analyse(old, num_resamples=50, small_sample=True)["aggregates"]["paired"]["untied"]["8"]


def test_a_single_cluster_has_no_small_sample_interval():
    results = analyse(_results(num_samples=2, batch_size=2) | {"seeds": [0]}, num_resamples=20)
    results["runs"] = [run for run in results["runs"] if run["seed"] == 0]
    cell = aggregate(_records(results), num_resamples=20, clusters=[0, 0], small_sample=True).paired["untied"][8]
    assert cell.num_clusters == 1 and cell.gen_ppl_ratio_t_ci is None and cell.interval_method is None
    written = cell.to_json()
    assert written["interval_method"] is None and written["mean_delta_bootstrap_t_ci"] is None


def test_few_independent_clusters_are_warned_about():
    assert independent_clusters("elf", num_seeds=3, num_samples=128, batch_size=32) == 12
    assert independent_clusters("elf", num_seeds=3, num_samples=128, batch_size=8) == 48 == MIN_INDEPENDENT_CLUSTERS
    assert independent_clusters("langflow", num_seeds=3, num_samples=16, batch_size=8) == 48
    with pytest.warns(UserWarning, match=r"12 independent time grids.*--batch-size 8"):
        warn_few_clusters("elf", num_seeds=3, num_samples=128, batch_size=32)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warn_few_clusters("elf", num_seeds=3, num_samples=128, batch_size=8)


def test_small_elf_batches_give_more_grids_each_seeded_by_its_batch(elf_golden, tmp_path):
    # Batch size 2 -> 4 grids per seed: every batch is one pipeline call drawn from batch_seed(seed, b), so the same
    # inputs give the same samples and the batch size is part of the recorded seeding.
    from untied_sc import ELFPipeline, ELFScheduler
    from untied_sc.generation.sampling import batch_seed
    from untied_sc_lab.experiments import ScoringSettings, SweepSettings, generate_sweep, score_sweep

    from .conftest import elf_from_golden
    from .tiny import tiny_evaluator, tiny_tokenizer

    pipe = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    settings = SweepSettings(nfe=[8], seeds=[3], num_samples=8, batch_size=2, samplers={"official": {}})
    with pytest.warns(UserWarning, match=r"4 independent time grids.*fewer than 48.*more seeds"):
        generation = generate_sweep(pipe, settings, progress=False, name="tiny", command="pytest")
    samples = generation.runs[0].samples
    assert generation.batch_size == 2 and [s.batch for s in samples] == [0, 0, 1, 1, 2, 2, 3, 3]
    for b in range(4):
        direct = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(batch_seed(3, b)))
        assert [s.text for s in samples[2 * b : 2 * b + 2]] == direct.texts
    with pytest.warns(UserWarning):
        again = generate_sweep(pipe, settings, progress=False, name="tiny", command="pytest")
    assert [s.ids for s in again.runs[0].samples] == [s.ids for s in samples]
    results = score_sweep(
        generation, ScoringSettings(tiny_evaluator(), num_resamples=20), progress=False, output_dir=tmp_path
    )
    assert "4 independent time grids per cell (1 seed × 4 batches of 2)" in (tmp_path / "tiny.md").read_text()
    assert results["batch_size"] == 2


def test_two_clusters_give_a_t_interval_but_no_bootstrap_t():
    # Two grids: 1 degree of freedom (t = 12.7) and a single informative resample, so no bootstrap-t.
    result = ratio_difference_intervals([1.0, 3.0, 2.0, 6.0], [1.0, 1.0, 1.0, 1.0], clusters=[0, 0, 1, 1])
    assert result.degrees_of_freedom == 1 and result.bootstrap_t_interval is None
    half = student_t_quantile(0.975, 1) * result.standard_error
    assert result.t_interval == pytest.approx((result.estimate - half, result.estimate + half))
    assert result.exp().bootstrap_t_interval is None
