"""Checks a run makes before any sampling: no evaluation seed the pipeline was tuned, calibrated or ACE-estimated on, and every sampler's statistics and coefficients in place at each of its NFEs."""

import shlex
from collections.abc import Mapping, Sequence

from ..schedulers import UntiedSelfConditioningScheduler
from ..schedulers.comparison_names import ACE_METHODS
from ..seeds import calibration_seeds, check_seed
from .sampler_spec import SamplerSpec
from .sampling import build_scheduler, tuning_seeds


def refuse_leaked_seeds(seeds: Sequence[int], pipe, option: str = "--seeds") -> None:
    """Raises when an evaluation seed is out of range or one the pipeline was tuned, calibrated or ACE-estimated on
    (the result would leak); `option` is the command-line option the error tells the user to change.

    Calibration, tuning and ACE draw in seed spaces of their own (`untied_sc.seeds`), so only records that name no
    space (e.g. the bundled folders': banks 4000 and 4001, tuning bank 10000) can name a benchmark seed."""
    for seed in seeds:
        check_seed(seed, option)
    ace = getattr(pipe, "ace_statistics", None)
    for used, what, remedy in (
        (tuning_seeds(pipe), "are the bank the sampler coefficients were tuned on (`untied-sc tune`)", ""),
        (
            calibration_seeds(getattr(pipe, "sampler_statistics", None)),
            "drew the trajectory banks the sampler statistics were calibrated on (`untied-sc calibrate --seed`)",
            " or recalibrate (new banks lie in the calibration seed space)",
        ),
        (
            ace.benchmark_seeds if ace is not None else set(),
            "drew the trajectories ACE's direction was estimated on",
            "",
        ),
    ):
        leaked = sorted(set(seeds) & used)
        if leaked:
            raise ValueError(f"Seeds {leaked} {what}; evaluating on them would leak. Choose other {option}{remedy}.")


def check_ace_statistics(pipe, samplers: Mapping[str, SamplerSpec | Mapping], source: str = "PIPELINE_DIR") -> None:
    """Before any sampling: the ACE samplers need the pipeline's `ace_statistics` (ACE's repetition direction, for
    this model); one error naming them and the `untied-sc ace` command that estimates it."""
    needing = [name for name, spec in samplers.items() if SamplerSpec.of(spec).scheduler in ACE_METHODS]
    if not needing:
        return
    ace_statistics = getattr(pipe, "ace_statistics", None)
    if ace_statistics is None:
        raise ValueError(
            f"Samplers {', '.join(map(repr, needing))} need ACE's repetition direction, and the pipeline has no "
            f"`ace_statistics` component. Nothing was sampled. Estimate it first with `untied-sc ace "
            f"{shlex.quote(source)}` (400 official trajectories of 64 NFE: minutes on a GPU, hours on a CPU)."
        )
    ace_statistics.check_model(pipe.transformer)


def check_runs(pipe, samplers: Mapping[str, SamplerSpec | Mapping], plan, source: str = "PIPELINE_DIR") -> None:
    """Before any sampling: every untied sampler's coefficients resolve at each of its NFEs, and the sampler statistics
    are calibrated at every NFE an untied sampler needs them at (one error naming all the missing NFEs and the
    `untied-sc calibrate` command that adds them, which also writes coefficients for NFEs that have none), so that a
    sweep never fails after minutes of sampling."""
    statistics = getattr(pipe, "sampler_statistics", None)
    calibrated = set(statistics.config.calibrated_steps or []) if statistics is not None else set()
    missing: dict[int, list[str]] = {}
    for sampler, n in dict.fromkeys((sampler, n) for sampler, n, _, _ in plan):
        spec = SamplerSpec.of(samplers[sampler], f"samplers[{sampler!r}]")
        try:
            scheduler = build_scheduler(pipe, spec, pipe.scheduler.config, n)
            if not isinstance(scheduler, UntiedSelfConditioningScheduler):
                continue
            coefficients = scheduler.resolve_coefficients(n)
        except (ValueError, KeyError) as error:
            if n in calibrated or spec.scheduler != "untied":
                raise ValueError(f"Sampler {sampler!r} at NFE {n}: {error}") from error
            coefficients = None  # unresolvable at an uncalibrated NFE: calibrating it writes its coefficients too
        needs_statistics = coefficients is None or coefficients["eta_r"] > 0 or coefficients["eta_t"] > 0
        if needs_statistics and n not in calibrated:
            missing.setdefault(n, []).append(sampler)
    if missing:
        where = "; ".join(f"NFE {n} (samplers {', '.join(map(repr, s))})" for n, s in sorted(missing.items()))
        have = f"calibrated NFEs: {sorted(calibrated)}" if statistics is not None else "no sampler statistics"
        raise ValueError(
            f"The untied samplers need sampler statistics at {where}, and the pipeline has {have}. Nothing was "
            f"sampled. Run `untied-sc calibrate {shlex.quote(source)} --nfe {' '.join(map(str, sorted(missing)))}` "
            "first, or leave those NFEs out of --nfe / --diversity-nfe."
        )
