"""Calibration: from a frozen pipeline to its SamplerStatistics (overlap basis, base scales, per-NFE statistics)."""

import copy
import inspect
import time
import warnings
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from ..defaults import BASE_SCALE_BANK_SIZE, BASE_SCALE_STEPS
from ..families import get_family
from ..per_nfe import read_steps_table, write_steps_table
from ..schedulers.coefficients import (
    StepCoefficients,
    check_coefficients,
    check_preset,
    preset_entry,
    stored_coefficients,
    stored_tuning,
    tables_config,
)
from ..schedulers.sampler_statistics import CALIBRATION_SEED, SamplerStatistics, StepStatistics, num_update_steps
from ..schedulers.scheduling_untied import UntiedSelfConditioningScheduler
from ..seeds import check_seed, generator_seed
from .base_scales import base_scales_from_gram, elf_response_gram_sums, response_gram
from .overlap import overlap_basis_from_model
from .prompts import PromptBank
from .reduction import is_main_process, process_share, sum_across_processes
from .reference import MomentAccumulator, ReferenceRecurrenceMixin, reference_recurrence


@dataclass
class CalibrationSummary:
    """What one calibrated NFE looks like (printed by the CLI)."""

    num_inference_steps: int
    active_steps: int
    mean_rms: float
    max_rms: float
    mean_cosine_distance: float
    mean_norm: float
    seconds: float
    trajectories: int


@dataclass
class CalibrationResult:
    """
    The statistics, with the coefficients calibration ran at (a preset's or the caller's, per NFE):
    [`apply_calibration`] writes them into the scheduler config for the NFEs that have none yet.
    """

    statistics: SamplerStatistics
    summaries: list[CalibrationSummary] = field(default_factory=list)
    base_scale_seconds: float = 0.0
    coefficients_by_steps: dict[int, dict[str, float]] = field(default_factory=dict)
    total_seconds: float = 0.0
    base_scale_trajectories: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    num_processes: int = 1
    generator_device: str = "cpu"
    base_scales_kept_for: list[int] = field(default_factory=list)


def bank_seeds(seed: int, bank: int, bank_size: int, batch_size: int) -> list[tuple[int, int]]:
    """(generator seed, batch size) of each batch of bank `bank` (0: B_μ, 1: B_σ) of a calibration with `seed`: the
    batches of stream 2·seed + bank in the calibration seed space (`untied_sc.seeds`), which no benchmark seed draws."""
    return _batches("calibration", 2 * seed + bank, bank_size, batch_size)


def base_scale_seeds(seed: int, bank_size: int, batch_size: int) -> list[tuple[int, int]]:
    """(generator seed, batch size) of each batch of ELF's base-scale bank of a calibration with `seed` (stream
    `seed` of the base-scale seed space)."""
    return _batches("base_scales", seed, bank_size, batch_size)


def _batches(space: str, stream: int, size: int, batch_size: int) -> list[tuple[int, int]]:
    sizes = [batch_size] * (size // batch_size) + ([size % batch_size] if size % batch_size else [])
    return [(generator_seed(space, stream, i), size) for i, size in enumerate(sizes)]


def _reference_scheduler(pipe, base_correction_scale: float, alpha: float) -> ReferenceRecurrenceMixin:
    """The reference recurrence on the pipeline's solver, configured as the untied scheduler would be."""
    untied = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, eta_r=0.0, eta_t=0.0)
    keys = type(untied)._get_init_keys(type(untied))  # the family's own keys (a config may carry others, hidden)
    config = {key: value for key, value in untied.config.items() if key in keys}
    return reference_recurrence(pipe.family, base_correction_scale, **{**config, "alpha": alpha})


