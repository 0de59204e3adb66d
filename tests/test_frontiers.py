"""Each sampler read on its own frontier at official's entropy (`curves.frontier_ratio`), and the end-tangent reading
of a curve just beyond its ends (`monotone_cubic(..., extrapolate=)`)."""

import math

import pytest

from untied_sc.generation import SamplerSpec
from untied_sc_lab.evaluation.aggregates import Aggregates
from untied_sc_lab.evaluation.curves import RunSamples, frontier_ratio, monotone_cubic
from untied_sc_lab.experiments.aggregation import frontier_comparison

from .tiny import paired_cell, scored_run


def run(ppl: float, entropy: float, n: int = 32, spread: float = 0.0) -> RunSamples:
    logs = [math.log(ppl) + (spread if i % 2 else -spread) for i in range(n)]
    return RunSamples([10 * v for v in logs], [10.0] * n, [entropy] * n, entropy)


def frontier(scale: float, entropies, slope: float = 5.5, spread: float = 0.0):
    """A frontier GenPPL = scale · 100 · exp(slope (h − 5)), one seed per point."""
    return [[run(scale * 100 * math.exp(slope * (h - 5)), h, spread=spread)] for h in entropies]


def test_the_end_tangent_is_read_only_within_the_allowance():
    x, y = [0.0, 1.0, 2.0], [0.0, 1.0, 4.0]
    assert monotone_cubic(x, y, 2.5) is None  # by default nothing is extrapolated
    end = monotone_cubic(x, y, 2.5, extrapolate=0.5)
    slope = (monotone_cubic(x, y, 2.0) - monotone_cubic(x, y, 2.0 - 1e-6)) / 1e-6
    assert end == pytest.approx(4.0 + 0.5 * slope, rel=1e-4)
    assert (
        monotone_cubic(x, y, 2.6, extrapolate=0.5) is None and monotone_cubic(x, y, -0.5, extrapolate=0.5) is not None
    )
    with pytest.raises(ValueError, match="extrapolate"):
        monotone_cubic(x, y, 1.0, extrapolate=-1.0)


def test_a_sampler_on_its_own_frontier_at_official_entropy():
    official = [run(100.0, 5.0)]
    # 20 % better than official at every entropy; its tuned point sits 0.05 nats below official's entropy
    better = frontier(0.8, [4.95, 4.85, 5.1])
    row = frontier_ratio(better, official, num_resamples=200)
    assert row.entropy == pytest.approx(5.0) and row.ratio == pytest.approx(0.8, rel=1e-6)
    assert row.ratio_ci == pytest.approx((0.8, 0.8), rel=1e-6)  # no noise, no spread
    assert row.reference_gen_ppl == pytest.approx(100.0) and row.gen_ppl == pytest.approx(80.0, rel=1e-6)
    # its raw ratio at its tuned point would read 0.8 · exp(−5.5 · 0.05) ≈ 0.61: the frontier removes that
    assert better[0][0].run_entropy < 5.0
    # head to head: two frontiers read at the same entropy
    worse = frontier(0.9, [5.02, 4.9, 5.2])
    head = frontier_ratio(better, official, worse, num_resamples=200)
    assert head.ratio == pytest.approx(0.8 / 0.9, rel=1e-6) and head.reference_gen_ppl == pytest.approx(90.0, rel=1e-6)
    # a frontier that does not reach official's entropy: outside, no ratio
    far = frontier(0.5, [4.5, 4.6])
    outside = frontier_ratio(far, official, num_resamples=50)
    assert outside.ratio is None and outside.gen_ppl is None and outside.ratio_ci is None


def test_noisy_pairs_widen_the_interval_and_every_frontier_point_is_resampled_alike():
    official = [run(100.0, 5.0, spread=0.5)]
    noisy = frontier(0.95, [4.95, 4.85, 5.1], spread=0.5)  # the same per-sample pattern as official: matched
    matched = frontier_ratio(noisy, official, num_resamples=300)
    assert matched.ratio_ci[0] == pytest.approx(matched.ratio_ci[1], rel=1e-6)  # the pattern cancels
    shuffled = [[run(95 * math.exp(5.5 * (h - 5)), h, spread=-0.5)] for h in (4.95, 4.85, 5.1)]  # opposite pattern
    unmatched = frontier_ratio(shuffled, official, num_resamples=300)
    assert unmatched.ratio_ci[0] < 0.95 < unmatched.ratio_ci[1]


