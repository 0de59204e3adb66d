"""A scored sweep's statistics, from its run records alone (so committed reports can be re-analysed: [`analyse`]).

Aggregates per (sampler, NFE): mean ± standard error over seeds. Paired per (candidate, NFE) against the baseline
sampler, pooling the pairs of all seeds: the GenPPL ratio candidate / baseline with a paired bootstrap CI
([`genppl_ratio_ci`]), the mean per-token ΔNLL with its CI and the fraction of pairs where the candidate is worse
([`paired_comparison`]), and the retained throughput. Every interval resamples the sweep's resampling unit (an ELF
batch, a LangFlow sample) within seeds ([`run_clusters`]).

With few clusters (ELF: a dozen time grids) a percentile bootstrap covers too rarely, so a fresh analysis also gives
the t-interval and the studentized bootstrap over the clusters ([`genppl_ratio_intervals`],
[`cluster_mean_intervals`]) and a headline interval chosen by one rule ([`INTERVAL_RULE`], [`headline_interval`]):
below 50 clusters the t-interval, otherwise the cluster bootstrap.

The diversity sweep (the official sampler at several values of the family's diversity knob) gives GenPPL–entropy
curves ([`diversity_curves`]); every other sampler is read against the baseline's curve at its own entropy
([`equal_entropy_comparison`], the control of docs/algorithm.md §6). Where other samplers were swept too (`--experiment
baselines`), each one's own frontier is read at the baseline's entropy ([`frontier_comparison`]).
"""

import math
from collections.abc import Mapping, Sequence

import torch

from untied_sc.families import get_family
from untied_sc.generation import SamplerSpec, resampling_clusters

from ..evaluation.aggregates import Aggregates, CurvePoint, DiversityCurves, MeanSE, PairedSummary, curves_to_json
from ..evaluation.curves import FIT_DESCRIPTION, RunSamples, equal_entropy_ratio, frontier_ratio, gen_ppl_on_curve
from ..evaluation.metrics import retained_throughput
from ..evaluation.statistics import (
    SMALL_SAMPLE_CLUSTERS,
    ClusterIntervals,
    cluster_mean_intervals,
    cluster_resample_weights,
    headline_interval,
    paired_comparison,
    percentile_interval,
    ratio_difference_intervals,
)
from .definitions import BASELINE
from .equal_entropy_records import EqualEntropyRow, FrontierRow, Frontiers, HeadToHead, equal_entropy_to_json
from .records import SCORE_METRICS, RunRecord, report_records


# The run-record metrics that get a mean ± SE over seeds per (sampler, NFE).
AGGREGATED_METRICS = (*SCORE_METRICS, "samples_per_second")


# The rule a report's headline intervals follow, recorded in the results (`interval_rule`) and stated in the report.
INTERVAL_RULE = {
    "threshold_clusters": SMALL_SAMPLE_CLUSTERS,
    "below": "t-interval over clusters (C - 1 degrees of freedom; GenPPL ratio on the log scale)",
    "otherwise": "cluster bootstrap (percentile)",
    "why": (
        "with a dozen clusters a percentile bootstrap covers too rarely (about 85% for a nominal 95% with 3 seeds x "
        "4 grids in simulation: it resamples 4 grids within each seed and uses normal quantiles), while the "
        "t-interval on the clusters' linearised log-ratios covers at the nominal rate; the studentized bootstrap, "
        "shown beside it, checks for skew"
    ),
}


def _nan_if_none(values) -> list[float]:
    return [float("nan") if v is None else float(v) for v in values]


def run_clusters(runs: Sequence[RunRecord], clusters: Sequence | None = None) -> tuple[list, list]:
    """Cluster and stratum labels of the pooled samples of `runs` (one run per seed, in order): `(seed, cluster)` and
    the seed, `clusters` being the label of sample i within a seed ([`resampling_clusters`]; `None`: i itself)."""
    if clusters is None:
        clusters = range(max(len(run.scores.per_sample) for run in runs))
    labels, strata = [], []
    for position, run in enumerate(runs):  # one run per seed
        count = len(run.scores.per_sample)
        if count > len(clusters):
            raise ValueError(f"A run holds {count} samples but only {len(clusters)} cluster labels were given.")
        labels += [(position, clusters[i]) for i in range(count)]
        strata += [position] * count
    return labels, strata


