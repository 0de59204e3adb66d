"""The controls of the solver correction's direction: paper Table "Controls for the solver correction"
(`tab:direction_controls`, Table 12, App. C.9) and docs/algorithm.md §3.8.

Each control replaces the history-based direction U_k (eq. (10)) by another direction before the moment projection
Π_k (eq. (11)), so every control keeps the calibrated token mean μ_k and centred RMS σ_k of the correction and changes
only where its centred part points:

- `history` (the paper's sampler): U_k itself;
- `common`: the component the samples of a batch share, the batch mean of the unit centred directions;
- `permuted`: the direction of another sample of the batch, by a fixed derangement;
- `random`: Gaussian noise with the centred RMS of U_k.

Shapes and masks follow the library's history directions (`untied_sc.schedulers`): directions are (B, L, D), `mask` is an optional (B, L) bool tensor of
active positions. The functions are pure; the random ones take their permutation or noise as an argument, drawn by the
scheduler from a generator [`direction_seed`] derives (docs/algorithm.md §3.8).
"""

import hashlib
from collections.abc import Sequence

import torch

from untied_sc.schedulers import active_mask, compute_dtype, sample_scale

from .correction_functions import centre_tokens, moment_projection


CORRECTION_DIRECTIONS = ("history", "common", "permuted", "random")