def run_updates(
    pipe, scheduler, num_inference_steps: int, generator: torch.Generator, batch_size: int, prompts=None
) -> None:
    """
    Runs the update steps of one batch through the pipeline's denoising loop with `scheduler` (the reference
    recurrence, which records its corrections); LangFlow's final evaluation, which updates nothing, is skipped.
    A conditional pipeline's batch is generated from `prompts` (one per trajectory), with its guidance scale: its
    loop hands the scheduler the generated positions as the mask, so the moments exclude the held source.
    """
    update_steps = num_update_steps(scheduler.family, num_inference_steps)
    pipe.denoise(
        batch_size,
        num_inference_steps,
        generator,
        scheduler=scheduler,
        max_steps=update_steps,
        progress=False,
        **conditional_kwargs(pipe, prompts),
    )


def takes_prompts(pipe) -> bool:
    """Whether `pipe` generates from a source text (ELFText2TextPipeline: its `encode_prompt`)."""
    return callable(getattr(pipe, "encode_prompt", None))


def conditional_kwargs(pipe, prompts: list[str] | None) -> dict:
    """The denoising loop's conditioning of a batch of `prompts` (none for an unconditional pipeline)."""
    if prompts is None:
        return {}
    return {"conditioning": pipe.encode_prompt(prompts), "guidance_scale": pipe.config.guidance_scale}


def check_prompt_bank(pipe, prompts) -> PromptBank | None:
    """The prompt bank as a [`PromptBank`]: required by a conditional pipeline, refused by an unconditional one."""
    if not takes_prompts(pipe):
        if prompts is not None:
            raise ValueError(
                f"{type(pipe).__name__} is unconditional: it generates without a source text, so it is calibrated "
                "without prompts. Leave out --prompts (prompts=)."
            )
        return None
    if prompts is None:
        raise ValueError(
            f"{type(pipe).__name__} generates from a source text, so its calibration trajectories need prompts: pass "
            "--prompts FILE (prompts=), a file of source texts, one per line (or JSONL with an 'input' field), like "
            "the texts it will translate or summarise."
        )
    return prompts if isinstance(prompts, PromptBank) else PromptBank(tuple(prompts))