def paired_token_table(baseline_runs: Sequence[RunRecord], candidate_runs: Sequence[RunRecord]) -> torch.Tensor:
    """(pairs, 4) float64 table of matched runs' per-sample sums: nll_a, tokens_a, nll_b, tokens_b (a the baseline),
    the pairs of all runs (one run per seed, same order) stacked."""
    columns = []
    for a, b in zip(baseline_runs, candidate_runs, strict=True):
        pa, pb = a.scores.per_sample, b.scores.per_sample
        columns += list(zip(pa.nll_sum, pa.num_tokens, pb.nll_sum, pb.num_tokens, strict=True))
    return torch.tensor(columns, dtype=torch.float64)


def genppl_ratio_ci(
    baseline_runs: Sequence[RunRecord],
    candidate_runs: Sequence[RunRecord],
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = 0,
) -> tuple[float, tuple[float, float]]:
    """Pooled GenPPL ratio candidate / baseline over matched runs, and its paired cluster bootstrap CI.

    GenPPL = exp(Σ nll_sum / Σ num_tokens) pooled over the pairs of all the runs (one run per seed, same order), so the
    ratio is exp(NLL/token of the candidate - NLL/token of the baseline). `clusters` labels sample i of a seed with its
    resampling unit ([`resampling_clusters`]; default: every sample its own); clusters are resampled within seeds.
    """
    table = paired_token_table(baseline_runs, candidate_runs)
    labels, strata = run_clusters(baseline_runs, clusters)
    weights = torch.cat(
        [
            torch.ones(1, len(labels), dtype=torch.float64),
            cluster_resample_weights(labels, num_resamples, generator, strata),
        ]
    )
    sums = weights @ table  # (1 + R, 4): Σ nll_a, Σ tokens_a, Σ nll_b, Σ tokens_b
    ratios = torch.exp(sums[:, 2] / sums[:, 3].clamp(min=1) - sums[:, 0] / sums[:, 1].clamp(min=1))
    return float(ratios[0]), percentile_interval(ratios[1:], confidence)


def genppl_ratio_intervals(
    baseline_runs: Sequence[RunRecord],
    candidate_runs: Sequence[RunRecord],
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
    generator: torch.Generator | int | None = 0,
) -> ClusterIntervals:
    """Small-sample intervals of the pooled GenPPL ratio candidate / baseline over matched runs: the t-interval and
    the studentized bootstrap over clusters ([`ratio_difference_intervals`], mapped through exp).

    The estimator is the report's: log ratio θ = Σ nll_b / Σ tok_b - Σ nll_a / Σ tok_a pooled over all pairs. Its
    per-cluster statistic is the linearised log GenPPL ratio u_c = tok_b,c (L_b,c - θ_b) / t̄ok_b - tok_a,c (L_a,c -
    θ_a) / t̄ok_a, L_·,c = nll_·,c / tok_·,c the cluster's log GenPPL (when both samplers emit the same tokens per
    cluster, the token-weighted deviation of the cluster's log ratio from θ). The clusters of all seeds (`(seed,
    cluster)` labels, [`run_clusters`]) are one sample: every ELF batch has its own generator seed.
    """
    table = paired_token_table(baseline_runs, candidate_runs)
    labels, _ = run_clusters(baseline_runs, clusters)
    log_ratio = ratio_difference_intervals(
        table[:, 2],
        table[:, 3],
        table[:, 0],
        table[:, 1],
        clusters=labels,
        num_resamples=num_resamples,
        confidence=confidence,
        generator=generator,
    )
    return log_ratio.exp()


