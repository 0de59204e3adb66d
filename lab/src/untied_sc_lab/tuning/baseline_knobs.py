"""Tuning each comparison sampler per NFE on the tuning bank (`untied-sc benchmark --experiment baselines`).

Every method is tuned by the rule the untied sampler is tuned by (`calibration/search.py`; `untied-sc tune` for the
untied sampler): the same bank in the tuning seed space (default: `tune`'s bank, seed 10000, 64 samples), the same
budget of scored candidates per NFE, a coordinate search over the method's knobs ([`METHOD_KNOBS`]: its strength and
the choices its source leaves open, such as HiGS's routing) from the source's defaults ([`START`]) with automatic
edge extension, the objective GenPPL at official's entropy read off official's temperature curve on the bank, and the
keep-or-neutral rule at equal entropy. Official's curve is sampled once per NFE and shared by every method.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

from untied_sc.defaults import CURVE_VALUES, EXTRAPOLATE, TUNE_BUDGET, TUNE_CONFIDENCE, TUNE_NUM_SAMPLES, TUNE_SEED
from untied_sc.families import default_protocol
from untied_sc.generation import diversity_knob, family_of, resampling_clusters

from ..runs.store import RunStore
from .search import (
    METHOD_KNOBS,
    NEUTRAL,
    START,
    SearchResult,
    tune_method,
)
from .tune import bank_scoring, check_search_options, chosen_scores, method_spec, official_curve


def neutral_knobs(method: str) -> dict:
    """The knob values at which `method` is the official sampler bit for bit (its other knobs at their start)."""
    return {**START[method], **NEUTRAL[method]}


def search_methods(
    scorer: Callable,
    methods: Sequence[str],
    nfe: Sequence[int],
    family: str,
    knob: str,
    clusters: Sequence | None,
    budget: int = TUNE_BUDGET,
    curve_values: Sequence[float] | None = None,
    extrapolate: float = EXTRAPOLATE,
    confidence: float = TUNE_CONFIDENCE,
) -> list[SearchResult]:
    """The rule for each method at each NFE with a bank `scorer(n, spec, **call_kwargs) -> BankRun` (a live
    [`BankScorer`], or one that reads stored runs: the choice is a function of the bank's scores). NFE-major."""
    unknown = [method for method in methods if method not in START]
    if unknown:
        raise ValueError(f"No knobs for methods {unknown}; comparison methods are {sorted(START)}.")
    curve_values = CURVE_VALUES[family] if curve_values is None else curve_values
    results = []
    for n in nfe:
        curve = official_curve(scorer, n, knob, curve_values, extrapolate)
        for method in methods:
            results.append(
                tune_method(
                    method,
                    n,
                    START[method],
                    lambda knobs, n=n, method=method: scorer(n, method_spec(method, knobs)),
                    curve,
                    budget,
                    clusters,
                    confidence,
                )
            )
    return results


def tune_knobs(
    pipe,
    methods: Sequence[str],
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
    progress: bool = True,
    store: str | os.PathLike | RunStore | None = None,
    on_sampled: Callable | None = None,
    evaluator_name: str | None = None,
    log: Callable[[str], None] | None = None,
    **evaluator_kwargs,
) -> list[SearchResult]:
    """
    Tunes each comparison method at each NFE on the tuning bank (the module docstring). The pipeline's scheduler is
    left as it was; ACE methods need `pipe.ace_statistics`.

    Args:
        pipe: an [`ELFPipeline`] or [`LangFlowPipeline`].
        methods (`Sequence[str]`): comparison methods (`"momentum"`, `"higs"`, `"ace"`, `"higs_ace"`,
            `"multistep"`).
        nfe (`Sequence[int]`): the NFEs.
        num_samples, seed, batch_size, evaluator, protocol, budget, curve_values, extrapolate, confidence,
            eval_batch_size, store: as in [`tune_coefficients`] (the same bank, budget, objective and keep rule).
        progress (`bool`, defaults to `True`): a progress bar over the scored runs.
        on_sampled (*optional*): sees every sampled bank run ([`BankScorer`]).
        evaluator_name (`str`, *optional*): how the bank (and its store entries) names a loaded `evaluator`
            (default: its model's name; a name given as `evaluator` is its own).
        log (*optional*): gets a line per scored run, as [`tune_coefficients`]' (a long run without progress bars).
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        One [`SearchResult`] per (NFE, method), NFE-major.
    """
    check_search_options(num_samples, batch_size, budget, extrapolate, confidence)
    family = family_of(pipe)
    protocol = protocol or default_protocol(family)
    with bank_scoring(
        pipe,
        "tune knobs",
        progress,
        seed,
        num_samples,
        batch_size,
        evaluator,
        protocol,
        eval_batch_size,
        store,
        on_sampled,
        log=log,
        evaluator_name=evaluator_name,
        **evaluator_kwargs,
    ) as scorer:
        return search_methods(
            scorer,
            methods,
            nfe,
            family,
            diversity_knob(family),
            resampling_clusters(family, num_samples, batch_size),
            budget,
            curve_values,
            extrapolate,
            confidence,
        )


def knob_record(result: SearchResult) -> dict:
    """A method's [`SearchResult`] as plain JSON, with the bank scores of what runs (`chosen_scores`) and its
    neutral values."""
    return {**result.record(), "neutral": neutral_knobs(result.method), "chosen_scores": chosen_scores(result)}


def is_neutral(method: str, knobs: Mapping) -> bool:
    """Whether `knobs` run `method` as the official sampler bit for bit (its strength at the neutral value)."""
    return all(knobs.get(name) == value for name, value in NEUTRAL[method].items())


__all__ = ["METHOD_KNOBS", "is_neutral", "knob_record", "neutral_knobs", "search_methods", "tune_knobs"]
