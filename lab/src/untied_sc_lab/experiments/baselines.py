"""The `baselines` experiment of `untied-sc benchmark`: before sampling, every check the sweep would make, then each
comparison sampler tuned per NFE on the tuning bank (`calibration/baseline_knobs.py`), its knobs written into its spec
(`knobs_by_steps`) and recorded for the report.

The untied sampler runs its own coefficients (searched by `untied-sc tune` with the same rule on the same bank: the
record says whether it was, and by which rule); the comparison samplers are tuned here, in the same run, so that one
command reproduces the whole comparison.
"""

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import torch

from untied_sc.families import default_protocol
from untied_sc.generation import SamplerSpec, check_ace_statistics, check_runs, refuse_leaked_seeds
from untied_sc.schedulers import COMPARISON_METHODS, stored_tuning
from untied_sc.seeds import check_seed

from ..tuning.baseline_knobs import knob_record, tune_knobs
from ..tuning.tune import scoring_evaluator
from .definitions import normalise_samplers
from .sweep_settings import DEFAULT_TUNING, SweepSettings, TuningSettings
from .tuning_records import AceDirection, BankScores, KnobTuning, TuningRecord, UntiedRecords


def untied_tuning_record(pipe, nfe: Sequence[int]) -> dict[int, TuningRecord | None]:
    """Per NFE, how the untied sampler's coefficients were chosen: `untied-sc tune`'s record in the scheduler config
    (its bank, rule and outcome), or `None` where they were not tuned (calibrated or preset coefficients). Records of
    the entropy-guard rule (no equal-entropy objective; the bundled folders' 32- and 64-NFE ones) say so in `rule`."""
    tuning = stored_tuning(pipe.scheduler.config)
    return {n: _untied_record(tuning[n].fields) if n in tuning and tuning[n].fields else None for n in nfe}


def _untied_record(record: Mapping) -> TuningRecord:
    """One NFE's record of `untied-sc tune` (a scheduler config's `tuning_by_steps` entry) as the report's: the one
    rule's record holds every field the report keeps (its own, such as the search's candidates, stay in the config)."""
    where = "the untied sampler's tuning record"
    record = {"seed_space": "benchmark", **record}  # records before the seed spaces: benchmark seeds
    if "rule" in record:
        return TuningRecord.from_json(record, where)
    comparison = record.get("best_vs_official")
    if comparison is None:
        outcome = "no admissible candidate"
    else:
        outcome = "accepted" if comparison["mean_delta_nll_ci"][1] < 0 else "no win beyond noise"
    guard = record.get("max_entropy_drop")
    chosen = record["chosen"]  # that rule kept the pick's bank scores beside its knobs
    return TuningRecord(
        seed=record["seed"],
        seed_space=record["seed_space"],
        num_samples=record["num_samples"],
        rule=f"earlier rule: entropy guard of {guard} nats, lowest raw GenPPL",
        chosen={key: value for key, value in chosen.items() if key not in ("gen_ppl", "entropy")},
        chosen_scores=BankScores(chosen["gen_ppl"], chosen["entropy"]),
        max_entropy_drop=guard,
        outcome=outcome,
    )


def ace_record(pipe) -> AceDirection | None:
    """Which ACE direction the ACE samplers ran with: its estimation settings and the sha256 of its values (`None`
    without the component). Parts of one comparison must share it."""
    statistics = getattr(pipe, "ace_statistics", None)
    if statistics is None:
        return None
    direction = statistics.direction.detach().to("cpu", torch.float64).contiguous().numpy().tobytes()
    sha256 = hashlib.sha256(direction).hexdigest()
    return AceDirection.from_json({**statistics.config, "direction_sha256": sha256}, "the ACE statistics' config")


def comparison_record(result) -> TuningRecord:
    """A comparison method's [`SearchResult`] as the report's record ([`knob_record`]: the search's own record, the
    bank scores of what runs and the neutral values)."""
    return TuningRecord.from_json(
        knob_record(result), f"the {result.method} search at NFE {result.num_inference_steps}"
    )


