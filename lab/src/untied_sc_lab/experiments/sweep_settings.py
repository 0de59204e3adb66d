"""The settings of a matched sweep as records, built once (from the command line or by a caller) and passed to
[`generate_sweep`], [`score_sweep`] and [`run_sweep`]: what is sampled ([`SweepSettings`]), how it is scored
([`ScoringSettings`]) and, for `--experiment baselines`, how the comparison samplers are tuned ([`TuningSettings`]).
Their defaults are the sweep's defaults, here only (the tuning's are `untied-sc tune`'s, from `untied_sc.defaults`)."""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from untied_sc.defaults import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_NFE,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_SEEDS,
    EXTRAPOLATE,
    SMOLLM2_NAME,
    TUNE_BUDGET,
    TUNE_CONFIDENCE,
    TUNE_NUM_SAMPLES,
    TUNE_SEED,
)

from .definitions import BASELINE


@dataclass(frozen=True)
class SweepSettings:
    """
    What a sweep samples: every sampler at every NFE and seed, and the diversity sweep.

    `num_samples` and `batch_size` are the run settings of the same names ([`RUN_SETTINGS`]): a run's key reads them
    from the generation this record produces.

    Args:
        nfe (`Sequence[int]`, defaults to `(8, 16, 32, 64)`): numbers of function evaluations.
        seeds (`Sequence[int]`, defaults to `(0, 1, 2)`): benchmark seeds; batch b of seed s uses
            [`batch_seed`]`(s, b)` for every sampler and NFE.
        num_samples (`int`, defaults to 256): samples per (sampler, NFE, seed).
        batch_size (`int`, defaults to 32): samples per pipeline call (part of the seeding: keep it fixed to compare).
        samplers (`Mapping[str, Mapping]`, defaults to `{"official": {}, "untied": {}}`): name → spec. A spec's
            `scheduler` is `"official"` or `"untied"` (default: `"official"` for the sampler named `official`, else
            `"untied"`); `temperature` / `sc_cfg_scale` / `decode_temperature` go to the pipeline call; every other
            key (`eta_r`, `eta_t`, `eta_o`, `alpha`, `coefficients`, …) overrides the scheduler config.
            `"official"` must be present: it is the baseline of the paired comparisons.
        diversity_values (`Sequence[float]`, *optional*): values of the family's diversity knob (LangFlow: temperature
            T; ELF: decode temperature) at which `diversity_samplers` also run, for GenPPL–entropy curves.
        diversity_samplers (`Sequence[str]`, defaults to `("official",)`): samplers swept over `diversity_values`.
        diversity_nfe (`Sequence[int]`, *optional*): NFEs of the diversity sweep (default: all of `nfe`).
    """

    nfe: Sequence[int] = DEFAULT_NFE
    seeds: Sequence[int] = DEFAULT_SEEDS
    num_samples: int = DEFAULT_NUM_SAMPLES
    batch_size: int = DEFAULT_BATCH_SIZE
    samplers: Mapping[str, Mapping] | None = None
    diversity_values: Sequence[float] | None = None
    diversity_samplers: Sequence[str] = (BASELINE,)
    diversity_nfe: Sequence[int] | None = None


@dataclass(frozen=True)
class ScoringSettings:
    """
    How a sweep's runs are scored and analysed.

    Args:
        evaluator: an evaluator name for [`load_evaluator`] (`"smollm2-135m"`, `"gpt2-large"`, a folder) or a
            `(model, tokenizer)` pair.
        protocol (`str`, *optional*): `"elf"` or `"langflow"`; defaults to the pipeline's family.
        eval_batch_size, max_length: passed to [`evaluate_samples`] (`batch_size`, `max_length`).
        num_resamples (`int`, defaults to 1000): bootstrap resamples of the paired statistics.
    """

    evaluator: object = SMOLLM2_NAME
    protocol: str | None = None
    eval_batch_size: int = 8
    max_length: int | None = None
    num_resamples: int = 1000


@dataclass(frozen=True)
class TuningSettings:
    """
    How the comparison samplers' knobs are chosen on the tuning bank (`--experiment baselines`, by the rule of
    `untied-sc tune`: `tuning/search.py`). The bank's batch size is the sweep's ([`SweepSettings`]).

    Args:
        seed (`int`, defaults to `TUNE_SEED`): seed of the bank in the tuning seed space (`untied-sc tune`'s bank).
        num_samples (`int`, defaults to `TUNE_NUM_SAMPLES`, 64): samples in the bank.
        budget (`int`, defaults to `TUNE_BUDGET`, 20): scored candidates per method and NFE.
        confidence (`float`, defaults to `TUNE_CONFIDENCE`, 0.95): level of the equal-entropy ratio's interval that
            must lie below 1 for a method's pick to be kept.
        curve_values (`Sequence[float]`, *optional*): the diversity knob's values of official's curve on the bank
            (default: the family's `CURVE_VALUES`).
        extrapolate (`float`, defaults to `EXTRAPOLATE`, 0.02): nats beyond the curve's ends a candidate may lie and
            still be read.
    """

    seed: int = TUNE_SEED
    num_samples: int = TUNE_NUM_SAMPLES
    budget: int = TUNE_BUDGET
    confidence: float = TUNE_CONFIDENCE
    curve_values: Sequence[float] | None = None
    extrapolate: float = EXTRAPOLATE


DEFAULT_SWEEP = SweepSettings()
DEFAULT_SCORING = ScoringSettings()
DEFAULT_TUNING = TuningSettings()