def _small_sample_entry(
    ratio_ci: Sequence[float],
    ratio: ClusterIntervals | None,
    delta_ci: Sequence[float],
    delta: ClusterIntervals | None,
    num_clusters: int,
) -> dict:
    """A paired cell's small-sample fields ([`PairedSummary`]): cluster count, both methods' intervals and the
    headline by the rule (no interval, `None`, from a single cluster: nothing measures the spread between grids)."""
    if ratio is None or delta is None:
        return {"num_clusters": num_clusters}
    ratio_headline, method = headline_interval(tuple(ratio_ci), ratio)
    delta_headline, _ = headline_interval(tuple(delta_ci), delta)
    return {
        "num_clusters": ratio.num_clusters,
        "interval_method": method,
        "gen_ppl_ratio_headline_ci": list(ratio_headline),
        "gen_ppl_ratio_t_ci": list(ratio.t_interval),
        "gen_ppl_ratio_bootstrap_t_ci": ratio.bootstrap_t_interval,
        "mean_delta_headline_ci": list(delta_headline),
        "mean_delta_t_ci": list(delta.t_interval),
        "mean_delta_bootstrap_t_ci": delta.bootstrap_t_interval,
    }


def aggregate(
    runs: Sequence[RunRecord],
    baseline: str = BASELINE,
    num_resamples: int = 1000,
    generator: int = 0,
    clusters: Sequence | None = None,
    small_sample: bool = False,
) -> Aggregates:
    """Aggregates the main-sweep runs (those without a diversity value).

    Returns the mean ± SE of every metric per sampler and NFE and the paired comparison of every candidate per NFE
    ([`Aggregates`]; a report stores its `to_json()`). `paired` pools the pairs of all seeds present in both samplers, matched by seed and order;
    its intervals resample `clusters` (the resampling unit of sample i of a seed, [`resampling_clusters`]; default:
    every sample its own) within seeds. With `small_sample`, every paired cell also holds `num_clusters`, the
    t-interval and the studentized bootstrap of the GenPPL ratio ([`genppl_ratio_intervals`]) and of the mean ΔNLL
    ([`cluster_mean_intervals`]) (`*_t_ci`, `*_bootstrap_t_ci`), and the headline interval by [`INTERVAL_RULE`]
    (`*_headline_ci`, its `interval_method` `"t"` or `"bootstrap"`).
    """
    by_sampler: dict[str, dict[int, dict[str, MeanSE]]] = {}
    grouped: dict = {}
    for run in runs:
        grouped.setdefault(run.sampler, {}).setdefault(run.nfe, {})[run.seed] = run
    for sampler, by_nfe in grouped.items():
        by_sampler[sampler] = {
            nfe: {
                metric: MeanSE.of([r.scores.metric(metric) for r in seeds.values()]) for metric in AGGREGATED_METRICS
            }
            for nfe, seeds in sorted(by_nfe.items())
        }
    paired: dict[str, dict[int, PairedSummary]] = {}
    for sampler, by_nfe in grouped.items():
        if sampler == baseline or baseline not in grouped:
            continue
        for nfe, seeds in sorted(by_nfe.items()):
            common = sorted(set(seeds) & set(grouped[baseline].get(nfe, {})))
            if not common:
                continue
            a = [grouped[baseline][nfe][s] for s in common]
            b = [seeds[s] for s in common]
            labels, strata = run_clusters(a, clusters)
            nll_a = [x for run in a for x in _nan_if_none(run.scores.per_sample.mean_nll)]
            nll_b = [x for run in b for x in _nan_if_none(run.scores.per_sample.mean_nll)]
            comparison = paired_comparison(
                nll_a, nll_b, num_resamples=num_resamples, generator=generator, clusters=labels, strata=strata
            )
            ratio, ratio_ci = genppl_ratio_ci(a, b, clusters, num_resamples=num_resamples, generator=generator)
            per_seed_ratio = [rb.scores.gen_ppl / ra.scores.gen_ppl for ra, rb in zip(a, b, strict=True)]
            retained = [
                retained_throughput(ra.scores.samples_per_second, rb.scores.samples_per_second)
                for ra, rb in zip(a, b, strict=True)
            ]
            small: dict = {}
            if small_sample:
                delta = [y - x for x, y in zip(nll_a, nll_b, strict=True)]  # NaN where either side is
                finite_clusters = {c for c, d in zip(labels, delta, strict=True) if not math.isnan(d)}
                several = len(set(labels)) > 1 and len(finite_clusters) > 1
                options = {"num_resamples": num_resamples, "generator": generator}
                small = _small_sample_entry(
                    ratio_ci,
                    genppl_ratio_intervals(a, b, clusters, **options) if several else None,
                    comparison.mean_delta_ci,
                    cluster_mean_intervals(delta, labels, **options) if several else None,
                    len(set(labels)),
                )
            paired.setdefault(sampler, {})[nfe] = PairedSummary(
                baseline=baseline,
                seeds=common,
                gen_ppl_ratio=ratio,
                gen_ppl_ratio_ci=ratio_ci,
                gen_ppl_ratio_per_seed=MeanSE.of(per_seed_ratio),
                **vars(comparison),
                retained_throughput=MeanSE.of(retained),
                **small,
            )
    return Aggregates(by_sampler, paired)


