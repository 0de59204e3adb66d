"""Calibration of the untied transform on a self-conditioned flow map (docs/algorithm.md "Self-conditioned flow maps").

The overlap basis comes from the network's input maps as for ELF (§4.1); the per-step cosine distance δ̄_k from
official chained trajectories, as §4.3 defines it for ELF, with the flow map's κ_k in the solver average.
"""

import torch

from ..schedulers.flowmap_statistics import FlowMapStatistics
from ..schedulers.history_directions import history_direction, solver_history_direction, token_cosine_distance
from ..schedulers.scheduling_flowmap import FlowMapLMScheduler, flowmap_kappa
from .overlap import overlap_basis


# The EMA weight of raw predictions in the statistics: 0.8, the value docs/algorithm.md §4.2 measures ELF with.
FLOWMAP_ALPHA = 0.8


@torch.no_grad()
def chained_predictions(
    transformer,
    scheduler: FlowMapLMScheduler,
    num_inference_steps: int,
    batch_size: int,
    sc_cfg_scale: float,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """
    The raw predictions p_0..p_{N−1} of one official chained run (the pre-pass at step 0, then m_{k+1} = p_k), from
    z_0 = noise_scale·randn drawn from `generator` (then the sampler's own draws).
    """
    if scheduler.config.self_conditioning != "chained":
        raise ValueError(
            "The cosine distances are measured on the chained regime (self_conditioning='chained'): a "
            "self-conditioning-free flow map has a zero SC input, which the transform leaves zero."
        )
    config = transformer.config
    scheduler.set_timesteps(num_inference_steps)
    device = transformer.device
    z = torch.randn((batch_size, config.max_length, config.latent_dim), generator=generator, device=generator.device)
    z = z.to(device) * scheduler.config.noise_scale
    predictions = []
    for k, t in enumerate(scheduler.timesteps.tolist()):
        if scheduler.needs_prepass:
            scheduler.set_prepass(transformer(z, t, source_timestep=t, sc_cfg_scale=sc_cfg_scale).sample)
        p = transformer(
            z,
            scheduler.prediction_timesteps[k],
            source_timestep=t,
            self_conditioning=scheduler.self_conditioning_input(z),
            sc_cfg_scale=sc_cfg_scale,
        ).sample
        predictions.append(p)
        z = scheduler.step(p, t, z, generator=generator).prev_sample
    return predictions


def cosine_distances(
    predictions: list[torch.Tensor], kappa: list[float], alpha: float = FLOWMAP_ALPHA
) -> torch.Tensor:
    r"""
    δ̄_k of one run, per sample (B, N): the token mean of δ̃_{k,n} = min(1, 1 − cos(H_{k,n}, G_{k,n})) with
    H_k = p_k − E_k, G_k = ‖H_k‖(p_k − O_k)/‖p_k − O_k‖, E_{k+1} = (1 − α)E_k + α p_k and O_{k+1} = (1 − κ_k)O_k + κ_k p_k
    (docs/algorithm.md §3.2, §3.3, §4.3; E_0 = O_0 = 0).
    """
    ema = torch.zeros_like(predictions[0])
    average = torch.zeros_like(predictions[0])
    rows = []
    for k, p in enumerate(predictions):
        h = history_direction(p, ema)
        g = solver_history_direction(p, h, average)
        rows.append(token_cosine_distance(h, g).mean(dim=-1))
        ema = (1 - alpha) * ema + alpha * p
        average = (1 - kappa[k]) * average + kappa[k] * p
    return torch.stack(rows, dim=1)


def flowmap_statistics(
    transformer,
    scheduler: FlowMapLMScheduler,
    num_inference_steps: list[int],
    sc_cfg_scale: float,
    num_trajectories: int = 16,
    batch_size: int = 8,
    seed: int = 0,
    alpha: float = FLOWMAP_ALPHA,
) -> FlowMapStatistics:
    """
    The statistics of [`UntiedFlowMapLMScheduler`] for `transformer`: Q and ρ² of the network's input maps
    (`overlap_basis`), and for each N the mean δ̄_k over `num_trajectories` official chained runs (batches seeded
    `seed`, `seed + 1`, …). They are the [`FlowMapPipeline`]'s optional component `flowmap_statistics`
    (`pipe.register_modules(flowmap_statistics=...)`, saved with the folder by `save_pretrained`).
    """
    basis = overlap_basis(*transformer.input_maps())
    table = {}
    for steps in num_inference_steps:
        sums, count, batch_index = None, 0, 0
        while count < num_trajectories:
            size = min(batch_size, num_trajectories - count)
            generator = torch.Generator().manual_seed(seed + batch_index)
            predictions = chained_predictions(transformer, scheduler, steps, size, sc_cfg_scale, generator)
            grid = scheduler._grid
            kappa = [
                flowmap_kappa(grid[k], grid[k + 1], scheduler.gamma, scheduler.config.sampler) for k in range(steps)
            ]
            distances = cosine_distances([p.double() for p in predictions], kappa, alpha).sum(dim=0)
            sums = distances if sums is None else sums + distances
            count, batch_index = count + size, batch_index + 1
        table[steps] = (sums / count).float()
    q, rho_sq = basis.storage_tensors()
    return FlowMapStatistics.build(
        transformer,
        q,
        rho_sq,
        table,
        solver_config={key: value for key, value in scheduler.config.items() if not key.startswith("_")},
        sc_cfg_scale=float(sc_cfg_scale),
        num_trajectories=num_trajectories,
        seed=seed,
        alpha=alpha,
    )
