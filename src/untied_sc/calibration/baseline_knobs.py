"""Choosing each comparison sampler's strength knob per NFE on the tuning bank (`untied-sc benchmark --experiment
baselines`).

A fair comparison gives every method the same chance the untied sampler gets from `untied-sc tune`
(`calibration/tune.py`, whose machinery this reuses): per NFE N and method,

1. the tuning bank is `num_samples` samples of seed `seed` in the tuning seed space (default: `tune`'s bank, 10000;
   no benchmark batch lies there), every candidate and the official sampler on the same latents and random streams
   (matched pairs);
2. the official sampler is scored once per NFE; a candidate whose entropy falls more than `max_entropy_drop` below
   it is inadmissible (`tune`'s entropy guard, [`is_admissible`]);
3. every value of the method's grid ([`KNOB_GRIDS`], small and fixed: the paper gives no value for any baseline) is
   scored, and the admissible one with the lowest GenPPL is the candidate (ties: the first in grid order);
4. it is kept only if it beats the official sampler on the bank's matched pairs (the interval of the mean per-sample
   ΔNLL lies below 0, resampling the family's unit: `tune`'s keep rule, [`beats_official`]); otherwise the method
   runs at its neutral value, where it is the official sampler bit for bit.

A grid is a coordinate of each method's own strength only; every other setting stays at the method's default
(docs/algorithm.md §9). Cost per NFE: one official run plus one run per grid value, `num_samples` samples each.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from ..defaults import TUNE_SEED
from .tune import (
    Candidate,
    _comparison_record,
    bank_scorer,
    beats_official,
    compare_with_official,
    is_admissible,
    scoring_evaluator,
)


if TYPE_CHECKING:
    from ..evaluation.statistics import PairedComparison


@dataclass(frozen=True)
class KnobGrid:
    """
    The values tried for one method: `knobs` (config keys), their `neutral` values (the official sampler) and the
    candidate `values` (one tuple per candidate, in `knobs` order); `why` says where the grid comes from.
    """

    knobs: tuple[str, ...]
    neutral: tuple[float, ...]
    values: tuple[tuple[float, ...], ...]
    why: str

    def candidates(self) -> list[dict[str, float]]:
        """The candidates as config overrides, in grid order."""
        return [dict(zip(self.knobs, values, strict=True)) for values in self.values]

    def neutral_knobs(self) -> dict[str, float]:
        """The neutral values as config overrides: the method is then the official sampler bit for bit."""
        return dict(zip(self.knobs, self.neutral, strict=True))


# [choice] Small grids around each source's default (docs/algorithm.md §9 states the sources): two to four runs per
# method and NFE.
KNOB_GRIDS = {
    "momentum": KnobGrid(
        ("momentum_beta",), (1.0,), ((0.9,), (0.8,), (0.6,)), "the source's swept β 0.9, 0.8, and a stronger 0.6"
    ),
    "higs": KnobGrid(
        ("higs_weight",),
        (0.0,),
        ((0.5,), (1.0,), (1.75,)),
        "the source's default w = 1.75 and weaker (≤ 0.5 advised under a multistep solver)",
    ),
    "ace": KnobGrid(
        ("ace_strength",), (0.0,), ((1.0,), (2.0,), (4.0,)), "the source's default λ = 2, half and double"
    ),
    "higs_ace": KnobGrid(
        ("higs_weight", "ace_strength"),
        (0.0, 0.0),
        ((0.5, 1.0), (0.5, 2.0), (1.75, 1.0), (1.75, 2.0)),
        "HiGS's w ∈ {0.5, 1.75} × ACE's λ ∈ {1, 2}",
    ),
    "multistep": KnobGrid(
        ("multistep_strength",),
        (0.0,),
        ((0.5,), (1.0,)),
        "1 = DPM-Solver++(2M), 0.5 a damped second-order term",
    ),
}


@dataclass
class KnobChoice:
    """
    One method at one NFE: the official reference, every grid candidate (its `coefficients` are the knob values),
    the `chosen` knob values, the paired comparison of the best admissible candidate with the official sampler
    (`None` when nothing was admissible) and the `outcome`: `"accepted"`, `"no admissible candidate"` or `"no win beyond
    noise"` (the last two run the neutral values).
    """

    method: str
    num_inference_steps: int
    official: Candidate
    candidates: list[Candidate]
    chosen: dict[str, float]
    outcome: str
    best_vs_official: PairedComparison | None = None
    seconds: float = 0.0
    chosen_scores: dict = field(default_factory=dict)


def choose_knob(
    method: str,
    num_inference_steps: int,
    grid: KnobGrid,
    official: Candidate,
    score,
    max_entropy_drop: float = 0.05,
    confidence: float = 0.95,
    clusters: Sequence | None = None,
) -> KnobChoice:
    """
    Steps 2-4 of the module docstring for one method at one NFE.

    Args:
        method (`str`): the comparison method (recorded).
        num_inference_steps (`int`): the NFE (recorded).
        grid ([`KnobGrid`]): the values to try.
        official ([`Candidate`]): the official sampler's scores on the bank (its entropy is the guard's floor).
        score: `score(knobs) -> (gen_ppl, entropy, nlls)` of the method with the config overrides `knobs`.
        max_entropy_drop, confidence: as in [`tune_coefficients`].
        clusters (`Sequence`, *optional*): the resampling unit of each bank sample.
    """
    began = time.perf_counter()
    floor = official.entropy - max_entropy_drop
    candidates = []
    for knobs in grid.candidates():
        ppl, entropy, nlls = score(knobs)
        candidates.append(Candidate(knobs, ppl, entropy, is_admissible(ppl, entropy, floor), list(nlls)))
    admissible = [candidate for candidate in candidates if candidate.admissible]
    best = min(admissible, key=lambda candidate: candidate.gen_ppl) if admissible else None  # first of equals
    comparison = compare_with_official(official, best, confidence, clusters) if best is not None else None
    if beats_official(comparison):
        chosen, outcome = dict(best.coefficients), "accepted"
        scores = {"gen_ppl": best.gen_ppl, "entropy": best.entropy}
    else:  # the neutral value: bitwise the official sampler
        chosen = grid.neutral_knobs()
        outcome = "no admissible candidate" if best is None else "no win beyond noise"
        scores = {"gen_ppl": official.gen_ppl, "entropy": official.entropy}
    return KnobChoice(
        method,
        num_inference_steps,
        official,
        candidates,
        chosen,
        outcome,
        comparison,
        time.perf_counter() - began,
        scores,
    )


def tune_knobs(
    pipe,
    methods: Sequence[str],
    nfe: Sequence[int],
    num_samples: int = 64,
    seed: int = TUNE_SEED,
    batch_size: int = 32,
    evaluator="smollm2-135m",
    protocol: str | None = None,
    max_entropy_drop: float = 0.05,
    confidence: float = 0.95,
    eval_batch_size: int = 8,
    grids: Mapping[str, KnobGrid] | None = None,
    progress: bool = True,
    **evaluator_kwargs,
) -> list[KnobChoice]:
    """
    Chooses each comparison method's knob at each NFE on the tuning bank (the module docstring). The pipeline's
    scheduler is left as it was; ACE methods need `pipe.ace_statistics`.

    Args:
        pipe: an [`ELFPipeline`] or [`LangFlowPipeline`].
        methods (`Sequence[str]`): comparison methods (`"momentum"`, `"higs"`, `"ace"`, `"higs_ace"`,
            `"multistep"`).
        nfe (`Sequence[int]`): the NFEs.
        num_samples, seed, batch_size, evaluator, protocol, max_entropy_drop, confidence, eval_batch_size: as in
            [`tune_coefficients`] (the same bank, guard and keep rule).
        grids (`Mapping[str, KnobGrid]`, *optional*): the grids (default [`KNOB_GRIDS`]).
        progress (`bool`, defaults to `True`): a progress bar over the scored runs.
        **evaluator_kwargs: `cache_dir`, `device`, `dtype` for [`load_evaluator`] when `evaluator` is a name.

    Returns:
        One [`KnobChoice`] per (NFE, method), NFE-major.
    """
    from ..evaluation.sampling import family_of, resampling_clusters

    grids = KNOB_GRIDS if grids is None else grids
    unknown = [method for method in methods if method not in grids]
    if unknown:
        raise ValueError(f"No knob grid for methods {unknown}; grids exist for {sorted(grids)}.")
    if num_samples < 2 or batch_size < 1:
        raise ValueError(f"Need num_samples ≥ 2 and batch_size ≥ 1; got {num_samples} and {batch_size}.")
    if max_entropy_drop < 0:
        raise ValueError(f"max_entropy_drop must be ≥ 0, got {max_entropy_drop}.")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}.")
    family = family_of(pipe)
    protocol = protocol or family
    evaluator, _ = scoring_evaluator(evaluator, **evaluator_kwargs)
    clusters = resampling_clusters(family, num_samples, batch_size)

    original_scheduler = pipe.scheduler
    progress_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    total = len(nfe) * (1 + sum(len(grids[method].values) for method in methods))
    bar = tqdm(total=total, desc="tune knobs", disable=not progress, unit="run")
    score = bank_scorer(
        pipe,
        original_scheduler.config,
        seed,
        num_samples,
        batch_size,
        evaluator,
        protocol,
        eval_batch_size,
        bar.update,
    )
    choices = []
    try:
        for n in nfe:
            official_ppl, official_entropy, official_nlls = score(n, {"scheduler": "official"})
            official = Candidate({}, official_ppl, official_entropy, True, list(official_nlls))
            for method in methods:
                choices.append(
                    choose_knob(
                        method,
                        n,
                        grids[method],
                        official,
                        lambda knobs, n=n, method=method: score(n, {"scheduler": method, **knobs}),
                        max_entropy_drop,
                        confidence,
                        clusters,
                    )
                )
    finally:
        bar.close()
        pipe.scheduler = original_scheduler
        pipe.set_progress_bar_config(**progress_config)
    return choices


def knob_record(choice: KnobChoice, grid: KnobGrid) -> dict:
    """A [`KnobChoice`] as plain JSON: the grid, every candidate's scores, the choice and the guard's outcome."""
    return {
        "knobs": list(grid.knobs),
        "neutral": grid.neutral_knobs(),
        "grid": grid.candidates(),
        "grid_source": grid.why,
        "official": {"gen_ppl": choice.official.gen_ppl, "entropy": choice.official.entropy},
        "candidates": [
            {**c.coefficients, "gen_ppl": c.gen_ppl, "entropy": c.entropy, "admissible": c.admissible}
            for c in choice.candidates
        ],
        "chosen": dict(choice.chosen),
        "chosen_scores": dict(choice.chosen_scores),
        "outcome": choice.outcome,
        "best_vs_official": _comparison_record(choice.best_vs_official),
    }