def diversity_curves(runs: Sequence[RunRecord], default: float | None = None) -> DiversityCurves:
    """GenPPL and entropy (mean ± SE over seeds) per sampler, NFE and knob value, for samplers that were swept.

    The main runs (knob value `None`) join their sampler's curve at `default` (the knob's value in the main runs: T = 1,
    or the config's w) as its `default` [`CurvePoint`]. Each curve is sorted by knob value.
    """
    grouped: dict[str, dict[int, dict]] = {}
    for run in runs:
        grouped.setdefault(run.sampler, {}).setdefault(run.nfe, {}).setdefault(run.value, []).append(run)
    curves: dict[str, dict[int, list[CurvePoint]]] = {}
    for sampler, by_nfe in grouped.items():
        for nfe, by_value in by_nfe.items():
            if len(by_value) < 2 and None in by_value:
                continue  # no sweep for this sampler and NFE
            points = [
                CurvePoint(
                    default if value is None else value,
                    value is None,
                    MeanSE.of([r.scores.gen_ppl for r in group]),
                    MeanSE.of([r.scores.entropy for r in group]),
                )
                for value, group in by_value.items()
            ]
            curves.setdefault(sampler, {})[nfe] = sorted(
                points, key=lambda p: (p.value is not None, p.value if p.value is not None else 0.0)
            )
    return curves


def gen_ppl_at_entropy(points: Sequence[CurvePoint], entropy: float) -> float | None:
    """GenPPL of a swept curve at `entropy`: the curve's monotone cubic fit in log-GenPPL against entropy
    ([`gen_ppl_on_curve`]); `None` outside the swept entropy range (no extrapolation)."""
    usable = [p for p in points if p.entropy.mean is not None and p.gen_ppl.mean]
    if not usable:
        return None
    return gen_ppl_on_curve([p.entropy.mean for p in usable], [p.gen_ppl.mean for p in usable], entropy)


def _run_samples(runs: Sequence[RunRecord], sampler: str, nfe: int, value) -> list[RunSamples]:
    """Per-sample records of one sampler, NFE and knob value (`None`: main runs), by seed (a run's per-sample
    entropies `None` in reports that hold each run's mean entropy only)."""
    chosen = sorted(
        (r for r in runs if r.sampler == sampler and r.nfe == nfe and r.value == value), key=lambda r: r.seed
    )
    columns = [(run.scores.per_sample, run.scores.entropy) for run in chosen]
    return [RunSamples(each.nll_sum, each.num_tokens, each.entropy, entropy) for each, entropy in columns]


