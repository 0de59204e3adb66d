"""A scored sweep's report: `<model>.json` (everything), `<model>.md` ([`format_markdown`]), `<model>.png`
([`plot_benchmark`]) and the scored samples `<model>.samples.jsonl.gz` ([`write_results`]).

A report renders its results only (run records and [`analyse`]'s statistics), read once into a [`Report`] record,
so a committed report re-renders byte for byte from its JSON (`benchmarks/rerender_reports.py`).
"""

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from untied_sc.generation import Sample, write_samples
from untied_sc.output_paths import report_paths  # noqa: F401  (re-exported)
from untied_sc.schedulers import COEFFICIENT_NAMES

from ..evaluation.aggregates import MeanSE, PairedSummary
from ..evaluation.curves import FIT_DESCRIPTION
from ..evaluation.evaluator import SMOLLM2_NAME
from ..evaluation.plots import plot_benchmark
from .control_records import RankAgreement
from .equal_entropy_records import Frontiers
from .provenance import RescoredFrom
from .report_record import Report
from .report_settings import SAMPLE_UNIT, ReportSettings, ResamplingUnit
from .tuning_records import KnobTuning, TuningRecord


def _fmt(stat: MeanSE | None, digits: int = 2) -> str:
    if stat is None or stat.mean is None:
        return "n/a"
    if stat.se is None:
        return f"{stat.mean:.{digits}f}"
    return f"{stat.mean:.{digits}f} ± {stat.se:.{digits}f}"


def entropy_label(settings: ReportSettings) -> str:
    """What a report's entropy column measures: the protocol's ids, with their tokenizer named."""
    if settings.protocol == "elf":
        name = "SmolLM2-135M-Instruct" if settings.evaluator == SMOLLM2_NAME else settings.evaluator
        return f"per-sample unigram entropy (nats) of the evaluator's token ids (the {name} tokenizer)"
    tokenizer = settings.generator_tokenizer
    tokenizer = (
        f"the generating model's own tokenizer: {tokenizer}" if tokenizer else "the generating model's tokenizer"
    )
    return f"per-sample unigram entropy (nats) of the generator's token ids ({tokenizer})"


def interval_label(unit: ResamplingUnit) -> str:
    """How a report's intervals were computed: the bootstrap's resampling unit, and why."""
    why = f" ({unit.why})" if unit.why else ""
    plural = {"batch": "batches", "sample": "samples"}.get(unit.unit, unit.unit)
    return f"95% paired bootstrap CIs resampling whole {plural}{why}, stratified by {unit.stratified_by}"


