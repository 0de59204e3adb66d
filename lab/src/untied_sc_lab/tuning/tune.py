"""`untied-sc tune`: searching η_R, η_T, η_O, α per NFE for one model on a held-out bank (docs/algorithm.md §4.4).

The paper's coefficient table covers its own checkpoints; for any other model the coefficients are searched here and
written into the pipeline's scheduler config (`coefficients_by_steps`, with the search's record in `tuning_by_steps`),
which the untied scheduler runs whenever no explicit value or preset overrides them (docs/algorithm.md §4.5).

The search is the rule every sampler is tuned by (`calibration/search.py`: the same bank in the tuning seed space,
the same budget of candidates per NFE, a coordinate search with automatic edge extension, the objective GenPPL at
official's entropy read off official's temperature curve on the bank, and the keep-or-switch-off rule at equal
entropy). The untied search starts from the calibration's coefficients (the paper preset written at calibration; the
tuning record remembers them, so tuning again restarts there instead of from the last choice: re-running gives the
same result and can switch a component back on). Where the choice is kept, the family's diversity knob (LangFlow's
temperature, ELF's decode temperature) is set on the bank so that the untied sampler runs at official's entropy
([`match_entropy`]), and stored beside the coefficients (`coefficients_by_steps[N]["temperature"]`): a plain
`pipe(num_inference_steps=N)` then runs at official's entropy; an explicit call argument overrides it. Without this
rule's keep test a small bank picks noise: on the bundled LangFlow at 8 NFE a 32-sample bank chose a candidate 1.5 %
better than official that lost by 5.5 % on the benchmark's 192 pairs.

A bank run is cached in memory, and with `store` also in a run store (`tune --store DIR`: one entry per scored run,
under the hash of its [`BankRunKey`]): a stopped tuning resumes where it stopped, and tuning the comparison samplers on
the same bank (`benchmark --experiment baselines --store DIR`) reuses official's curve.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

from tqdm.auto import tqdm

from untied_sc.defaults import (
    CURVE_VALUES,
    EXTRAPOLATE,
    TUNE_BUDGET,
    TUNE_CONFIDENCE,
    TUNE_NUM_SAMPLES,
    TUNE_SEED,  # the default tuning bank; the benchmark's default evaluation seeds are 0, 1, 2
)
from untied_sc.families import default_protocol
from untied_sc.generation import (
    Sample,
    SamplerSpec,
    build_scheduler,
    diversity_knob,
    family_of,
    generate,
    resampling_clusters,
)
from untied_sc.schedulers import (
    COEFFICIENT_NAMES,
    StepCoefficients,
    TuningRecord,
    stored_coefficients,
    stored_tuning,
    tables_config,
)
from untied_sc.seeds import check_seed

from ..evaluation.evaluator import load_evaluator
from ..evaluation.io import evaluate_samples
from ..runs.store import BankRunKey, RunStore, open_store
from .search import (
    KNOB_DEFAULTS,
    BankRun,
    EntropyMatch,
    OfficialCurve,
    SearchResult,
    curve_slope,
    match_entropy,
    tune_method,
)


def scoring_evaluator(evaluator, **evaluator_kwargs) -> tuple:
    """`(evaluator pair, name)`: a name is loaded with [`load_evaluator`] (`evaluator_kwargs`), a `(model,
    tokenizer)` pair is used as it is and named by its model."""
    if isinstance(evaluator, str):
        return load_evaluator(evaluator, **evaluator_kwargs), evaluator
    return evaluator, getattr(evaluator[0], "name_or_path", None) or type(evaluator[0]).__name__


def score_bank_samples(samples, evaluator, protocol, eval_batch_size) -> BankRun:
    """A bank run's samples scored by the `(model, tokenizer)` `evaluator` under `protocol`: the scores every tuning
    decision reads (pooled GenPPL, mean entropy, per-sample NLL sums, token counts and entropies, in bank order)."""
    result = evaluate_samples(samples, evaluator=evaluator, protocol=protocol, batch_size=eval_batch_size)
    return BankRun.from_evaluation(result)


def run_key(n: int, spec: SamplerSpec, call_kwargs: Mapping) -> str:
    """A bank run's name within one bank: a hash of its NFE, sampler spec and call arguments."""
    text = json.dumps({"nfe": n, "spec": spec.to_json(), "call": dict(call_kwargs)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def method_spec(scheduler: str, knobs: Mapping) -> SamplerSpec:
    """The spec of a tuning candidate: `scheduler` with the candidate's `knobs` (read as a spec's keys are)."""
    return SamplerSpec.from_json({"scheduler": scheduler, **knobs})


class BankScorer:
    """
    `scorer(n, spec, **call_kwargs) -> BankRun`: the sampler spec `spec` ([`build_scheduler`] from the scheduler
    config `config`) at NFE `n` with the pipeline-call arguments `call_kwargs` (a diversity knob) on the tuning bank
    (`num_samples` samples of seed `seed` in the tuning space), scored by `evaluator` under `protocol`. It leaves the
    spec's scheduler on `pipe` (the caller restores its own). Runs are cached by their [`BankRunKey`]; with `store`
    (a [`RunStore`] or its folder) each one is also stored there as it is scored (and read back instead of sampling
    again: a stopped tuning resumes). `on_sampled(spec, n, call_kwargs, texts, ids)` sees every sampled run (the
    benchmark keeps the bank's samples); a run read from the store is not sampled, so it sees none of those.
    """

    def __init__(
        self,
        pipe,
        config,
        seed: int,
        num_samples: int,
        batch_size: int,
        evaluator,
        protocol: str,
        eval_batch_size: int = 8,
        evaluator_name: str | None = None,
        store: str | os.PathLike | RunStore | None = None,
        on_scored: Callable[[], None] | None = None,
        on_sampled: Callable | None = None,
        log: Callable[[str], None] | None = None,
    ):
        self.pipe, self.config = pipe, config
        self.seed, self.num_samples, self.batch_size = seed, num_samples, batch_size
        self.evaluator, self.protocol, self.eval_batch_size = evaluator, protocol, eval_batch_size
        self.evaluator_name = evaluator_name
        self.on_scored, self.on_sampled, self.log = on_scored, on_sampled, log
        self.cache: dict[BankRunKey, BankRun] = {}
        self.store = open_store(store)
        self.sampled = 0

    def bank(self) -> dict:
        """The bank's fields of a [`BankRunKey`]: the pipeline as loaded, the bank and its scoring (a bf16 and a
        float32 evaluator differ in the last digits, so its dtype is part of it)."""
        return {
            "pipeline": str(getattr(self.pipe, "name_or_path", "") or type(self.pipe).__name__),
            "seed": self.seed,
            "seed_space": "tuning",
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "evaluator": self.evaluator_name,
            "evaluator_dtype": str(next(self.evaluator[0].parameters()).dtype).removeprefix("torch."),
            "protocol": self.protocol,
        }

    def __call__(self, n: int, spec: SamplerSpec | Mapping, **call_kwargs) -> BankRun:
        spec = SamplerSpec.of(spec)
        key = BankRunKey.of(self.bank(), n, spec, call_kwargs)
        if key in self.cache:
            return self.cache[key]
        run = None if self.store is None else self.store.bank_run(key)
        if run is None:
            began = time.perf_counter()
            self.pipe.scheduler = build_scheduler(self.pipe, spec, self.config, n)
            texts, ids, _ = generate(
                self.pipe, n, self.seed, self.num_samples, self.batch_size, seed_space="tuning", **call_kwargs
            )
            samples = [Sample(text=t, ids=i) for t, i in zip(texts, ids, strict=True)]
            if self.on_sampled is not None:
                self.on_sampled(spec, n, call_kwargs, texts, ids)
            run = score_bank_samples(samples, self.evaluator, self.protocol, self.eval_batch_size)
            self.sampled += 1
            if self.store is not None:  # written whole, then renamed: a stopped run leaves no half entry
                self.store.put_bank_run(key, run)
            if self.log is not None:
                self.log(
                    f"NFE {n} {spec.to_json()} {dict(call_kwargs) or ''}: GenPPL {run.gen_ppl:.3f}, entropy "
                    f"{run.entropy if run.entropy is None else round(run.entropy, 4)} "
                    f"({time.perf_counter() - began:.0f} s)"
                )
        self.cache[key] = run
        if self.on_scored is not None:
            self.on_scored()
        return run


@contextmanager
def bank_scoring(
    pipe,
    desc: str,
    progress: bool,
    seed: int,
    num_samples: int,
    batch_size: int,
    evaluator,
    protocol: str,
    eval_batch_size: int,
    store: str | os.PathLike | RunStore | None,
    on_sampled: Callable | None = None,
    log: Callable[[str], None] | None = None,
    evaluator_name: str | None = None,
    **evaluator_kwargs,
) -> Iterator[BankScorer]:
    """A [`BankScorer`] on `pipe` with a progress bar `desc` over its scored runs; on leaving, the bar closes and the
    pipeline gets back its scheduler and progress-bar settings (a search swaps the scheduler per run). The bank names
    a loaded evaluator `evaluator_name` where given (the user's name for it), else by its model."""
    evaluator, derived_name = scoring_evaluator(evaluator, **evaluator_kwargs)
    evaluator_name = evaluator_name or derived_name
    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    bar = tqdm(desc=desc, disable=not progress, unit="run")
    scorer = BankScorer(
        pipe,
        original_scheduler.config,
        seed,
        num_samples,
        batch_size,
        evaluator,
        protocol,
        eval_batch_size=eval_batch_size,
        evaluator_name=evaluator_name,
        store=store,
        on_scored=bar.update,
        on_sampled=on_sampled,
        log=log,
    )
    try:
        yield scorer
    finally:
        bar.close()
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)


def official_curve(
    scorer: BankScorer, n: int, knob: str, values: Sequence[float], extrapolate: float = EXTRAPOLATE
) -> OfficialCurve:
    """Official on the bank at each of the diversity knob's `values` (its default added if absent)."""
    values = list(dict.fromkeys([KNOB_DEFAULTS[knob], *map(float, values)]))
    official = SamplerSpec(scheduler="official")
    runs = [scorer(n, official, **({} if v == KNOB_DEFAULTS[knob] else {knob: v})) for v in values]
    return OfficialCurve(knob, values, runs, extrapolate)


def tune_coefficients(
    pipe,
    nfe: Sequence[int],
    num_samples: int = TUNE_NUM_SAMPLES,
    seed: int = TUNE_SEED,
    batch_size: int = 32,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    budget: int = TUNE_BUDGET,
    curve_values: Sequence[float] | None = None,
    extrapolate: float = EXTRAPOLATE,
    confidence: float = TUNE_CONFIDENCE,
    eval_batch_size: int = 8,
    match: bool = True,
    store: str | os.PathLike | RunStore | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    **evaluator_kwargs,
) -> list[SearchResult]:
    """Searches (η_R, η_T, η_O, α) per NFE on a held-out bank and writes them into the scheduler config.

    Args:
        pipe: an [`ELFPipeline`] or [`LangFlowPipeline`] whose `sampler_statistics` are calibrated at every NFE.
        nfe (`Sequence[int]`): the NFEs to tune.
        num_samples (`int`, defaults to `TUNE_NUM_SAMPLES`, 64): size of the tuning bank (samples per candidate).
        seed (`int`, defaults to `TUNE_SEED`): seed of the bank in the tuning seed space (batch b uses
            [`batch_seed`]`(seed, b, "tuning")`, never a benchmark batch); recorded with its space.
        batch_size (`int`, defaults to 32): samples per pipeline call.
        evaluator: an evaluator name for [`load_evaluator`] or a `(model, tokenizer)` pair.
        protocol (`str`, *optional*): `"elf"` or `"langflow"` (default: the pipeline's family).
        budget (`int`, defaults to 16): scored candidates per NFE (the start included, official's curve not).
        curve_values (`Sequence[float]`, *optional*): the diversity knob's values of official's curve on the bank
            (default [`CURVE_VALUES`] of the family).
        extrapolate (`float`, defaults to 0.02): nats beyond the curve's ends a candidate may lie and still be read.
        confidence (`float`, defaults to `TUNE_CONFIDENCE`, 0.95): level of the equal-entropy ratio's interval that
            must lie below 1 for the choice to replace the official sampler.
        eval_batch_size (`int`, defaults to 8): samples per evaluator forward pass.
        match (`bool`, defaults to `True`): set and store the diversity knob at which the kept choice runs at
            official's entropy.
        store (*optional*): a [`RunStore`] (or its folder) that keeps each scored bank run (a stopped tuning
            resumes from it).
        progress (`bool`, defaults to `True`): a progress bar over the scored runs.
        log (*optional*): called with one line per sampled run.

    Returns:
        One [`SearchResult`] per NFE. The scheduler config's `coefficients_by_steps` holds the chosen values (and the
        entropy-matching knob) and its `tuning_by_steps` the search's record.
    """
    statistics = getattr(pipe, "sampler_statistics", None)
    if statistics is None:
        raise ValueError(
            "This pipeline has no sampler statistics: run "
            f"`untied-sc calibrate PIPELINE_DIR --nfe {' '.join(map(str, nfe))}` before tuning."
        )
    missing = [n for n in nfe if n not in (statistics.config.calibrated_steps or [])]
    if missing:
        raise ValueError(
            f"The sampler statistics are not calibrated at NFE {missing} (calibrated: "
            f"{statistics.config.calibrated_steps}); run `untied-sc calibrate PIPELINE_DIR --nfe {' '.join(map(str, missing))}`."
        )
    check_search_options(num_samples, batch_size, budget, extrapolate, confidence)
    seed = check_seed(seed, "seed")
    family = family_of(pipe)
    protocol = protocol or default_protocol(family)
    knob = diversity_knob(family)
    curve_values = CURVE_VALUES[family] if curve_values is None else curve_values
    clusters = resampling_clusters(family, num_samples, batch_size)
    results = []
    with bank_scoring(
        pipe,
        "tune",
        progress,
        seed,
        num_samples,
        batch_size,
        evaluator,
        protocol,
        eval_batch_size,
        store,
        log=log,
        **evaluator_kwargs,
    ) as scorer:
        config = scorer.config
        for n in nfe:
            start = calibrated_coefficients(config, n) or build_scheduler(
                pipe, SamplerSpec(scheduler="untied"), config, n
            ).resolve_coefficients(n)
            curve = official_curve(scorer, n, knob, curve_values, extrapolate)
            result = tune_method(
                "untied",
                n,
                start,
                lambda knobs, n=n: scorer(n, method_spec("untied", knobs)),
                curve,
                budget,
                clusters,
                confidence,
            )
            if match and result.kept:
                result.entropy_matching = entropy_matching(
                    lambda value, n=n, chosen=result.chosen: scorer(n, method_spec("untied", chosen), **{knob: value}),
                    curve,
                    result.best.run,
                )
            results.append(result)

    bank = bank_settings(seed, num_samples, batch_size, scorer.evaluator_name, protocol, confidence)
    _write_coefficients(pipe.scheduler, results, bank)
    return results


def check_search_options(num_samples, batch_size, budget, extrapolate, confidence) -> None:
    if num_samples < 2 or batch_size < 1 or budget < 1:
        raise ValueError(
            f"Need num_samples ≥ 2, batch_size ≥ 1, budget ≥ 1; got {num_samples}, {batch_size}, {budget}."
        )
    if extrapolate < 0:
        raise ValueError(f"extrapolate must be ≥ 0 nats, got {extrapolate}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")


def bank_settings(seed, num_samples, batch_size, evaluator_name, protocol, confidence) -> dict:
    """The tuning bank as the records name it."""
    return {
        "seed": seed,
        "seed_space": "tuning",
        "num_samples": num_samples,
        "batch_size": batch_size,
        "evaluator": evaluator_name,
        "protocol": protocol,
        "confidence": confidence,
    }


def entropy_matching(score: Callable[[float], BankRun], curve: OfficialCurve, run: BankRun) -> EntropyMatch:
    """The diversity knob's value at which the kept choice (scored at the knob's default: `run`) runs at official's
    entropy on the bank ([`match_entropy`]); LangFlow's temperature stays > 0, ELF's decode temperature ≥ 0."""
    default = KNOB_DEFAULTS[curve.knob]
    lowest = 0.0 if curve.knob == "decode_temperature" else 0.05
    return match_entropy(score, curve.default.entropy, (default, run), curve_slope(curve), lowest, knob=curve.knob)


def calibrated_coefficients(scheduler_config: Mapping, num_inference_steps: int) -> dict[str, float] | None:
    """The coefficients calibration ran at for this NFE, as its tuning record remembers them (`None` if untuned); a
    record without `calibrated` gives the coefficients its search started from."""
    record = stored_tuning(scheduler_config).get(num_inference_steps)
    return None if record is None or not record.fields else record.calibrated


def chosen_scores(result: SearchResult) -> dict:
    """The bank scores of what runs: the kept pick's, or official's (the neutral value is official bit for bit)."""
    return result.best.run.scores() if result.kept else result.curve.default.scores()


def _write_coefficients(scheduler, results: Sequence[SearchResult], bank: Mapping) -> None:
    """The chosen coefficients (with the entropy-matching knob where set) and the search's record into the scheduler
    config (plain JSON floats)."""
    coefficients, tuning = stored_coefficients(scheduler.config), stored_tuning(scheduler.config)
    for result in results:
        n = result.num_inference_steps
        calibrated = calibrated_coefficients(scheduler.config, n) or result.start
        matching = result.entropy_matching
        matched = matching is not None and matching.value is not None
        coefficients[n] = StepCoefficients(
            **{name: float(result.chosen[name]) for name in COEFFICIENT_NAMES},
            knob=matching.knob if matched else None,
            knob_value=float(matching.value) if matched else None,
        )
        tuning[n] = TuningRecord(
            {
                **bank,
                "calibrated": {name: float(calibrated[name]) for name in COEFFICIENT_NAMES},
                **result.record(),
                "chosen_scores": chosen_scores(result),
            }
        )
    scheduler.register_to_config(**tables_config(coefficients, tuning))


def format_tuning(results: Sequence[SearchResult]) -> str:
    """A Markdown table of the tuning: per NFE and method official, the start, the best and what runs, with GenPPL,
    entropy and the equal-entropy objective, then the keep test and the edges."""
    lines = [
        "| NFE | method | setting | knobs | GenPPL | entropy | log-ratio at equal entropy |",
        "|---:|---|---|---|---:|---:|---:|",
    ]

    def knobs_text(knobs: Mapping) -> str:
        return ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in knobs.items())

    for result in results:
        n, curve = result.num_inference_steps, result.curve
        official = curve.default
        lines.append(f"| {n} | {result.method} | official | | {official.gen_ppl:.2f} | {official.entropy:.3f} | 0 |")
        start = result.candidates[0]
        rows = [("start", start)] + ([("best", result.best)] if result.best is not None else [])
        for label, candidate in rows:
            objective = "outside" if candidate.objective is None else f"{candidate.objective:+.4f}"
            lines.append(
                f"| {n} | {result.method} | {label} | {knobs_text(candidate.knobs)} | {candidate.run.gen_ppl:.2f} | "
                f"{candidate.run.entropy:.3f} | {objective} |"
            )
    for result in results:
        head = f"\nNFE {result.num_inference_steps}, {result.method}: {len(result.candidates)} of {result.budget} candidates"
        comparison = result.comparison
        if comparison is None or comparison.ratio is None:
            lines.append(f"{head}; no candidate inside official's curve: {result.outcome}.")
            continue
        interval = comparison.ratio_ci
        shown = "no interval (outside the curve)" if interval is None else f"[{interval[0]:.3f}, {interval[1]:.3f}]"
        edges = ", ".join(f"{name}: {state}" for name, state in result.edges.items())
        lines.append(
            f"{head}; best vs official at equal entropy on the bank: GenPPL ratio {comparison.ratio:.3f} {shown}: "
            f"{result.outcome}. Edges: {edges}."
        )
        matching = result.entropy_matching
        if matching:
            lines.append(
                f"Entropy matching: {matching.knob} = {matching.value} gives entropy {matching.entropy:.4f} (official "
                f"{matching.target_entropy:.4f})."
                if matching.value is not None
                else f"Entropy matching: the {matching.knob} cannot reach official's entropy; none stored."
            )
    return "\n".join(lines)


# Banks below these sizes are warned about: the bundled models calibrate on 64 trajectories and tune on 64 samples.
SMALL_TUNING_BANK = 32


def small_bank_warning(num_samples: int, results: Sequence | None = None) -> str | None:
    """
    Why a tuning bank of `num_samples` cannot support its result, or `None` for a bank of [`SMALL_TUNING_BANK`] or
    more: with `results`, each NFE's equal-entropy ratio and the 95 % interval it gives on that bank.
    """
    if num_samples >= SMALL_TUNING_BANK:
        return None
    intervals = []
    for result in results or ():
        if result.comparison is not None and result.comparison.ratio_ci:
            low, high = result.comparison.ratio_ci
            intervals.append(f"NFE {result.num_inference_steps}: [{low:.3f}, {high:.3f}]")
    given = f" (95 % intervals of the GenPPL ratio: {'; '.join(intervals)})" if intervals else ""
    return (
        f"warning: a tuning bank of {num_samples} samples{given} is too small to tell settings apart or to support "
        f"accepting one; the bundled models were tuned on 64 (--num-samples 64)."
    )


def stderr_log(line: str) -> None:
    """A timestamped log line on standard error (the tuning of a long run)."""
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", file=sys.stderr, flush=True)