def equal_entropy_comparison(
    aggregates: Aggregates,
    curves: DiversityCurves,
    baseline: str = BASELINE,
    runs: Sequence[RunRecord] | None = None,
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> dict[str, dict[int, EqualEntropyRow]]:
    """Every other sampler against the baseline's diversity curve at the same NFE, at the sampler's own entropy.

    Returns `{sampler: {nfe: EqualEntropyRow}}`: the curve is read with [`gen_ppl_at_entropy`] (`None` where the
    sampler's entropy lies outside the swept range). With `runs` (the run records, which hold per-sample NLLs),
    `ratio_ci` is the cluster bootstrap interval of [`equal_entropy_ratio`], which re-fits the curve on every resample
    (`clusters`: the resampling unit of sample i, default every sample its own; generator 0), with `fraction_outside`
    and `entropy_resampled`; otherwise `None` (and `False`).
    """
    out: dict[str, dict[int, EqualEntropyRow]] = {}
    for sampler, by_nfe in aggregates.by_sampler.items():
        if sampler == baseline:
            continue
        for nfe, metrics in by_nfe.items():
            curve = curves.get(baseline, {}).get(nfe)
            entropy, ppl = (metrics[name].mean if name in metrics else None for name in ("entropy", "gen_ppl"))
            if not curve or entropy is None or ppl is None:
                continue
            reference = gen_ppl_at_entropy(curve, entropy)
            interval, outside, resampled = None, None, False
            candidate = [] if runs is None else _run_samples(runs, sampler, nfe, None)
            if candidate:
                points = [_run_samples(runs, baseline, nfe, None if p.default else p.value) for p in curve]
                reading = equal_entropy_ratio(
                    candidate,
                    points,
                    clusters,
                    num_resamples=num_resamples,
                    confidence=confidence,
                    generator=0,
                )
                interval, outside, resampled = reading.ratio_ci, reading.fraction_outside, reading.entropy_resampled
            ratio = None if reference is None else ppl / reference
            row = EqualEntropyRow(entropy, ppl, reference, ratio, interval, outside, resampled)
            out.setdefault(sampler, {})[nfe] = row
    return out


def _frontier(runs: Sequence[RunRecord], sampler: str, nfe: int) -> list[list[RunSamples]]:
    """A sampler's frontier at one NFE: its main runs and each swept value's runs (by seed), main first."""
    values = sorted({r.value for r in runs if r.sampler == sampler and r.nfe == nfe and not r.is_main})
    points = [_run_samples(runs, sampler, nfe, value) for value in [None, *values]]
    return [point for point in points if point]


def frontier_comparison(
    samplers: Mapping[str, SamplerSpec],
    aggregates: Aggregates,
    runs: Sequence[RunRecord],
    baseline: str = BASELINE,
    clusters: Sequence | None = None,
    num_resamples: int = 1000,
    confidence: float = 0.95,
) -> Frontiers:
    """
    Each sampler swept over the diversity knob, read on its own frontier (its main run and its swept runs) at the
    baseline's entropy (the baseline's main run): the GenPPL ratio to the baseline at equal entropy ([`frontier_ratio`],
    both re-fitted on every resample), beside the raw paired ratio (`aggregates`); and each untied sampler against the
    best other sampler (the lowest ratio at equal entropy; a sampler whose main runs are the baseline's is not one),
    both read on their own frontiers at that entropy.

    Returns [`Frontiers`], empty when no sampler but the baseline was swept. An NFE with an untied sampler and another
    method has a `head_to_head` entry, empty when no other method has a reading there.
    """
    nfes = sorted({r.nfe for r in runs if r.sampler != baseline and not r.is_main})
    by_sampler: dict[str, dict[int, FrontierRow]] = {}
    head_to_head: dict[int, list[HeadToHead]] = {}
    options = {"clusters": clusters, "num_resamples": num_resamples, "confidence": confidence, "generator": 0}
    for nfe in nfes:
        reference = _run_samples(runs, baseline, nfe, None)
        if not reference:
            continue
        frontiers = {}
        for sampler in samplers:
            frontier = _frontier(runs, sampler, nfe)
            if sampler == baseline or len(frontier) < 2:
                continue
            frontiers[sampler] = frontier
            raw = aggregates.paired.get(sampler, {}).get(nfe)
            entropies = [
                sum(run.run_entropy for run in point) / len(point)
                for point in frontier
                if all(run.run_entropy is not None for run in point)
            ]
            by_sampler.setdefault(sampler, {})[nfe] = FrontierRow.from_reading(
                frontier_ratio(frontier, reference, **options),
                len(frontier),
                frontier_entropy_range=[min(entropies), max(entropies)] if entropies else None,
                raw_ratio=None if raw is None else raw.gen_ppl_ratio,
                raw_ratio_ci=None if raw is None else raw.gen_ppl_ratio_ci,
                # its main runs are the baseline's, sample for sample: its frontier is the baseline's own
                switched_off=frontier[0] == reference,
            )
        untied = [name for name in frontiers if samplers[name].scheduler in (None, "untied")]
        # A method switched off is the baseline, not a rival.
        others = [
            (row.ratio, name)
            for name in frontiers
            if name not in untied and not (row := by_sampler[name][nfe]).switched_off and row.ratio is not None
        ]
        if not untied or len(untied) == len(frontiers):
            continue  # nothing to set against each other
        head_to_head[nfe] = []  # stays empty where no other method has a reading: the report says so
        if not others:
            continue
        best = min(others)[1]
        for name in untied:
            reading = frontier_ratio(frontiers[name], reference, frontiers[best], **options)
            head_to_head[nfe].append(HeadToHead.from_reading(name, best, reading))
    return Frontiers(by_sampler, head_to_head)


def analyse(results: dict, num_resamples: int = 1000, small_sample: bool | None = None) -> dict:
    """Computes a scored sweep's statistics from its run records, in place: the resampling unit, `aggregates`,
    `diversity_curves`, `equal_entropy` and, where samplers besides the baseline were swept, `frontiers` (a report
    is a function of its runs, so committed reports can be re-analysed).

    `small_sample` adds the few-cluster intervals and the headline rule ([`aggregate`]; `interval_rule` records
    [`INTERVAL_RULE`]). `None` (the default) keeps a report as it was first analysed: a fresh analysis (no
    `aggregates` yet) or a report that records an `interval_rule` gets them, another report does not, so committed
    reports re-render byte for byte; pass `True` to add them to such a report.
    """
    if small_sample is None:
        small_sample = "aggregates" not in results or "interval_rule" in results
    knob = results["diversity_knob"]
    family = get_family(results["family"])
    unit = family.require("resampling_unit", "Aggregating a sweep's bootstrap intervals")
    why = family.resampling_why
    clusters = resampling_clusters(results["family"], results["num_samples"], results["batch_size"])
    results["resampling_unit"] = {"unit": unit, "why": why, "stratified_by": "seed"}
    if small_sample:
        results["interval_rule"] = dict(INTERVAL_RULE)
    runs = report_records(results)
    aggregates = aggregate(
        [run for run in runs if run.is_main],
        num_resamples=num_resamples,
        clusters=clusters,
        small_sample=small_sample,
    )
    results["aggregates"] = aggregates.to_json()
    curves = diversity_curves(runs, results["diversity_default"])
    results["diversity_curves"] = curves_to_json(curves, knob)
    results["equal_entropy_fit"] = FIT_DESCRIPTION
    rows = equal_entropy_comparison(aggregates, curves, runs=runs, clusters=clusters, num_resamples=num_resamples)
    results["equal_entropy"] = equal_entropy_to_json(rows)
    samplers = {
        name: SamplerSpec.from_json(spec, f"samplers[{name!r}]")
        for name, spec in (results.get("samplers") or {}).items()
    }
    baseline = results.get("baseline", BASELINE)
    frontiers = frontier_comparison(samplers, aggregates, runs, baseline, clusters, num_resamples=num_resamples)
    if frontiers.by_sampler:  # only sweeps that swept more than the baseline (other reports hold no frontiers)
        results["frontiers"] = frontiers.to_json()
    else:
        results.pop("frontiers", None)
    return results
