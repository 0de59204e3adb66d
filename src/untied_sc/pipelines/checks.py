"""The checks of a pipeline call's inputs: sizes, finite knobs and latents, generators."""

import math
import operator

import torch


OUTPUT_TYPES = ("text", "seq", "latent")


def as_int(value):
    """A numpy (or other `__index__`) integer as a Python int; anything else unchanged, for `check_inputs` to judge."""
    if isinstance(value, bool) or isinstance(value, int):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def check_finite_number(name: str, value, hint: str) -> float:
    """`value` as a float, refused when NaN or ±inf: a non-finite knob runs every step and returns NaN latents and
    empty (all-pad) texts without an error."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"{name} must be a finite number, got {value!r} ({hint}): a NaN or infinite value runs without an error "
            "and gives NaN latents or meaningless texts."
        )
    return value


def check_finite_latents(latents: torch.Tensor) -> None:
    """Initial latents hold no NaN or ±inf: every step would carry them into the output (all-pad texts)."""
    finite = torch.isfinite(latents)
    if not bool(finite.all()):
        count = int((~finite).sum())
        raise ValueError(
            f"latents hold {count} non-finite value(s) (NaN or ±inf) of {latents.numel()}: sampling from them gives NaN "
            "latents and all-pad texts. Pass finite initial latents (e.g. `init_noise_sigma * torch.randn(...)`), or "
            "leave `latents` out to draw them from the generator."
        )


def check_generator_input(generator, batch_size: int) -> None:
    """`None`, a `torch.Generator`, or a list of `batch_size` of them (diffusers' rule); an int is refused."""
    generators = generator if isinstance(generator, list) else [generator]
    for item in generators:
        if item is not None and not isinstance(item, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator (or None), got {type(item).__name__} {item!r}. For a seed, pass "
                f"`generator=torch.Generator().manual_seed({item if isinstance(item, int) else 0})`."
            )
    if isinstance(generator, list) and len(generator) != batch_size:
        raise ValueError(
            f"You passed a list of {len(generator)} generators for a batch of {batch_size}; pass one generator per "
            "sample, or a single torch.Generator for the whole batch."
        )
