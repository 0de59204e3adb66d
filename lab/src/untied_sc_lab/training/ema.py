"""Exponential moving average of model weights (float32 shadow copies)."""

import torch
from torch import nn


def ema_decay_at(step: int, decay: float, warmup: bool = True) -> float:
    """The decay used at optimiser step `step` (1-based): min(decay, (1 + step)/(10 + step)) with warm-up."""
    return min(decay, (1.0 + step) / (10.0 + step)) if warmup else decay


class EMA:
    """
    Shadow weights θ̄ ← d·θ̄ + (1 − d)·θ for every floating-point parameter and buffer of `model`.

    Entries named in `copy` (for example the Gumbel proposal, which is set rather than trained) are copied as they
    are instead of averaged.

    Args:
        model (`nn.Module`): the trained model.
        decay (`float`): the target decay d.
        warmup (`bool`, defaults to `True`): use min(d, (1 + step)/(10 + step)), so early averages are not dominated
            by the random initialisation.
        copy (`tuple[str, ...]`): state-dict key prefixes that are copied, not averaged.
    """

    def __init__(self, model: nn.Module, decay: float = 0.999, warmup: bool = True, copy: tuple[str, ...] = ()):
        self.decay = decay
        self.warmup = warmup
        self.copy = copy
        self.shadow = {
            name: value.detach().float().clone()
            for name, value in model.state_dict().items()
            if value.is_floating_point()
        }

    @torch.no_grad()
    def update(self, model: nn.Module, step: int) -> float:
        """Moves the shadow towards `model`'s weights after optimiser step `step`; returns the decay used."""
        decay = ema_decay_at(step, self.decay, self.warmup)
        for name, value in model.state_dict().items():
            if name not in self.shadow:
                continue
            if name.startswith(self.copy):
                self.shadow[name].copy_(value)
            else:
                self.shadow[name].lerp_(value.float(), 1.0 - decay)
        return decay

    def state_dict(self) -> dict:
        return {"decay": self.decay, "warmup": self.warmup, "shadow": self.shadow}

    def load_state_dict(self, state: dict, device: torch.device | str | None = None) -> None:
        self.decay, self.warmup = state["decay"], state["warmup"]
        self.shadow = {name: value.to(device).clone() for name, value in state["shadow"].items()}

    @torch.no_grad()
    def copy_to(self, model: nn.Module) -> nn.Module:
        """Writes the shadow weights into `model` (cast to its dtypes) and returns it."""
        state = model.state_dict()
        for name, value in self.shadow.items():
            state[name].copy_(value.to(state[name].dtype))
        return model