def tune_baselines(
    pipe,
    settings: SweepSettings,
    evaluator,
    tuning: TuningSettings = DEFAULT_TUNING,
    *,
    eval_batch_size: int = 8,
    protocol: str | None = None,
    progress: bool = True,
    source: str = "PIPELINE_DIR",
    store=None,
    on_sampled=None,
    evaluator_name: str | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[dict[str, SamplerSpec], KnobTuning]:
    """
    Checks the sweep up front, then tunes every comparison sampler at every NFE on the tuning bank.

    Nothing is sampled when a check fails: an evaluation seed out of range or one the pipeline was tuned, calibrated
    or ACE-estimated on (records that name no seed space, [`refuse_leaked_seeds`]); a tuning seed out of
    range; an ACE sampler without the pipeline's `ace_statistics` (the error names `untied-sc ace`); an untied
    sampler at an uncalibrated NFE. The tuning bank is drawn in the tuning seed space (`untied_sc.seeds`), which no
    benchmark, calibration or ACE batch reaches.

    Args:
        pipe: the loaded pipeline.
        settings ([`SweepSettings`]): the benchmark sweep, its `samplers` the sampler set
            ([`experiment_samplers`]`("baselines")`); the bank uses its `batch_size` too (an ELF batch shares one time
            grid).
        evaluator: an evaluator name or a loaded `(model, tokenizer)` pair.
        tuning ([`TuningSettings`], defaults to `DEFAULT_TUNING`): the bank (its seed, in the tuning seed space, and
            size) and the rule's budget, confidence, official's curve and extrapolation (`untied-sc tune`'s defaults).
        eval_batch_size, protocol, store: as in [`tune_coefficients`].
        progress (`bool`, defaults to `True`): a progress bar over the tuning runs.
        source (`str`): the pipeline as the user named it (for the commands the errors suggest).
        on_sampled (*optional*): sees every sampled bank run ([`BankScorer`]).
        evaluator_name (`str`, *optional*): how the bank names a loaded `evaluator`: the name the user gave (as
            `untied-sc tune` records it, so that both share a store's bank runs); default: its model's name.
        log (*optional*): gets a line per scored bank run (a long run without progress bars).

    Returns:
        `(samplers, record)`: the specs with each comparison sampler's chosen knobs as `knobs_by_steps`, and the
        tuning record ([`KnobTuning`]: the bank, the rule, [`comparison_record`] per sampler and NFE, and the
        untied sampler's own).
    """
    samplers = normalise_samplers(settings.samplers)
    nfe, batch_size = settings.nfe, settings.batch_size
    refuse_leaked_seeds(settings.seeds, pipe)
    tune_seed = check_seed(tuning.seed, "--tune-seed")  # the bank lies in the tuning seed space: no benchmark batch
    check_ace_statistics(pipe, samplers, source)
    check_runs(pipe, samplers, [(name, n, None, None) for n in nfe for name in samplers], source)

    methods = {name: spec.scheduler for name, spec in samplers.items() if spec.scheduler in COMPARISON_METHODS}
    evaluator, derived_name = scoring_evaluator(evaluator)
    evaluator_name = evaluator_name or derived_name
    results = tune_knobs(
        pipe,
        list(dict.fromkeys(methods.values())),
        nfe,
        num_samples=tuning.num_samples,
        seed=tune_seed,
        batch_size=batch_size,
        evaluator=evaluator,
        protocol=protocol,
        budget=tuning.budget,
        curve_values=tuning.curve_values,
        extrapolate=tuning.extrapolate,
        confidence=tuning.confidence,
        eval_batch_size=eval_batch_size,
        progress=progress,
        store=store,
        on_sampled=on_sampled,
        evaluator_name=evaluator_name,
        log=log,
    )
    bank = tuning_bank(
        tune_seed,
        tuning.num_samples,
        batch_size,
        evaluator_name,
        protocol or default_protocol(pipe.family),
        tuning.budget,
        tuning.confidence,
        ace_record(pipe),
    )
    untied = {name: untied_tuning_record(pipe, nfe) for name, spec in samplers.items() if spec.scheduler == "untied"}
    return apply_knob_choices(samplers, results, nfe, bank, untied)


def tuning_bank(
    seed: int,
    num_samples: int,
    batch_size: int,
    evaluator: str | None,
    protocol: str,
    budget: int,
    confidence: float,
    ace: AceDirection | None,
    seed_space: str = "tuning",
) -> KnobTuning:
    """The tuning bank's settings as a [`KnobTuning`] with no sampler tuned yet."""
    return KnobTuning(
        seed, seed_space, num_samples, batch_size, evaluator, protocol, confidence, budget, None, {}, {}, ace
    )


def apply_knob_choices(
    samplers: Mapping[str, SamplerSpec], results: Sequence, nfe: Sequence[int], bank: KnobTuning, untied: UntiedRecords
) -> tuple[dict[str, SamplerSpec], KnobTuning]:
    """
    The sampler specs with each comparison sampler's chosen knobs as `knobs_by_steps`, and the tuning record: the
    `bank`'s settings, [`comparison_record`] per sampler and NFE, and the untied samplers' own records (`untied`).

    Args:
        samplers (`Mapping[str, SamplerSpec]`): the normalised sampler set.
        results (`Sequence[SearchResult]`): one per (comparison method, NFE).
        nfe (`Sequence[int]`): the NFEs.
        bank ([`KnobTuning`]): the tuning bank's settings ([`tuning_bank`]: seed, size, batch size, evaluator,
            protocol, budget and the ACE direction's [`ace_record`]).
        untied (`UntiedRecords`): [`untied_tuning_record`] per untied sampler.
    """
    by_method = {(result.method, result.num_inference_steps): result for result in results}
    tuned = dict(samplers)
    methods, records = {}, {}
    for name, spec in samplers.items():
        method = spec.scheduler
        if method not in COMPARISON_METHODS:
            continue
        tuned[name] = spec.with_knobs({n: by_method[method, n].chosen for n in nfe})
        methods[name] = method
        records[name] = {n: comparison_record(by_method[method, n]) for n in nfe}
    return tuned, replace(bank, samplers=records, untied=dict(untied), methods=methods)