def _with_offsets(bank: list[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """(seed, size, index of the batch's first trajectory in the bank) of each batch."""
    offsets = [0]
    for _, size in bank[:-1]:
        offsets.append(offsets[-1] + size)
    return [(seed, size, offset) for (seed, size), offset in zip(bank, offsets, strict=True)]


def trajectory_statistics(
    pipe,
    num_inference_steps: int,
    base_correction_scale: float,
    alpha: float,
    bank_mu: list[tuple[int, int]],
    bank_sigma: list[tuple[int, int]],
    progress: bool = True,
    process_state=None,
    generator_device: str = "cpu",
    prompts: PromptBank | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """
    μ_k, σ_k, δ̄_k from the reference recurrence on two disjoint banks (eq. empirical_carrier_statistics).

    Each bank is a list of (generator seed, batch size); a batch shares ELF's random grid, as in official sampling.
    With an accelerate `process_state` of several processes, each runs its share of every bank's batches
    (`process_share`) and the float64 moment sums are added across processes before the ratios are taken: every
    process returns the same statistics, those of one process (`calibration.reduction`).
    Batch seeds seed `torch.Generator(generator_device)`: the CPU stream by default (the same statistics on any
    device), or a CUDA stream (no CPU draws to wait for; statistics of the same distribution, not the same numbers).
    A conditional pipeline's trajectory j of a bank is generated from `prompts.batch(j, 1)` (the bank cycles), and
    its moments are taken over the generated positions only.
    Returns float32 (K_u, D), (K_u,), (K_u,).
    """
    if num_inference_steps < 2:
        raise ValueError(f"num_inference_steps must be ≥ 2, got {num_inference_steps}.")
    shared = {seed for seed, _ in bank_mu} & {seed for seed, _ in bank_sigma}
    if shared:
        raise ValueError(f"The two banks overlap (shared batch seeds {sorted(shared)[:5]}); use disjoint banks.")
    for name, bank in (("B_mu", bank_mu), ("B_sigma", bank_sigma)):
        if sum(size for _, size in bank) < 2:
            raise ValueError(f"Bank {name} has fewer than 2 trajectories; use bank_size ≥ 2.")
    scheduler = _reference_scheduler(pipe, base_correction_scale, alpha)
    updates, dim = num_update_steps(scheduler.family, num_inference_steps), pipe.latent_shape[1]
    show = progress and is_main_process(process_state)
    accumulators = []
    for bank_name, bank in (("μ, δ̄", bank_mu), ("σ", bank_sigma)):
        scheduler.accumulator = MomentAccumulator(updates, dim)
        description = f"NFE {num_inference_steps}, bank {bank_name}"
        batches = process_share(_with_offsets(bank), process_state)
        for seed, size, offset in tqdm(batches, desc=description, disable=not show, leave=False):
            generator = torch.Generator(generator_device).manual_seed(seed)
            batch_prompts = None if prompts is None else prompts.batch(offset, size)
            run_updates(pipe, scheduler, num_inference_steps, generator, size, batch_prompts)
        scheduler.accumulator.load_sums(sum_across_processes(scheduler.accumulator.sums(), process_state))
        accumulators.append(scheduler.accumulator)
    mu_bank, sigma_bank = accumulators
    return mu_bank.mean().float(), sigma_bank.rms().float(), mu_bank.cosine_distance().float()


def resolve_preset_coefficients(solver: str, steps: list[int], coefficients: str | dict | None) -> dict[int, dict]:
    """
    Coefficients per NFE: a preset name, an explicit {nfe: {eta_r, eta_t, eta_o, alpha}}, or the family default
    preset. A preset covers every NFE: at one it does not list, its entry at the nearest listed NFE in log2, ties to
    the smaller NFE (`preset_entry`, docs/algorithm.md §4.5), the same rule the untied scheduler uses.
    """
    if isinstance(coefficients, dict):
        missing = [n for n in steps if n not in coefficients]
        if missing:
            raise ValueError(f"No coefficients given for NFE {missing}.")
        for n in steps:
            check_coefficients(coefficients[n], where=f" at {n} steps")
        return {n: dict(coefficients[n]) for n in steps}
    # The paper's closest system ([choice]; `untied-sc tune` replaces it with values searched for the model).
    name = coefficients or get_family(solver).require("default_preset", "Calibrating with a paper preset")
    check_preset(name, solver)
    return {n: preset_entry(name, n)[1] for n in steps}


def calibrate_pipeline(
    pipe,
    nfe: list[int],
    bank_size: int = 64,
    seed: int = CALIBRATION_SEED,
    batch_size: int = 16,
    coefficients: str | dict | None = None,
    base_scale_steps: int = BASE_SCALE_STEPS,
    base_scale_bank_size: int = BASE_SCALE_BANK_SIZE,
    progress: bool = True,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    process_state=None,
    generator_device: str = "cpu",
    prompts: PromptBank | list[str] | None = None,
) -> CalibrationResult:
    """
    Computes the pipeline's [`SamplerStatistics`] for the NFEs in `nfe`, keeping other NFEs already calibrated for
    this model (the basis and base scales are recomputed; they are deterministic).

    The network runs on the pipeline's device and in its dtype, or on `device` in `dtype` (a cast copy of the
    transformer: the pipeline itself, which the statistics are built for, is left as it is); the statistics
    accumulate in float64 whatever the network's dtype. ELF's base scales (a finite difference at ε = 1e-2, which
    bf16's 2⁻⁸ rounding would swamp) always run the network in float32, on the same device.

    Args:
        pipe ([`ELFPipeline`] or [`LangFlowPipeline`]): the frozen pipeline.
        nfe (`list[int]`): NFEs to calibrate (each ≥ 2).
        bank_size (`int`, defaults to 64): trajectories in each of the two disjoint banks B_μ and B_σ.
        seed (`int`, defaults to `CALIBRATION_SEED` = 2000): bank B_μ draws the batches of stream 2·seed of the
            calibration seed space, B_σ those of stream 2·seed + 1, and ELF's base scales stream `seed` of the
            base-scale space (`untied_sc.seeds`): disjoint from each other and from every benchmark batch by
            construction. Recorded per NFE in the statistics' `seeds`.
        batch_size (`int`, defaults to 16): trajectories per batch (an ELF batch shares one random grid).
        coefficients (`str` or `dict`, *optional*): a paper preset name or explicit coefficients per NFE; their α
            is the reference recurrence's EMA weight (recorded as `calibration_alpha`). Default: the scheduler
            config's `coefficients_by_steps` where it has the NFE, else the family's preset.
        base_scale_steps (`int`, defaults to 16), base_scale_bank_size (`int`, defaults to 32): ELF only: the NFE
            and number of trajectories of the response-Gram measurement (its own bank, independent of
            `bank_size`; batches of `batch_size`).
        progress (`bool`, defaults to `True`): show progress bars (the main process only).
        device (`str` or `torch.device`, *optional*), dtype (`torch.dtype`, *optional*): where and in which dtype
            the network runs (default: the transformer's own).
        generator_device (`str`, defaults to `"cpu"`): where the batches' generators draw. `"cpu"`: the CPU stream,
            the same statistics on every device (on a GPU the draws are made ahead on a CPU thread, which can still
            bound the run at the paper's size); `"cuda"`: a device stream, no CPU draws (statistics of the same
            distribution, not the same numbers; reproducible on one kind of GPU).
        process_state (accelerate `PartialState`, *optional*): several processes (`torchrun`, `accelerate
            launch`) split every bank's batches by index and add their float64 sums (`calibration.reduction`);
            each returns the same result, that of one process. `None`: this process runs every batch.
        prompts ([`PromptBank`] or `list[str]`, *optional*): a conditional pipeline's (ELFText2TextPipeline)
            source texts, required there and refused elsewhere: every bank's trajectory j (the base scales' too) is
            generated from prompt j mod their number, with the pipeline's guidance scale; the held source positions
            are left out of every statistic. The bank's file, fingerprint and count are recorded per NFE
            (`prompt_banks`).
    """
    seed = check_seed(seed, "seed")
    prompts = check_prompt_bank(pipe, prompts)
    nfe = sorted(set(nfe))
    if not nfe or any(not isinstance(n, int) or n < 2 for n in nfe):
        raise ValueError(f"Every NFE must be an integer ≥ 2, got {nfe}.")
    if bank_size < 2:
        raise ValueError(f"bank_size must be ≥ 2 (each bank needs at least 2 trajectories), got {bank_size}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}.")
    if base_scale_bank_size < 1 or base_scale_steps < 4:
        raise ValueError(
            f"The base scales need base_scale_bank_size ≥ 1 and base_scale_steps ≥ 4 (steps 1..K_u−2 must exist), "
            f"got {base_scale_bank_size} and {base_scale_steps}."
        )
    solver = pipe.family
    if solver == "langflow" and not pipe.transformer.config.self_conditioning:
        raise ValueError("This LangFlow model has no self-conditioning input; untied self-conditioning needs one.")
    per_nfe_coefficients = resolve_preset_coefficients(solver, nfe, coefficients)
    if coefficients is None:  # the coefficients the scheduler config already runs at (e.g. tuned) come first
        configured = stored_coefficients(pipe.scheduler.config)
        per_nfe_coefficients.update({n: configured[n].to_json() for n in nfe if n in configured})
    overlap = overlap_basis_from_model(pipe.transformer)  # from the stored weights, whatever the run's dtype
    runner = pipeline_on(pipe, device, dtype)
    run_device = runner.transformer.device
    show = progress and is_main_process(process_state)
    result = CalibrationResult(
        statistics=None,
        device=str(run_device),
        dtype=str(runner.transformer.dtype).removeprefix("torch."),
        num_processes=1 if process_state is None else process_state.num_processes,
        generator_device=str(generator_device),
    )
    if torch.device(generator_device).type not in ("cpu", "cuda"):
        raise ValueError(f"generator_device must be 'cpu' or 'cuda', got {generator_device!r}.")
    if torch.device(generator_device).type == "cuda":
        generator_device = run_device if run_device.type == "cuda" else generator_device

    steps, bank_sizes, seeds, alphas, existing_scales = _existing(pipe)
    kept = sorted(set(steps) - set(nfe))
    held = getattr(getattr(pipe, "sampler_statistics", None), "config", {}).get("prompt_banks")
    prompt_banks = {n: dict(record) for n, record in read_steps_table(held, "prompt_banks").items() if n in kept}
    calibration_start = start = _clock(run_device)
    if solver == "elf" and kept:
        # The kept NFEs' moments were measured with these base scales, and the scheduler runs them with them:
        # remeasuring (another seed, or a folder calibrated before the seed spaces) would change those NFEs' sampling.
        base_scales = existing_scales
        result.base_scales_kept_for = kept
    elif solver == "elf":
        batches = base_scale_seeds(seed, base_scale_bank_size, batch_size)
        share = process_share(batches, process_state)
        bar = tqdm(total=len(share), desc="base scales (response Gram)", disable=not show, leave=False)
        generators = [torch.Generator(generator_device).manual_seed(s) for s, _ in share]
        sizes = [size for _, size in share]
        # The response Gram is a finite difference at ε = 1e-2 of the input, coarser than float32's rounding but
        # not bf16's (2⁻⁸ relative): it runs in float32 on the run's device whatever the trajectories' dtype.
        gram_runner = pipeline_on(pipe, run_device, torch.float32)
        conditionings = None
        if prompts is not None:
            conditionings = [gram_runner.encode_prompt(prompts.batch(o, n)) for _, n, o in _with_offsets(batches)]
            conditionings = process_share(conditionings, process_state)
        gram_sum, count = elf_response_gram_sums(
            gram_runner,
            overlap,
            generators,
            sizes,
            base_scale_steps,
            progress=bar,
            conditionings=conditionings,
            guidance_scale=pipe.config.guidance_scale if prompts is not None else 1.0,
        )
        del gram_runner
        bar.close()
        totals = sum_across_processes(
            {"gram_sum": gram_sum, "count": torch.tensor(float(count), dtype=torch.float64)}, process_state
        )
        base_scales = base_scales_from_gram(response_gram(totals["gram_sum"], totals["count"].item()))
        result.base_scale_trajectories = base_scale_bank_size
    else:
        base_scales = (1.0, 1.0)  # full-rank geometry (paper Appendix "Precomputation and inference-time settings")
    result.base_scale_seconds = _clock(run_device) - start

    for n in nfe:
        start = _clock(run_device)
        bank_mu, bank_sigma = (bank_seeds(seed, bank, bank_size, batch_size) for bank in (0, 1))
        alpha = per_nfe_coefficients[n]["alpha"]
        mean, rms, distance = trajectory_statistics(
            runner, n, base_scales[1], alpha, bank_mu, bank_sigma, show, process_state, generator_device, prompts
        )
        if prompts is not None:
            prompt_banks[n] = prompts.record()
        steps[n] = StepStatistics(mean, rms, distance)
        alphas[n] = float(per_nfe_coefficients[n]["alpha"])
        result.coefficients_by_steps[n] = {k: float(v) for k, v in per_nfe_coefficients[n].items()}
        bank_sizes[n] = [bank_size, bank_size]
        seeds[n] = {"space": "calibration", "streams": [2 * seed, 2 * seed + 1]}
        result.summaries.append(_summarise(n, mean, rms, distance, _clock(run_device) - start, 2 * bank_size))
    result.total_seconds = _clock(run_device) - calibration_start

    basis, rho_sq = overlap.storage_tensors()
    solver_config = {k: v for k, v in pipe.scheduler.config.items() if not k.startswith("_")}
    result.statistics = SamplerStatistics.build(
        pipe.transformer,
        solver,
        basis,
        rho_sq,
        base_scales,
        steps,
        solver_config,
        write_steps_table(bank_sizes),
        write_steps_table(seeds),
        write_steps_table(alphas),
        prompt_banks=write_steps_table(prompt_banks),
    )
    return result


def pipeline_on(pipe, device: str | torch.device | None = None, dtype: torch.dtype | None = None):
    """
    `pipe` itself where its transformer already is on `device` in `dtype` (or neither is given); else the same
    pipeline around a copy of the transformer moved and cast there (the statistics stay those of `pipe`'s model).
    A given `dtype` is the whole network's: a transformer switched to autocast (`enable_autocast`) is copied and
    switched off, so that, say, the float32 finite differences never run in bf16.
    """
    transformer = pipe.transformer
    target_device = _device(transformer.device if device is None else device)
    target_dtype = transformer.dtype if dtype is None else dtype
    autocast = dtype is not None and getattr(transformer, "autocast_dtype", None) is not None
    if _device(transformer.device) == target_device and transformer.dtype == target_dtype and not autocast:
        return pipe
    # `torch.nn.Module.to`: diffusers' override warns on any dtype cast about float32-kept modules, none here
    copied = torch.nn.Module.to(copy.deepcopy(transformer), device=target_device, dtype=target_dtype)
    if autocast:
        copied.disable_autocast()
    components = {**pipe.components, "transformer": copied, "sampler_statistics": None}
    # The pipeline's own settings (ELF's SC-CFG scales, a conditional pipeline's source length and guidance).
    accepted = inspect.signature(type(pipe).__init__).parameters
    extra = {key: value for key, value in pipe.config.items() if key in accepted and key not in components}
    return type(pipe)(**components, **extra)


def _device(device: str | torch.device) -> torch.device:
    """One name per device: `cpu` for any CPU index (accelerate says cpu:0), `cuda:N` for `cuda`."""
    device = torch.device(device)
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _clock(device: torch.device) -> float:
    """perf_counter once the device's queued work is done (CUDA kernels run asynchronously)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def apply_calibration(pipe, result: CalibrationResult, overwrite: bool = False) -> None:
    """
    Installs `result` in `pipe`: its statistics become the `sampler_statistics` component, and the coefficients it
    ran at become the scheduler config's `coefficients_by_steps` for every NFE that has none yet (tuned values are
    kept: `untied-sc tune` chose them for this model). Where an NFE's entry holds other coefficients than those
    calibration ran at (given explicitly), `overwrite=True` replaces it, with that NFE's tuned temperature and tuning
    record; otherwise the entry is kept and a warning names both.
    """
    pipe.register_modules(sampler_statistics=result.statistics)
    current = stored_coefficients(pipe.scheduler.config)
    tuning = stored_tuning(pipe.scheduler.config)
    changed = {}
    for n, values in result.coefficients_by_steps.items():
        held = current[n].to_json() if n in current else None
        if held is not None and {name: held.get(name) for name in values} == values:
            continue
        if held is not None and not overwrite:
            warnings.warn(
                f"The scheduler config keeps its coefficients for NFE {n} ({held}); calibration ran at {values}. "
                "Pass `overwrite=True` (CLI: --overwrite) to replace them.",
                UserWarning,
                stacklevel=2,
            )
            continue
        changed[n] = StepCoefficients.stored(n, values, "")
        tuning.pop(n, None)  # the record of a tuning whose result is replaced
    if changed:
        pipe.scheduler.register_to_config(**tables_config({**current, **changed}, tuning))


def _existing(pipe) -> tuple[dict[int, StepStatistics], dict, dict, dict, tuple[float, float] | None]:
    """Calibrations already in the pipeline for this very model (kept when adding NFEs): banks, α and the base scales
    they were measured with."""
    statistics = getattr(pipe, "sampler_statistics", None)
    if statistics is None:
        return {}, {}, {}, {}, None
    try:
        statistics.check_model(pipe.transformer)
    except ValueError:
        return {}, {}, {}, {}, None
    steps = {n: statistics.for_steps(n) for n in statistics.config.calibrated_steps or []}
    config = statistics.config
    scales = tuple(float(x) for x in statistics.base_scales.tolist())
    return (
        steps,
        read_steps_table(config.bank_sizes, "bank_sizes"),
        read_steps_table(config.seeds, "seeds"),
        read_steps_table(config.calibration_alpha, "calibration_alpha"),
        scales,
    )


def _summarise(n, mean, rms, distance, seconds, trajectories) -> CalibrationSummary:
    active = rms > 0
    return CalibrationSummary(
        num_inference_steps=n,
        active_steps=int(active.sum()),
        mean_rms=rms[active].mean().item() if active.any() else 0.0,
        max_rms=rms.max().item(),
        mean_cosine_distance=distance[active].mean().item() if active.any() else 0.0,
        mean_norm=mean.norm(dim=1)[active].mean().item() if active.any() else 0.0,
        seconds=seconds,
        trajectories=trajectories,
    )


SMALL_CALIBRATION_BANK = 16


def small_bank_warning(bank_size: int) -> str | None:
    """Why a calibration bank of `bank_size` trajectories gives loose statistics, or `None` from
    [`SMALL_CALIBRATION_BANK`] on: each step statistic is a mean over the bank's trajectories, so its relative
    standard error is about 1/√B (and its 95 % interval about twice that either side)."""
    if bank_size >= SMALL_CALIBRATION_BANK:
        return None
    error = 1 / bank_size**0.5
    return (
        f"warning: a calibration bank of {bank_size} trajectories estimates each step statistic from {bank_size} "
        f"trajectories: about ±{error:.0%} relative standard error (a 95 % interval of roughly ±{min(2 * error, 1):.0%}), "
        "against ±12 % with the 64 the bundled models use (--bank-size 64)."
    )


def format_summary(result: CalibrationResult) -> str:
    """A Markdown table of the calibrated NFEs, then the calibration's cost."""
    statistics = result.statistics
    lines = [
        f"λ_R^(0) = {statistics.base_transform_exponent:.4f}, g_T^(0) = {statistics.base_correction_scale:.4f} "
        f"({result.base_scale_seconds:.1f} s); overlap rank {statistics.config.rank}",
        "",
        "| NFE | active steps | mean σ | max σ | mean δ̄ | mean ‖μ‖ | trajectories | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in result.summaries:
        lines.append(
            f"| {s.num_inference_steps} | {s.active_steps} | {s.mean_rms:.4f} | {s.max_rms:.4f} | "
            f"{s.mean_cosine_distance:.4f} | {s.mean_norm:.4f} | {s.trajectories} | {s.seconds:.1f} |"
        )
    lines += ["", format_cost(result)]
    return "\n".join(lines)


def format_cost(result: CalibrationResult) -> str:
    """One line: seconds for the base scales, each NFE and in all, and trajectories per second, with where it ran."""
    processes = f"{result.num_processes} process{'es' if result.num_processes > 1 else ''}"
    parts = [f"base scales {result.base_scale_seconds:.1f} s ({result.base_scale_trajectories} trajectories)"]
    if result.base_scales_kept_for:
        kept = ", ".join(map(str, result.base_scales_kept_for))
        parts = [f"base scales kept from the existing statistics (NFE {kept} were measured with them)"]
    elif result.base_scale_trajectories == 0:
        parts = ["base scales (1, 1): full-rank geometry, nothing to measure"]
    for s in result.summaries:
        rate = s.trajectories / s.seconds if s.seconds > 0 else float("inf")
        parts.append(f"NFE {s.num_inference_steps} {s.seconds:.1f} s ({rate:.1f} trajectories/s)")
    trajectories = sum(s.trajectories for s in result.summaries)
    rate = trajectories / result.total_seconds if result.total_seconds > 0 else float("inf")
    parts.append(f"total {result.total_seconds:.1f} s ({rate:.1f} trajectories/s over the banks)")
    return f"Cost on {result.device}, {result.dtype}, {processes}: " + "; ".join(parts)