def cluster_count_label(settings: ReportSettings) -> str:
    """How many independent clusters a cell of the report pools: e.g. "48 independent time grids per cell (3 seeds ×
    16 batches of 8)" for ELF, whose batch shares one grid; the samples themselves for LangFlow."""
    seeds = len(settings.seeds)
    if settings.resampling_unit.unit == "batch":
        batches = -(-settings.num_samples // settings.batch_size)
        return (
            f"{seeds * batches} independent time grids per cell ({seeds} seed{'s' * (seeds != 1)} × {batches} "
            f"batch{'es' * (batches != 1)} of {settings.batch_size})"
        )
    return f"{seeds * settings.num_samples} independent samples per cell"


def interval_rule_text(settings: ReportSettings) -> str:
    """The headline interval's rule as a report states it (reports analysed with the small-sample intervals)."""
    rule = settings.interval_rule
    return (
        f"Headline intervals of the GenPPL ratio and the mean ΔNLL: with fewer than {rule.threshold_clusters} "
        f"clusters the {rule.below}, otherwise the {rule.otherwise}; † marks a t-interval (the fraction worse "
        f"keeps the cluster bootstrap). Why: {rule.why}."
    )


def _repetition_lines(report: Report) -> list[str]:
    """The repetition table: word Rep-4 beside its subword twins on generator ids (they see loops inside words)."""
    aggregates, settings = report.aggregates, report.settings
    columns = ("rep_4", "token_rep_4", "token_distinct_4", "longest_repeat")
    lines = [
        "",
        "## Repetition (mean ± SE over seeds)",
        "",
        "Rep-4: fraction of a sample's 4-grams that repeat an earlier one, on words and on generator token ids; "
        "token distinct-4: unique / all id 4-grams, pooled; longest run: the longest stretch (in generator tokens) "
        "repeating one unit of 1-4 tokens back to back, averaged over samples.",
        "",
    ]
    if not any(
        (stat := aggregates.metric(s, n, "token_rep_4")) is not None and stat.mean is not None
        for s in report.samplers
        for n in settings.nfe
    ):
        note = "" if settings.samples_file else " Its samples are not committed, so they cannot be added."
        return lines + [f"Word Rep-4 only: this report's runs were scored before the subword measures existed.{note}"]
    lines += [
        "| sampler | NFE | word Rep-4 | token Rep-4 | token distinct-4 | longest run |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for sampler in report.samplers:
        for nfe in settings.nfe:
            metrics = aggregates.metrics(sampler, nfe)
            if metrics:
                cells = [_fmt(metrics.get(name), 3 if name != "longest_repeat" else 1) for name in columns]
                lines.append(f"| {sampler} | {nfe} | " + " | ".join(cells) + " |")
    return lines


def _main_table_lines(report: Report) -> list[str]:
    """The title, the setting and the NFE × sampler table (GenPPL and entropy side by side)."""
    aggregates, settings, samplers = report.aggregates, report.settings, list(report.samplers)
    evaluator = settings.evaluator_description or settings.evaluator
    lines = [
        f"# Benchmark: {settings.model} ({settings.pipeline_class})",
        "",
        f"Evaluator: {evaluator}; protocol `{settings.protocol}`. {len(settings.seeds)} seeds "
        f"{list(settings.seeds)} × {settings.num_samples} samples, batch size {settings.batch_size}"
        + (f"; {cluster_count_label(settings)}" if settings.interval_rule is not None else "")
        + "; every official/untied pair shares its initial latent and random stream. Mean ± standard error over seeds. "
        f"Entropy: {entropy_label(settings)}."
        + (" The generation's diversity runs were not scored (`--main-only`)." if settings.main_only else ""),
        "",
        "| NFE | " + " | ".join(f"{s} GenPPL | {s} entropy" for s in samplers) + " |",
        "|---:|" + "---:|---:|" * len(samplers),
    ]
    for nfe in settings.nfe:
        cells = []
        for sampler in samplers:
            cells += [
                _fmt(aggregates.metric(sampler, nfe, "gen_ppl")),
                _fmt(aggregates.metric(sampler, nfe, "entropy"), 3),
            ]
        lines.append(f"| {nfe} | " + " | ".join(cells) + " |")
    return lines


def _paired_lines(report: Report) -> list[str]:
    """The paired comparison against the baseline: GenPPL ratio, ΔNLL/token, fraction worse, retained throughput."""
    paired, settings = report.aggregates.paired, report.settings
    if not paired:
        return []
    if settings.interval_rule is not None:
        return _paired_lines_with_rule(settings, paired)
    lines = [
        "",
        f"## Paired comparison against `{settings.baseline}` (pairs pooled over seeds)",
        "",
        f"{interval_label(settings.resampling_unit)}.",
        "",
        "| sampler | NFE | pairs | GenPPL ratio [CI] | mean ΔNLL/token [CI] | worse in [CI] | retained throughput |",
        "|---|---:|---:|---|---|---|---:|",
    ]
    for sampler, by_nfe in paired.items():
        for nfe, p in by_nfe.items():
            low, high = p.gen_ppl_ratio_ci
            d_low, d_high = p.mean_delta_ci
            w_low, w_high = p.fraction_b_worse_ci
            lines.append(
                f"| {sampler} | {nfe} | {p.num_pairs} | {p.gen_ppl_ratio:.3f} [{low:.3f}, {high:.3f}] | "
                f"{p.mean_delta:+.4f} [{d_low:+.4f}, {d_high:+.4f}] | {p.fraction_b_worse:.1%} "
                f"[{w_low:.1%}, {w_high:.1%}] | {_fmt(p.retained_throughput, 3)} |"
            )
    return lines


def _interval_text(interval: Sequence[float] | None, form: str) -> str:
    return "n/a" if interval is None else f"[{format(interval[0], form)}, {format(interval[1], form)}]"


def _paired_lines_with_rule(settings: ReportSettings, paired: Mapping[str, Mapping[int, PairedSummary]]) -> list[str]:
    """The paired comparison of a report analysed with the small-sample intervals: headline intervals by the rule,
    the clusters of each cell, and beside the cluster bootstrap the t-interval and bootstrap-t where they are few."""
    threshold = settings.interval_rule.threshold_clusters
    lines = [
        "",
        f"## Paired comparison against `{settings.baseline}` (pairs pooled over seeds)",
        "",
        f"{interval_label(settings.resampling_unit)}. {interval_rule_text(settings)}",
        "",
        "| sampler | NFE | pairs | clusters | GenPPL ratio [CI] | mean ΔNLL/token [CI] | worse in [CI] | "
        "retained throughput |",
        "|---|---:|---:|---:|---|---|---|---:|",
    ]
    few = []
    for sampler, by_nfe in paired.items():
        for nfe, p in by_nfe.items():
            mark = "†" if p.interval_method == "t" else ""
            w_low, w_high = p.fraction_b_worse_ci
            lines.append(
                f"| {sampler} | {nfe} | {p.num_pairs} | {p.num_clusters} | {p.gen_ppl_ratio:.3f} "
                f"{_interval_text(p.gen_ppl_ratio_headline_ci, '.3f')}{mark} | {p.mean_delta:+.4f} "
                f"{_interval_text(p.mean_delta_headline_ci, '+.4f')}{mark} | {p.fraction_b_worse:.1%} "
                f"[{w_low:.1%}, {w_high:.1%}] | {_fmt(p.retained_throughput, 3)} |"
            )
            spread = p.gen_ppl_ratio_t_ci is not None and p.gen_ppl_ratio_t_ci[0] < p.gen_ppl_ratio_t_ci[1]
            if p.num_clusters < threshold and spread:  # identical samples (a neutral knob): nothing to compare
                few.append((sampler, nfe, p))
    if not few:
        return lines
    lines += [
        "",
        f"### Cells with fewer than {threshold} clusters: the three intervals side by side",
        "",
        "Cluster bootstrap: percentile, clusters resampled within seeds. t: the estimate ± t(C - 1) × its "
        "linearised standard error across the C clusters (the GenPPL ratio on the log scale). Bootstrap-t: the same "
        "standard error, with the quantiles of the studentized statistic over cluster resamples (it follows skew). "
        "Cells whose two samplers drew identical samples are left out.",
        "",
        "| sampler | NFE | clusters | GenPPL ratio | bootstrap | t | bootstrap-t | mean ΔNLL/token | bootstrap | t | "
        "bootstrap-t |",
        "|---|---:|---:|---:|---|---|---|---:|---|---|---|",
    ]
    for sampler, nfe, p in few:
        ratio = [p.gen_ppl_ratio_ci, p.gen_ppl_ratio_t_ci, p.gen_ppl_ratio_bootstrap_t_ci]
        delta = [p.mean_delta_ci, p.mean_delta_t_ci, p.mean_delta_bootstrap_t_ci]
        lines.append(
            f"| {sampler} | {nfe} | {p.num_clusters} | {p.gen_ppl_ratio:.3f} | "
            + " | ".join(_interval_text(ci, ".3f") for ci in ratio)
            + f" | {p.mean_delta:+.4f} | "
            + " | ".join(_interval_text(ci, "+.4f") for ci in delta)
            + " |"
        )
    return lines


def _throughput_lines(report: Report) -> list[str]:
    """Samples/s of sampling per NFE and sampler."""
    samplers = list(report.samplers)
    lines = ["", "## Throughput (samples/s of sampling, mean ± SE over seeds)", ""]
    if len({part.device for part in report.provenance.parts}) > 1:
        lines += ["NFEs were sampled on different machines (see the end): compare samplers within a row only.", ""]
    lines += ["| NFE | " + " | ".join(samplers) + " |", "|---:|" + "---:|" * len(samplers)]
    for nfe in report.settings.nfe:
        cells = [_fmt(report.aggregates.metric(s, nfe, "samples_per_second")) for s in samplers]
        lines.append(f"| {nfe} | " + " | ".join(cells) + " |")
    return lines


def _coefficient_lines(report: Report) -> list[str]:
    """η_R, η_T, η_O, α each untied sampler ran with, by NFE (absent from reports that record none)."""
    if not report.coefficients:
        return []
    lines = ["", "## Coefficients the untied samplers ran with", ""]
    if any("alpha_scale" in spec for spec in report.samplers.values()):
        lines += ["α is an average's weight, in (0, 1]: a scaled α above 1 runs at 1.", ""]
    knob = report.settings.diversity_knob
    matched = any(knob in c for by_nfe in report.coefficients.values() for c in by_nfe.values())
    if matched:
        lines += [f"`{knob}`: the entropy-matching value `untied-sc tune` stored beside the coefficients.", ""]
    extra = f" {knob} |" if matched else ""
    lines += [
        f"| sampler | NFE | η_R | η_T | η_O | α |{extra}",
        "|---|---:|---:|---:|---:|---:|" + ("---:|" * matched),
    ]
    for sampler, by_nfe in report.coefficients.items():
        for nfe, c in by_nfe.items():
            values = " | ".join(f"{c[name]:.4g}" for name in COEFFICIENT_NAMES)
            if matched:
                values += f" | {c[knob]:.4g}" if knob in c else " | "
            lines.append(f"| {sampler} | {nfe} | {values} |")
    return lines


def _knob_value(knobs: Mapping) -> str:
    return ", ".join(
        f"{key} {value:g}" if isinstance(value, float | int) else f"{key} {value}" for key, value in knobs.items()
    )


def _not_tuned_row(sampler: str, nfe: int, grid: bool) -> str:
    """An untied sampler's row where `untied-sc tune` was not run (its coefficients calibrated or preset)."""
    empty = "| | | |" if grid else "| | | | |"
    middle = "not tuned | its coefficients (table above)" if grid else "not tuned | | its coefficients (table above)"
    return f"| {sampler} | {nfe} | {middle} {empty} calibrated or preset (`untied-sc tune` was not run) |"


def _comparison_text(record: TuningRecord) -> str:
    comparison = record.best_vs_official
    return _ratio_text(comparison.ratio, comparison.ratio_ci) if comparison else ""


def _knob_lines(
    tuning: KnobTuning | None, rescored_from: RescoredFrom | None = None, evaluator: str = ""
) -> list[str]:
    """How each sampler was tuned on the tuning bank (`--experiment baselines`): the rule, the budget, the choice, its
    bank scores and the keep rule's outcome (reports of the fixed-grid rule in their own layout). A rescored report
    (`rescored_from`, scored under `evaluator`) says its knobs were chosen under the first report's evaluator."""
    if tuning is None:
        return []
    if tuning.is_grid:
        return _grid_knob_lines(tuning)
    rule = next((record.rule for record in tuning.records() if record.rule is not None), "")  # untied alone: its own
    lines = [
        "",
        "## Samplers tuned on the tuning bank",
        "",
        f"Every sampler is tuned by one rule on one bank (seed {tuning.seed} in the {tuning.seed_space} seed "
        f"space, {tuning.num_samples} samples in batches of {tuning.batch_size}, matched with the official "
        f"sampler; evaluator {tuning.evaluator}, protocol {tuning.protocol}; {tuning.budget} scored "
        f"candidates per NFE at most): {rule}. The ratio is the pick's GenPPL over official's at the pick's entropy "
        f"on the bank, with its {tuning.confidence:.0%} cluster bootstrap interval. Bank GenPPL and entropy are "
        "what runs (official's where the method was switched off)." + _rescored_knob_note(rescored_from, evaluator),
        "",
        "| sampler | NFE | rule | candidates | chosen | bank GenPPL | bank entropy | pick vs official at equal entropy "
        "| edges | outcome |",
        "|---|---:|---|---:|---|---:|---:|---|---|---|",
    ]
    for sampler, by_nfe in tuning.untied.items():
        for nfe, record in by_nfe.items():
            if record is None:
                lines.append(_not_tuned_row(sampler, nfe, grid=False))
                continue
            scores = record.chosen_scores
            same = record.rule is not None and record.rule == rule
            tried = "" if record.candidates_tried is None else record.candidates_tried
            lines.append(
                f"| {sampler} | {nfe} | {'the same (`untied-sc tune`)' if same else record.rule or ''} | "
                f"{tried} | {_knob_value(record.chosen)} | {scores.gen_ppl:.2f} | "
                f"{scores.entropy:.3f} | {_comparison_text(record)} | {_edges_text(record)} | {record.outcome} |"
            )
    for sampler, by_nfe in tuning.samplers.items():
        for nfe, record in by_nfe.items():
            scores = record.chosen_scores
            lines.append(
                f"| {sampler} | {nfe} | the same | {record.candidates_tried} | {_knob_value(record.chosen)} | "
                f"{scores.gen_ppl:.2f} | {scores.entropy:.3f} | {_comparison_text(record)} | "
                f"{_edges_text(record)} | {record.outcome} |"
            )
    return lines


def _edges_text(record: TuningRecord) -> str:
    """Where the pick lies on each knob's line (the one rule's records), or only whether it is on an edge."""
    if record.edges is not None:
        return "; ".join(f"{name}: {state}" for name, state in record.edges.items())
    return "on an edge" if record.on_edge else ""


def _rescored_knob_note(source: RescoredFrom | None, evaluator: str) -> str:
    """A rescored report keeps the first report's knobs: they were chosen under the first evaluator."""
    if source is None:
        return ""
    return (
        f" These knobs were chosen under the first report's evaluator ({source.evaluator}) and are kept as they "
        f"were: this report scores the same samples under {evaluator} (`--rescore`), without tuning again."
    )


def _grid_knob_lines(tuning: KnobTuning) -> list[str]:
    """A report of the fixed-grid rule (a fixed grid per method, an entropy guard, raw GenPPL), in its own layout."""
    lines = [
        "",
        "## Knobs chosen on the tuning bank",
        "",
        f"Per NFE, each comparison sampler's grid was scored on the tuning bank (seed {tuning.seed} in the "
        f"{tuning.seed_space} seed space, "
        f"{tuning.num_samples} samples in batches of {tuning.batch_size}, matched with the official sampler; "
        f"evaluator {tuning.evaluator}, protocol {tuning.protocol}). A value is admissible when its entropy is "
        f"within {tuning.max_entropy_drop:g} nats of the official sampler's; the admissible value with the lowest "
        f"GenPPL is kept only if its paired mean ΔNLL vs official has a {tuning.confidence:.0%} interval below 0, "
        "otherwise the sampler runs at its neutral value (the official sampler bit for bit). Bank GenPPL and entropy "
        "are the chosen value's.",
        "",
        "| sampler | NFE | grid | chosen | bank GenPPL | bank entropy | official on bank | outcome |",
        "|---|---:|---|---|---:|---:|---:|---|",
    ]
    for sampler, by_nfe in tuning.untied.items():
        for nfe, record in by_nfe.items():
            if record is None:
                lines.append(_not_tuned_row(sampler, nfe, grid=True))
                continue
            scores = record.chosen_scores
            lines.append(
                f"| {sampler} | {nfe} | coordinate search (`untied-sc tune`, {record.seed_space or 'benchmark'} "
                f"seed {record.seed}, "
                f"{record.num_samples} samples) | {_knob_value(record.chosen)} | {scores.gen_ppl:.2f} | "
                f"{scores.entropy:.3f} | | {record.outcome} |"
            )
    for sampler, by_nfe in tuning.samplers.items():
        for nfe, record in by_nfe.items():
            grid = "; ".join(_knob_value(knobs) for knobs in record.grid)
            scores, official = record.chosen_scores, record.official
            outcome = record.outcome
            comparison = record.best_vs_official
            if comparison is not None:
                low, high = comparison.mean_delta_nll_ci
                outcome += f" (best ΔNLL {comparison.mean_delta_nll:+.4f} [{low:+.4f}, {high:+.4f}])"
            lines.append(
                f"| {sampler} | {nfe} | {grid} | {_knob_value(record.chosen)} | {scores.gen_ppl:.2f} | "
                f"{scores.entropy:.3f} | {official.gen_ppl:.2f} / {official.entropy:.3f} | {outcome} |"
            )
    return lines


def _curve_lines(report: Report) -> list[str]:
    """The GenPPL–entropy curves of the diversity sweep, point by point."""
    if not report.diversity_curves:
        return []
    knob = report.settings.diversity_knob
    lines = [
        "",
        f"## GenPPL–entropy curves ({knob} sweep; `(default)` marks the main runs)",
        "",
        f"| sampler | NFE | {knob} | GenPPL | entropy |",
        "|---|---:|---:|---|---|",
    ]
    for sampler, by_nfe in report.diversity_curves.items():
        for nfe, points in by_nfe.items():
            for point in points:
                value = "n/a" if point.value is None else f"{point.value:g}"
                value += " (default)" if point.default else ""
                lines.append(f"| {sampler} | {nfe} | {value} | {_fmt(point.gen_ppl)} | {_fmt(point.entropy, 3)} |")
    return lines


def _equal_entropy_lines(report: Report) -> list[str]:
    """Every sampler against the baseline's curve read at its entropy: the ratio and its interval."""
    if not report.equal_entropy:
        return []
    settings = report.settings
    rows = [row for by_nfe in report.equal_entropy.values() for row in by_nfe.values()]
    held = any(row.entropy_resampled is False for row in rows)
    lines = [
        "",
        f"## At equal entropy: `{settings.baseline}`'s curve read at each sampler's entropy",
        "",
        f"Curve fit: {settings.equal_entropy_fit or FIT_DESCRIPTION}; `outside` where the sampler's entropy "
        f"lies outside the swept range. {interval_label(settings.resampling_unit)}, the same resample applied to the sampler and "
        "to every point of the curve, which is re-fitted on each; no interval when more than 2.5% of the "
        "resamples fall outside the curve's range (one tail unknown)."
        + (
            " This report's runs hold no per-sample entropies (scored before they were kept), so the entropies "
            "are held at their measured values and only GenPPL is resampled."
            if held
            else ""
        ),
        "",
        f"| sampler | NFE | entropy | GenPPL | {settings.baseline} GenPPL at that entropy | ratio [CI] |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for sampler, by_nfe in report.equal_entropy.items():
        for nfe, row in by_nfe.items():
            reference, ratio, interval = row.baseline_gen_ppl_at_entropy, row.ratio, row.ratio_ci
            ratio_text = "outside" if ratio is None else f"{ratio:.3f}"
            if ratio is not None:
                if interval:
                    ratio_text += f" [{interval[0]:.3f}, {interval[1]:.3f}]"
                elif row.fraction_outside is not None:
                    ratio_text += f" (no CI: {row.fraction_outside:.0%} of resamples outside)"
            lines.append(
                f"| {sampler} | {nfe} | {row.entropy:.3f} | {row.gen_ppl:.2f} | "
                f"{'outside' if reference is None else f'{reference:.2f}'} | {ratio_text} |"
            )
    return lines


def _ratio_text(ratio: float | None, interval: Sequence[float] | None) -> str:
    if ratio is None:
        return "outside"
    return f"{ratio:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else " (no CI)")


def _frontier_lines(
    frontiers: Frontiers | None, baseline: str, knob: str, unit: ResamplingUnit = SAMPLE_UNIT
) -> list[str]:
    """The headline of a sweep whose samplers were all swept: each one's GenPPL at the `baseline`'s entropy, read on
    its own frontier (its main run and its `knob` sweep), beside its raw ratio; then each untied sampler against the
    best other at equal entropy. `unit`: the intervals' resampling unit."""
    if frontiers is None or not frontiers.by_sampler:
        return []
    lines = [
        "",
        f"## At {baseline}'s entropy, each sampler on its own frontier",
        "",
        f"Each sampler's frontier is its main run and its {knob} sweep; it is read at the entropy "
        f"of {baseline}'s main run ({FIT_DESCRIPTION}) and divided by {baseline}'s GenPPL. {interval_label(unit)}, "
        "the frontier re-fitted on every resample; `outside` where the entropy lies beyond a frontier. The raw ratio "
        "is the main runs' paired GenPPL ratio, at whatever entropy each sampler ran.",
        "",
        f"| sampler | NFE | GenPPL ratio at {baseline}'s entropy [CI] | raw ratio [CI] | frontier entropies | points |",
        "|---|---:|---|---|---|---:|",
    ]
    for sampler, by_nfe in frontiers.by_sampler.items():
        for nfe, row in by_nfe.items():
            span = row.frontier_entropy_range
            span_text = f"{span[0]:.3f}–{span[1]:.3f}" if span else ""
            lines.append(
                f"| {sampler} | {nfe} | {_ratio_text(row.ratio, row.ratio_ci)} | "
                f"{_ratio_text(row.raw_ratio, row.raw_ratio_ci)} | {span_text} | {row.points} |"
            )
    heads = frontiers.head_to_head
    if heads:
        lines += ["", f"Head to head at {baseline}'s entropy (both on their own frontiers):", ""]
    for nfe, rows in heads.items():
        for row in rows:
            lines.append(
                f"- NFE {nfe}: {row.sampler} / {row.against} (the best other there): GenPPL ratio "
                f"{_ratio_text(row.ratio, row.ratio_ci)}"
            )
        if not rows:
            lines.append(
                f"- NFE {nfe}: none: no other method has a reading at {baseline}'s entropy on its own frontier (a "
                f"method switched off runs {baseline}'s samples and is not counted)"
            )
    return lines


def _tau_text(row: RankAgreement) -> str:
    tau = "n/a" if row.kendall_tau is None else f"{row.kendall_tau:+.2f}"
    return f"τ {tau} over {row.num_ranked} sampler{'s' * (row.num_ranked != 1)}"


def _evaluator_control_lines(report: Report) -> list[str]:
    """A rescored report's control (`benchmark --rescore`): each sampler's headline under the first evaluator and
    under this one, side by side; the samplers' rank agreement per NFE; the per-sample NLL correlation."""
    control, baseline = report.evaluator_control, report.settings.baseline
    if control is None:
        return []
    first, second = control.first.short_name, control.second.short_name
    reading = {
        "frontier": f"each sampler on its own frontier at {baseline}'s entropy",
        "baseline curve": f"{baseline}'s curve read at each sampler's entropy",
    }.get(control.reading, "none in these reports (raw ratios only)")
    source = report.provenance.rescored_from
    lines = [
        "",
        f"## Evaluator control: {first} and {second} on the same samples",
        "",
        f"This report scores the samples of `{source.report}` (evaluator "
        f"{source.evaluator_description or source.evaluator}) again under {second}: the same runs and "
        "timings, and the knobs chosen on the tuning bank under the first evaluator (not tuned again). GenPPL ratios "
        f"to {baseline} at equal entropy ({reading}) and raw, each with its interval as its report gives "
        "it.",
        "",
        f"| sampler | NFE | at equal entropy, {first} [CI] | at equal entropy, {second} [CI] | raw, {first} [CI] | "
        f"raw, {second} [CI] |",
        "|---|---:|---|---|---|---|",
    ]
    for sampler, by_nfe in control.by_sampler.items():
        for nfe, row in by_nfe.items():
            cells = [
                _ratio_text(*side.ratios(raw)) if side else "n/a"
                for raw in (False, True)
                for side in (row.first, row.second)
            ]
            lines.append(f"| {sampler} | {nfe} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Rank agreement of the samplers under the two evaluators (Kendall's τ-b of their GenPPL ratios, over the "
        "samplers both reports can rank):",
        "",
    ]
    for nfe, raw in control.raw_agreement.items():
        equal = control.equal_entropy_agreement.get(nfe)
        lines.append(f"- NFE {nfe}: at equal entropy {_tau_text(equal) if equal else 'n/a'}; raw {_tau_text(raw)}")
    correlation = control.nll_correlation
    values = [correlation.pearson, correlation.spearman]
    pearson, spearman = ("n/a" if value is None else f"{value:.3f}" for value in values)
    lines += [
        "",
        f"Per-sample NLL per token under {first} and {second}: Pearson r {pearson}, Spearman ρ {spearman} over "
        f"{correlation.num_samples} distinct samples.",
    ]
    return lines


def _provenance_lines(report: Report) -> list[str]:
    """Where and how long it ran, the command(s) that reproduce it, and the runs taken from a run store (or, in the
    committed reports that record them, from an earlier report or a parts folder)."""
    lines = _where_lines(report)
    provenance = report.provenance
    reused = provenance.reused_scores
    if reused:
        lines += [
            f"Scores of {reused.runs} runs were taken from {reused.report} (`--reuse-scores`: the same samples "
            f"under the same evaluator); its run {reused.checked_run}, scored again, agreed to "
            f"{reused.checked_difference:.1g} (relative NLL).",
            "",
        ]
    parts = provenance.score_parts
    if parts and parts.read:
        lines += [
            f"Scores of {parts.read} runs were read from the parts folder {parts.folder} (`--score-parts-dir`: "
            f"each run as an earlier, stopped scoring of the same samples under the same evaluator and settings wrote "
            f"it); {parts.written} runs were scored here. The scoring time counts this process only.",
            "",
        ]
    lent = provenance.reused_samples
    if lent:
        checked = "; ".join(lent.checked_runs) or "none"
        lines += [
            f"Samples and sampling times of {lent.runs} runs were taken from {lent.report} "
            f"(`--reuse-samples`: the same runs, specs and coefficients); the first batch of each lent sampler, "
            f"sampled again here, was identical ({checked}). Their sampling times are the earlier step's, so the "
            "retained throughput of a sampler sampled here pairs runs timed in different steps, perhaps under "
            "different load: it is not a speed result.",
            "",
        ]
    store = provenance.store
    if store and (store.samples_read or store.scores_read):
        checked = "; ".join(store.checked_runs) or "none"
        lines += [
            f"Samples of {store.samples_read} runs and scores of {store.scores_read} runs were read from the "
            f"run store {store.folder} (`--store`: each found under the hash of the settings that decide it); "
            f"{store.samples_written} runs were sampled and {store.scores_written} scored here. Checked again "
            f"here: {checked}. The times of runs read from the store are the earlier steps', so a throughput that "
            "pairs runs timed in different steps is not a speed result.",
            "",
        ]
    if store and store.banks_read:
        lines += [
            f"Scores of {store.banks_read} tuning-bank runs were read from the run store {store.folder} (each "
            f"under the hash of its bank and run); {store.banks_written} bank runs were sampled and scored "
            "here.",
            "",
        ]
    bank = provenance.bank_scores_reused
    if bank:
        lines += [
            f"Scores of {bank.runs} tuning-bank runs were taken from {bank.report}; its bank run "
            f"{bank.checked_run}, scored again, agreed to {bank.checked_difference:.1g} (relative NLL).",
            "",
        ]
    return lines


def _where_lines(report: Report) -> list[str]:
    """Where and how long it ran, and the command(s) that reproduce it."""
    settings, provenance = report.settings, report.provenance
    commands = [settings.command]
    parts = provenance.parts
    if len(provenance.devices) > 1:  # parts sampled on different machines
        commands = [part.command for part in parts]
        lines = ["", "Sampled in parts, on different machines (pairs and knob choices stay within one NFE):", ""]
        lines += [
            f"- NFE {', '.join(str(n) for n in part.nfe)}: sampled in {part.seconds:.1f} s on {part.device} "
            f"with torch {part.torch}"
            for part in parts
        ]
        if settings.scoring_command is not None:
            commands.append(settings.scoring_command)
            lines += [f"- scored in {settings.scoring_seconds:.1f} s on {settings.scoring_device}"]
        return [*lines, "", "Commands:", "", "```", *commands, "```", ""]
    if settings.scoring_command is not None:  # sampled on one machine, scored on another
        commands.append(settings.scoring_command)
        where = (
            f"Sampled in {settings.sampling_seconds:.1f} s on {settings.device} with torch {settings.torch}, then "
            f"scored in {settings.scoring_seconds:.1f} s on {settings.scoring_device}. Commands:"
        )
    else:
        # with runs read from a store or an earlier report, their sampling time is not in it
        step = ""
        if provenance.reused_samples:
            step = " of this step (runs taken from an earlier report: below)"
        elif provenance.store and provenance.store.samples_read:
            step = " of this step (runs read from the run store: below)"
        where = (
            f"Wall time {settings.wall_seconds:.1f} s{step} on {settings.device} with torch {settings.torch}. Command:"
        )
    return ["", where, "", "```", *commands, "```", ""]


def format_markdown(report: Report) -> str:
    """The report as Markdown: NFE × sampler table (GenPPL and entropy side by side), paired comparison, repetition,
    throughput, coefficients, the knobs chosen on the tuning bank, curves, the equal-entropy control and how it ran
    (sections without data are left out)."""
    settings = report.settings
    sections = (
        _main_table_lines(report),
        _frontier_lines(report.frontiers, settings.baseline, settings.diversity_knob, settings.resampling_unit),
        _evaluator_control_lines(report),
        _paired_lines(report),
        _repetition_lines(report),
        _throughput_lines(report),
        _coefficient_lines(report),
        _knob_lines(report.knob_tuning, report.provenance.rescored_from, settings.evaluator),
        _curve_lines(report),
        _equal_entropy_lines(report),
        _provenance_lines(report),
    )
    return "\n".join(line for section in sections for line in section)


def write_results(
    results: dict, output_dir: str | os.PathLike, samples: Sequence[Sample] | None = None, stem: str | None = None
) -> dict[str, Path]:
    """Writes `<model>.json` (everything), `<model>.md` ([`format_markdown`]), `<model>.png` ([`plot_benchmark`]) and,
    given the scored `samples`, `<model>.samples.jsonl.gz` beside them (what the tables measured, re-scorable with
    `untied-sc evaluate`). `stem` replaces `<model>` in the names (a report re-rendered under its own file name)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    paths = report_paths(folder, stem or results["model"], samples=samples is not None)
    if samples is not None:
        paths["samples"] = write_samples(paths["samples"], samples)
    paths["json"].write_text(json.dumps(results, indent=1, default=str) + "\n")
    report = Report.from_json(results)
    paths["markdown"].write_text(format_markdown(report))
    settings = report.settings
    plot_benchmark(
        report.aggregates,
        report.diversity_curves,
        paths["plot"],
        knob=settings.diversity_knob,
        model=settings.model,
        evaluator=settings.evaluator,
        protocol=settings.protocol,
    )
    return paths