def unit_centred_direction(direction: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    The unit centred direction of each sample, C_I U / RMS_I(C_I U) (the σ_k-free part of Π_k, paper eq. (11)):
    Π_k with μ = 0 and σ = 1. Zero for a sample whose centred direction is zero, and at inactive positions.

    Args:
        direction (`torch.Tensor`): U, shape (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: shape and dtype of `direction`.
    """
    zero_mean = torch.zeros(direction.shape[-1], dtype=direction.dtype, device=direction.device)
    return moment_projection(direction, zero_mean, 1.0, mask)


def centred_rms(direction: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    RMS_I(C_I U) = sqrt(‖C_I U‖_F² / (|I|·D)) per sample, over active positions × width (paper App. B.5, the RMS
    that Π_k sets to σ_k). Computed on C_I U divided by its largest magnitude, so it is zero only for an exactly zero
    centred direction.

    Args:
        direction (`torch.Tensor`): U, shape (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: shape (B,), float32 for float16/bfloat16 `direction`, else its dtype; 0 for a sample with no
        active position.
    """
    active = active_mask(mask, direction)
    centred = centre_tokens(direction, active)
    scale = sample_scale(centred)
    count = active.sum(dim=1).to(centred.dtype).clamp(min=1)
    mean_square = (centred / scale).square().sum(dim=(1, 2)) / (count * direction.shape[-1])
    return scale.flatten() * mean_square.sqrt()


def common_direction(direction: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    The "common component only" control: every sample gets the batch mean of the samples' unit centred directions,

        Ū_k = (1/|B'|) Σ_{b ∈ B'} C_I U_{k,b} / RMS_I(C_I U_{k,b}),

    B' the samples whose centred direction is nonzero (Ū_k = 0 when there is none). Π_k then gives every sample the
    same centred direction (on its own active positions), and the sample-specific part U_{k,b} − Ū_k is gone. Units
    first, so that each sample weighs the same whatever the scale of its U (Π_k ignores that scale too).

    Reduces to the history direction (after Π_k) for a batch of one, or one whose samples share one direction.

    Args:
        direction (`torch.Tensor`): U_k, shape (B, L, D).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: Ū_k repeated over the batch, shape (B, L, D), in `direction`'s dtype.
    """
    dtype = compute_dtype(direction.dtype)
    units = unit_centred_direction(direction.to(dtype), mask)
    present = units.flatten(1).abs().amax(dim=1) > 0
    count = present.sum().clamp(min=1).to(dtype)
    mean = units.sum(dim=0, keepdim=True) / count  # absent samples are exactly zero: a plain sum leaves them out
    return mean.expand_as(direction).to(direction.dtype)


def derangement(batch_size: int, generator: torch.Generator) -> torch.Tensor:
    r"""
    A random permutation π of 0..B−1 without fixed points (B ≥ 2), for the "permuted across samples" control: a
    random ordering σ = randperm(B) from `generator`, closed into one cycle, π(σ_i) = σ_{(i+1) mod B}. Every sample
    then reads the direction of another sample of the batch. The identity for B = 1 (no other sample).

    Args:
        batch_size (`int`): B ≥ 1.
        generator (`torch.Generator`): a CPU generator (the only randomness).

    Returns:
        `torch.Tensor`: π as an int64 index tensor of shape (B,), on the CPU.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    order = torch.randperm(batch_size, generator=generator)
    permutation = torch.empty_like(order)
    permutation[order] = order.roll(-1)
    return permutation


def permuted_direction(direction: torch.Tensor, permutation: torch.Tensor) -> torch.Tensor:
    r"""
    The "history direction permuted across samples" control: sample b gets the direction of sample π(b),
    U'_{k,b} = U_{k,π(b)}, with one permutation (a [`derangement`]) for the whole trajectory. Π_k then applies sample
    b's own moments and active positions.

    Args:
        direction (`torch.Tensor`): U_k, shape (B, L, D).
        permutation (`torch.Tensor`): π, int64 of shape (B,).

    Returns:
        `torch.Tensor`: U_k[π], shape and dtype of `direction`.
    """
    if permutation.shape != direction.shape[:1]:
        raise ValueError(
            f"`permutation` must have shape (B,) = ({direction.shape[0]},), got {tuple(permutation.shape)}."
        )
    return direction[permutation.to(direction.device)]


def random_direction(direction: torch.Tensor, noise: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    r"""
    The "random direction with equal RMS" control: per sample, the centred noise rescaled to the centred RMS of
    U_k,

        U'_{k,b} = RMS_I(C_I U_{k,b}) · C_I ξ_b / RMS_I(C_I ξ_b),     ξ ~ N(0, I) of shape (B, L, D),

    so that U' and U_k share their centred RMS per sample (zero where U_k's centred part is zero: on steps with
    σ_k = 0 the control, like the history direction, leaves only μ_k). Π_k then sets that RMS to σ_k.

    Args:
        direction (`torch.Tensor`): U_k, shape (B, L, D).
        noise (`torch.Tensor`): ξ, shape (B, L, D) (the caller draws it from a generator).
        mask (`torch.Tensor`, *optional*): (B, L) bool, True at active positions; None means all active.

    Returns:
        `torch.Tensor`: U', shape and dtype of `direction`, zero at inactive positions.
    """
    if noise.shape != direction.shape:
        raise ValueError(
            f"`noise` must have the direction's shape {tuple(direction.shape)}, got {tuple(noise.shape)}."
        )
    active = active_mask(mask, direction)
    dtype = compute_dtype(direction.dtype)
    rms = centred_rms(direction.to(dtype), active)[:, None, None]
    unit = unit_centred_direction(noise.to(dtype), active)
    return (rms * unit).to(direction.dtype)


def direction_seed(seed: int, generator: torch.Generator | Sequence[torch.Generator] | None = None) -> int:
    """
    The seed of a sampling run's direction-control draws (the permutation, the noise): a 64-bit hash of `seed` (the
    config's `direction_seed`) and the current state of the run's `generator` (each generator of a list), read
    without drawing from it, so the official random stream, and with it every matched pair, stays as it is. The
    same generator state gives the same seed: the same samples for the same sampling seed, fresh draws for each
    benchmark batch (each has its own generator). Without a generator: a hash of `seed` alone.

    Args:
        seed (`int`): the config's `direction_seed` (≥ 0).
        generator (`torch.Generator` or a list of them, *optional*): the sampling run's generator.

    Returns:
        `int`: a seed in [0, 2⁶⁴).
    """
    digest = hashlib.blake2b(digest_size=8)
    digest.update(f"untied-sc direction controls, seed {int(seed)}".encode())
    generators = [] if generator is None else [generator] if isinstance(generator, torch.Generator) else generator
    for item in generators:
        digest.update(item.get_state().cpu().numpy().tobytes())
    return int.from_bytes(digest.digest(), "little")
