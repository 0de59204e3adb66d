"""`untied-sc tune`: searching η_R, η_T, η_O, α per NFE for one model on a held-out bank (docs/algorithm.md §4.4).

The paper's coefficient table covers its own checkpoints; for any other model the coefficients are searched here and
written into the pipeline's scheduler config (`coefficients_by_steps`, with the search's record in `tuning_by_steps`),
which the untied scheduler runs whenever no explicit value or preset overrides them (docs/algorithm.md §4.5).

The search, per NFE N (every choice here is ours, the paper gives no procedure):
1. the tuning bank is `num_samples` samples drawn as the benchmark draws a seed, but in the tuning seed space
   (batch b from [`batch_seed`]`(seed, b, "tuning")`, `untied_sc.seeds`): no benchmark seed can draw a tuning batch,
   whatever seeds either command is given. Every candidate and the official sampler see the same latents and random
   streams, so candidates are compared on matched pairs.
2. The official sampler is scored once: its entropy is the floor. A candidate whose entropy (the protocol's unigram
   entropy) falls more than `max_entropy_drop` below the official one's is inadmissible: lowering GenPPL by lowering
   diversity is not what we tune for.
3. Coordinate search from the calibration's coefficients (the paper preset written at calibration; the tuning record
   remembers them, so tuning again restarts there instead of from the last choice: re-running gives the same result
   and can switch a component back on): for each coefficient in `COEFFICIENT_NAMES` order, try the current value
   times each of `factors` (the paper's sensitivity range ×½..×2, and ×0, which switches a component off; α is kept
   in (0, 1]), and keep the admissible candidate with the lowest pooled GenPPL; `rounds` passes.
4. The chosen candidate must beat the official sampler on matched pairs: the bootstrap confidence interval of the
   mean per-sample ΔNLL (candidate − official, per-token NLLs) must lie below 0. The bootstrap resamples the
   family's unit of shared randomness ([`resampling_unit`]): whole batches for ELF, whose batch shares one time
   grid (a 64-sample ELF bank is 2 grids, and the interval says so), single samples for LangFlow. Otherwise
   (nothing admissible, or a win within noise) the untied components are switched off (η_R = η_T = 0: bitwise the
   official sampler). Without this rule a small bank picks noise: on the bundled LangFlow at 8 NFE a 32-sample bank
   chose a candidate 1.5 % better than official that lost by 5.5 % on the benchmark's 192 pairs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from ..defaults import TUNE_SEED  # the default tuning bank; the benchmark's default evaluation seeds are 0, 1, 2
from ..schedulers.sampler_statistics import COEFFICIENT_NAMES
from ..seeds import check_seed


if TYPE_CHECKING:  # the evaluation package imports this module (the benchmark refuses tuning seeds)
    from ..evaluation.statistics import PairedComparison


TUNE_FACTORS = (0.0, 0.5, 2.0)


@dataclass
class Candidate:
    """One scored coefficient set; `nlls` are its per-sample per-token NLLs on the bank, in bank order."""

    coefficients: dict[str, float]
    gen_ppl: float
    entropy: float
    admissible: bool
    nlls: list[float] = field(default_factory=list, repr=False)


@dataclass
class TuneResult:
    """The search at one NFE: the official reference, the starting point, the chosen coefficients, every candidate.

    `best_vs_official` is the paired comparison of the search's best admissible candidate with the official sampler
    (b = candidate), or `None` when nothing was admissible; `best` is that candidate only if the comparison's ΔNLL
    interval lies below 0, otherwise the official sampler (untied components off).
    """

    num_inference_steps: int
    official: Candidate
    start: Candidate
    best: Candidate
    candidates: list[Candidate] = field(default_factory=list)
    best_vs_official: PairedComparison | None = None
    seconds: float = 0.0


def candidate_values(name: str, value: float, factors: Sequence[float]) -> list[float]:
    """The values tried for one coefficient around `value` (α stays in (0, 1]; duplicates and `value` dropped)."""
    values = []
    for factor in factors:
        candidate = value * factor
        if name == "alpha":
            if candidate <= 0:
                continue
            candidate = min(candidate, 1.0)
        if not math.isclose(candidate, value) and all(not math.isclose(candidate, v) for v in values):
            values.append(candidate)
    return values


def is_admissible(gen_ppl: float, entropy: float | None, floor: float) -> bool:
    """The entropy guard (step 2): a finite GenPPL and an entropy no lower than `floor` (official − allowed drop)."""
    return math.isfinite(gen_ppl) and entropy is not None and entropy >= floor


def compare_with_official(
    official: Candidate, candidate: Candidate, confidence: float, clusters: Sequence | None = None
) -> PairedComparison:
    """The paired comparison of the keep rule (step 4): b = `candidate`, a = the official sampler, on the bank's
    matched pairs, resampling `clusters` (the family's unit of shared randomness)."""
    from ..evaluation.statistics import paired_comparison

    # A fixed bootstrap generator: the decision is a function of the scores alone.
    return paired_comparison(official.nlls, candidate.nlls, confidence=confidence, generator=0, clusters=clusters)


def beats_official(comparison: PairedComparison | None) -> bool:
    """The keep rule (step 4): the interval of the mean per-sample ΔNLL (candidate − official) lies below 0."""
    return comparison is not None and comparison.mean_delta_ci[1] < 0


def scoring_evaluator(evaluator, **evaluator_kwargs) -> tuple:
    """`(evaluator pair, name)`: a name is loaded with [`load_evaluator`] (`evaluator_kwargs`), a `(model,
    tokenizer)` pair is used as it is and named by its model."""
    from ..evaluation.evaluator import load_evaluator

    if isinstance(evaluator, str):
        return load_evaluator(evaluator, **evaluator_kwargs), evaluator
    return evaluator, getattr(evaluator[0], "name_or_path", None) or type(evaluator[0]).__name__


def bank_scorer(pipe, config, seed, num_samples, batch_size, evaluator, protocol, eval_batch_size, on_scored=None):
    """
    `score(n, spec) -> (gen_ppl, entropy, nlls)`: the sampler spec `spec` ([`build_scheduler`] from the scheduler
    config `config`) at NFE `n` on the tuning bank (step 1: `num_samples` samples of seed `seed` in the tuning space),
    scored by the `(model, tokenizer)` `evaluator` under `protocol`; `nlls` are the per-sample per-token NLLs in bank
    order (NaN where unscored). It leaves the spec's scheduler on `pipe` (the caller restores its own) and calls
    `on_scored()` after each score.
    """
    from ..evaluation.io import Sample
    from ..evaluation.sampling import build_scheduler, generate

    def score(n: int, spec: dict) -> tuple[float, float, list[float]]:
        pipe.scheduler = build_scheduler(pipe, spec, config, n)
        texts, ids, _ = generate(pipe, n, seed, num_samples, batch_size, seed_space="tuning")
        samples = [Sample(text=t, ids=i) for t, i in zip(texts, ids, strict=True)]
        scores = score_bank_samples(samples, evaluator, protocol, eval_batch_size)
        if on_scored is not None:
            on_scored()
        return scores

    return score


def score_bank_samples(samples, evaluator, protocol, eval_batch_size) -> tuple[float, float, list[float]]:
    """`(gen_ppl, entropy, nlls)` of a bank's samples under the `(model, tokenizer)` `evaluator`: the scores every
    tuning decision reads (`nlls`: per-sample per-token NLLs in bank order, NaN where unscored)."""
    from ..evaluation.io import evaluate_samples

    result = evaluate_samples(samples, evaluator=evaluator, protocol=protocol, batch_size=eval_batch_size)
    nlls = [math.nan if r["mean_nll"] is None else r["mean_nll"] for r in result["per_sample"]]
    return result["gen_ppl"], result["entropy"], nlls


def _key(coefficients: Mapping[str, float]) -> tuple:
    return tuple(round(float(coefficients[name]), 12) for name in COEFFICIENT_NAMES)


def tune_coefficients(
    pipe,
    nfe: Sequence[int],
    num_samples: int = 64,
    seed: int = TUNE_SEED,
    batch_size: int = 32,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    factors: Sequence[float] = TUNE_FACTORS,
    rounds: int = 1,
    max_entropy_drop: float = 0.05,
    confidence: float = 0.95,
    eval_batch_size: int = 8,
    progress: bool = True,
    **evaluator_kwargs,
) -> list[TuneResult]:
    """Searches (η_R, η_T, η_O, α) per NFE on a held-out bank and writes them into `pipe.sampler_statistics`.

    Args:
        pipe: an [`ELFPipeline`] or [`LangFlowPipeline`] whose `sampler_statistics` are calibrated at every NFE.
        nfe (`Sequence[int]`): the NFEs to tune.
        num_samples (`int`, defaults to 64): size of the tuning bank (samples per candidate).
        seed (`int`, defaults to `TUNE_SEED`): seed of the bank in the tuning seed space (batch b uses
            [`batch_seed`]`(seed, b, "tuning")`, never a benchmark batch); recorded with its space.
        batch_size (`int`, defaults to 32): samples per pipeline call.
        evaluator: an evaluator name for [`load_evaluator`] or a `(model, tokenizer)` pair.
        protocol (`str`, *optional*): `"elf"` or `"langflow"` (default: the pipeline's family).
        factors (`Sequence[float]`, defaults to `(0, 0.5, 2)`): multiplicative steps of the coordinate search.
        rounds (`int`, defaults to 1): passes over the four coefficients.
        max_entropy_drop (`float`, defaults to 0.05): nats of unigram entropy a candidate may lose against the
            official sampler at the same NFE and still be admissible.
        confidence (`float`, defaults to 0.95): level of the paired bootstrap interval that must exclude 0 for the
            chosen candidate to replace the official sampler.
        eval_batch_size (`int`, defaults to 8): samples per evaluator forward pass.
        progress (`bool`, defaults to `True`): a progress bar over the scored candidates.

    Returns:
        One [`TuneResult`] per NFE. The scheduler config's `coefficients_by_steps` holds the chosen values and its
        `tuning_by_steps` records the bank, evaluator and scores.
    """
    from ..evaluation.sampling import build_scheduler, family_of, resampling_clusters
    from .migrate import migrate_pipeline

    migrate_pipeline(pipe)  # an old-layout folder: its coefficients and tuning record move to the scheduler config
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
    if num_samples < 2 or batch_size < 1 or rounds < 1:
        raise ValueError(
            f"Need num_samples ≥ 2, batch_size ≥ 1, rounds ≥ 1; got {num_samples}, {batch_size}, {rounds}."
        )
    if max_entropy_drop < 0:
        raise ValueError(f"max_entropy_drop must be ≥ 0, got {max_entropy_drop}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    seed = check_seed(seed, "seed")
    family = family_of(pipe)
    protocol = protocol or family
    evaluator, evaluator_name = scoring_evaluator(evaluator, **evaluator_kwargs)

    original_scheduler = pipe.scheduler
    config = original_scheduler.config
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    bar = tqdm(desc="tune", disable=not progress, unit="candidate")
    score = bank_scorer(pipe, config, seed, num_samples, batch_size, evaluator, protocol, eval_batch_size, bar.update)

    results = []
    try:
        for n in nfe:
            start = calibrated_coefficients(config, n) or build_scheduler(
                pipe, {"scheduler": "untied"}, config, n
            ).resolve_coefficients(n, statistics)
            results.append(
                coordinate_search(
                    n,
                    start,
                    lambda spec, n=n: score(n, spec),
                    factors,
                    rounds,
                    max_entropy_drop,
                    confidence,
                    clusters=resampling_clusters(family, num_samples, batch_size),
                )
            )
    finally:
        bar.close()
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)

    _write_coefficients(
        pipe.scheduler, results, seed, num_samples, batch_size, evaluator_name, protocol, max_entropy_drop, confidence
    )
    return results


def coordinate_search(
    num_inference_steps: int,
    start: Mapping[str, float],
    score,
    factors: Sequence[float] = TUNE_FACTORS,
    rounds: int = 1,
    max_entropy_drop: float = 0.05,
    confidence: float = 0.95,
    clusters: Sequence | None = None,
) -> TuneResult:
    """The search of one NFE (steps 2-4 of the module docstring).

    Args:
        num_inference_steps (`int`): the NFE (recorded in the result).
        start (`Mapping[str, float]`): the starting coefficients.
        score: `score(spec) -> (gen_ppl, entropy, nlls)` of a sampler spec (`{"scheduler": "official"}` or
            `{"scheduler": "untied", **coefficients}`) on the tuning bank; `nlls` are the per-sample per-token NLLs
            in bank order (NaN for a sample the evaluator could not score).
        factors, rounds, max_entropy_drop, confidence: as in [`tune_coefficients`].
        clusters (`Sequence`, *optional*): the resampling unit of each bank sample (e.g. its batch for ELF); by
            default every sample is its own.
    """
    began = time.perf_counter()
    official_ppl, official_entropy, official_nlls = score({"scheduler": "official"})
    official = Candidate(
        {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 0.0, "alpha": 1.0},
        official_ppl,
        official_entropy,
        True,
        list(official_nlls),
    )
    floor = official_entropy - max_entropy_drop
    scored: dict[tuple, Candidate] = {}

    def evaluate(coefficients: dict[str, float]) -> Candidate:
        key = _key(coefficients)
        if key not in scored:
            ppl, entropy, nlls = score({"scheduler": "untied", **coefficients})
            scored[key] = Candidate(dict(coefficients), ppl, entropy, is_admissible(ppl, entropy, floor), list(nlls))
        return scored[key]

    first = best = evaluate(dict(start))
    for _ in range(rounds):
        for name in COEFFICIENT_NAMES:
            for value in candidate_values(name, best.coefficients[name], factors):
                candidate = evaluate({**best.coefficients, name: value})
                if candidate.admissible and (not best.admissible or candidate.gen_ppl < best.gen_ppl):
                    best = candidate
    comparison = compare_with_official(official, best, confidence, clusters) if best.admissible else None
    if not beats_official(comparison):  # no win beyond noise: bitwise the official sampler
        best = Candidate(
            {**first.coefficients, "eta_r": 0.0, "eta_t": 0.0}, official_ppl, official_entropy, True, official.nlls
        )
    return TuneResult(
        num_inference_steps,
        official,
        first,
        best,
        list(scored.values()),
        comparison,
        time.perf_counter() - began,
    )


def calibrated_coefficients(scheduler_config: Mapping, num_inference_steps: int) -> dict[str, float] | None:
    """The coefficients calibration ran at for this NFE, as remembered by an earlier tuning record (`None` if
    untuned). Records written before this field existed fall back to the coefficients their search started from."""
    record = (scheduler_config.get("tuning_by_steps") or {}).get(str(num_inference_steps))
    if not record:
        return None
    source = record.get("calibrated") or record["start"]
    return {name: float(source[name]) for name in COEFFICIENT_NAMES}


def _write_coefficients(
    scheduler, results, seed, num_samples, batch_size, evaluator, protocol, max_drop, confidence
) -> None:
    """The chosen coefficients and the search's record into the scheduler config (plain JSON floats)."""
    coefficients = dict(scheduler.config.get("coefficients_by_steps") or {})
    tuning = dict(scheduler.config.get("tuning_by_steps") or {})
    for result in results:
        n = str(result.num_inference_steps)
        calibrated = calibrated_coefficients(scheduler.config, result.num_inference_steps) or result.start.coefficients
        coefficients[n] = {name: float(result.best.coefficients[name]) for name in COEFFICIENT_NAMES}
        tuning[n] = {
            "seed": seed,
            "seed_space": "tuning",
            "num_samples": num_samples,
            "batch_size": batch_size,
            "evaluator": evaluator,
            "protocol": protocol,
            "max_entropy_drop": max_drop,
            "confidence": confidence,
            "official": {"gen_ppl": result.official.gen_ppl, "entropy": result.official.entropy},
            "calibrated": dict(calibrated),
            "start": {**result.start.coefficients, "gen_ppl": result.start.gen_ppl, "entropy": result.start.entropy},
            "chosen": {**result.best.coefficients, "gen_ppl": result.best.gen_ppl, "entropy": result.best.entropy},
            "best_vs_official": _comparison_record(result.best_vs_official),
            "candidates": len(result.candidates),
        }
    scheduler.register_to_config(coefficients_by_steps=coefficients, tuning_by_steps=tuning)


def _comparison_record(comparison: PairedComparison | None) -> dict | None:
    if comparison is None:
        return None
    return {
        "num_pairs": comparison.num_pairs,
        "mean_delta_nll": comparison.mean_delta,
        "mean_delta_nll_ci": list(comparison.mean_delta_ci),
        "fraction_worse": comparison.fraction_b_worse,
    }


def format_tuning(results: Sequence[TuneResult]) -> str:
    """A Markdown table of the tuning: per NFE the official, starting and chosen coefficients with GenPPL/entropy."""
    lines = [
        "| NFE | sampler | η_R | η_T | η_O | α | GenPPL | entropy | admissible |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for result in results:
        rows = [("official", result.official), ("untied (start)", result.start), ("untied (tuned)", result.best)]
        for label, candidate in rows:
            c = candidate.coefficients
            lines.append(
                f"| {result.num_inference_steps} | {label} | {c['eta_r']:.3g} | {c['eta_t']:.3g} | {c['eta_o']:.3g} "
                f"| {c['alpha']:.3g} | {candidate.gen_ppl:.1f} | {candidate.entropy:.3f} | "
                f"{'yes' if candidate.admissible else 'no'} |"
            )
    for result in results:
        comparison = result.best_vs_official
        if comparison is None:
            lines.append(f"\nNFE {result.num_inference_steps}: no admissible candidate; the official sampler is kept.")
            continue
        low, high = comparison.mean_delta_ci
        verdict = "accepted" if high < 0 else "within noise, the official sampler is kept"
        lines.append(
            f"\nNFE {result.num_inference_steps}: best admissible candidate vs official on {comparison.num_pairs} "
            f"matched pairs: mean ΔNLL {comparison.mean_delta:+.4f} [{low:+.4f}, {high:+.4f}], worse in "
            f"{comparison.fraction_b_worse:.0%}: {verdict}."
        )
    return "\n".join(lines)
