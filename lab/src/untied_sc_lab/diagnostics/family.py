"""What the diagnostics need to know about a model family: its forward corruption, one network evaluation, its
official scheduler and the solver time coordinate u of the paper's step-average analysis.

Everything goes through public components: the pipeline's `transformer` and `scheduler` (config), never the
pipeline's private `_predict`.
"""

import math

import torch

from untied_sc.families import get_family, untied_families


FAMILIES = untied_families()


def check_family(pipe) -> str:
    family = getattr(pipe, "family", None)
    if family not in FAMILIES:
        raise ValueError(f"Diagnostics run on ELF or LangFlow pipelines, got {type(pipe).__name__}.")
    return family


def official_scheduler(pipe):
    """The family's official scheduler, from the pipeline scheduler's config (an untied config's extra keys dropped)."""
    cls = get_family(check_family(pipe)).official_scheduler.load()
    keys = cls._get_init_keys(cls) - {"self"}
    return cls(**{key: value for key, value in pipe.scheduler.config.items() if key in keys})


def corrupt(pipe, clean: torch.Tensor, timestep: float, noise: torch.Tensor) -> torch.Tensor:
    """
    The training corruption z_t of clean latents at one time, with standard normal `noise` (ε of eq.
    (gaussian_coupling)). ELF: z_t = t·x + (1 − t)·noise_scale·ε (the interpolant, training/elf.py); LangFlow at
    γ: z = α·x + σ·ε with α² = sigmoid(−γ), σ² = sigmoid(γ) (training/langflow.py).
    """
    if check_family(pipe) == "elf":
        t = float(timestep)
        return t * clean + (1.0 - t) * pipe.scheduler.config.noise_scale * noise
    gamma = torch.as_tensor(float(timestep), dtype=torch.float64)
    alpha, sigma = torch.sigmoid(-gamma).sqrt().item(), torch.sigmoid(gamma).sqrt().item()
    return alpha * clean + sigma * noise


@torch.no_grad()
def clean_prediction(pipe, latents: torch.Tensor, timestep, self_conditioning: torch.Tensor | None) -> torch.Tensor:
    """
    One network evaluation → the clean prediction p the sampler hands its solver (float32): ELF's x̂ at the
    pipeline's SC-CFG scale; LangFlow's softmax(logits)·E_norm. `self_conditioning=None`: no self-conditioning.
    """
    transformer = pipe.transformer
    if check_family(pipe) == "elf":
        return transformer(latents, timestep, self_conditioning, pipe.sc_cfg_scale).sample.float()
    return transformer.clean_prediction(transformer(latents, timestep, self_conditioning).logits).float()


def evaluation_times(pipe, num_inference_steps: int, generator: torch.Generator) -> list[float]:
    """
    The official sampler's evaluation times for N steps (ELF: s_k, after re-noising, on a grid drawn from
    `generator`; LangFlow: γ_k, the N entries of its grid).
    """
    scheduler = official_scheduler(pipe)
    if check_family(pipe) == "elf":
        scheduler.set_timesteps(num_inference_steps, generator=generator)
    else:
        scheduler.set_timesteps(num_inference_steps, proposal=pipe.transformer.gumbel_parameters())
    return [float(t) for t in scheduler.timesteps]


def solver_time(family: str, timestep: float) -> float:
    """
    The increasing solver coordinate u of eq. (conditional_flow): ELF u = −log(1 − t); LangFlow u = −γ/2.
    """
    if family == "elf":
        return -math.log1p(-timestep)
    return -timestep / 2.0


def time_of(family: str, u: float) -> float:
    """The inverse of [`solver_time`]: ELF t = 1 − e^{−u}; LangFlow γ = −2u."""
    if family == "elf":
        return -math.expm1(-u)
    return -2.0 * u