def _record(sampler, nfe, seed, value, ppl, entropy, n=8):
    nll_sum = [10 * math.log(ppl)] * n
    return scored_run(
        nll_sum,
        [10] * n,
        sampler=sampler,
        nfe=nfe,
        seed=seed,
        value=value,
        entropy=entropy,
        sample_entropy=[entropy] * n,
        gen_ppl=ppl,
    )


def _frontiers(results: dict, runs, **options):
    """[`frontier_comparison`] on a report's JSON samplers and aggregates."""
    samplers = {name: SamplerSpec.from_json(spec, name) for name, spec in results["samplers"].items()}
    return frontier_comparison(samplers, Aggregates.from_json(results["aggregates"]), runs, **options)


def test_the_benchmark_reads_every_swept_sampler_and_the_untied_one_head_to_head():
    runs = []
    for seed in (0, 1):
        runs.append(_record("official", 8, seed, None, 100.0, 5.0))
        runs += [_record("official", 8, seed, t, 100 * math.exp(5.5 * (t - 1)), 4 + t) for t in (0.9, 1.1)]
        for name, scale, tuned in (("untied", 0.7, 4.97), ("HiGS", 0.9, 5.03)):
            runs.append(_record(name, 8, seed, None, scale * 100 * math.exp(5.5 * (tuned - 5)), tuned))
            runs += [
                _record(name, 8, seed, t, scale * 100 * math.exp(5.5 * (3.97 + t - 5)), 3.97 + t) for t in (0.9, 1.1)
            ]
    results = {
        "samplers": {
            "official": {"scheduler": "official"},
            "untied": {"scheduler": "untied"},
            "HiGS": {"scheduler": "higs"},
        },
        "aggregates": {"by_sampler": {}, "paired": {"untied": {"8": paired_cell(0.59, [0.5, 0.6])}}},
    }
    out = _frontiers(results, runs, num_resamples=100)
    assert out.by_sampler["untied"][8].ratio == pytest.approx(0.7, rel=1e-6)
    assert out.by_sampler["untied"][8].raw_ratio == 0.59 and out.by_sampler["untied"][8].points == 3
    assert out.by_sampler["HiGS"][8].ratio == pytest.approx(0.9, rel=1e-6)
    (head,) = out.head_to_head[8]
    assert head.sampler == "untied" and head.against == "HiGS" and head.ratio == pytest.approx(0.7 / 0.9)


def test_a_switched_off_method_is_not_the_best_other_and_the_report_says_there_is_none():
    from untied_sc_lab.experiments.report import _frontier_lines

    runs = []
    for seed in (0, 1):
        for name in ("official", "Momentum"):  # Momentum switched off: official's samples
            runs.append(_record(name, 8, seed, None, 100.0, 5.0))
            runs += [_record(name, 8, seed, t, 100 * math.exp(5.5 * (t - 1)), 4 + t) for t in (0.9, 1.1)]
        runs.append(_record("untied", 8, seed, None, 100.0, 6.0))  # its frontier lies above official's entropy
        runs += [_record("untied", 8, seed, t, 100 * math.exp(t), 5.5 + t) for t in (0.9, 1.1)]
    samplers = {"official": {"scheduler": "official"}, "untied": {"scheduler": "untied"}}
    results = {
        "samplers": {**samplers, "Momentum": {"scheduler": "momentum"}},
        "aggregates": {"by_sampler": {}, "paired": {}},
    }
    out = _frontiers(results, runs, num_resamples=50)
    assert out.by_sampler["Momentum"][8].ratio == pytest.approx(1)
    assert out.by_sampler["Momentum"][8].switched_off and not out.by_sampler["untied"][8].switched_off
    assert out.by_sampler["untied"][8].ratio is None and out.head_to_head == {8: []}
    lines = "\n".join(_frontier_lines(out, "official", "temperature"))
    assert "- NFE 8: none: no other method has a reading at official's entropy" in lines
    # without a rival at all (only untied swept) there is no head-to-head paragraph
    only = _frontiers({"samplers": samplers, "aggregates": {"by_sampler": {}, "paired": {}}}, runs, num_resamples=50)
    alone = _frontier_lines(only, "official", "temperature")
    assert not any("Head to head" in line for line in alone)
