"""The networks' mixed-precision switch: autocast over the official regions only, off by default.

Both official codes autocast to bfloat16 on the GPU, but not everywhere: ELF keeps its input projections, time
embedders and both output heads in float32 (`autocast(enabled=False)` around them), LangFlow its self-conditioning
projection, time embedding, layer norms, rotary application and skip term. [`AutocastMixin`] gives a network the
switch; its forward runs with autocast off ([`float32_outside_blocks`]) and opens [`autocast_region`] around the
blocks, so that the same parts stay float32 even when the caller autocasts around the call. Switched off, neither
opens any context: the forward is exactly the float32 one.
"""

import contextlib
import functools

import torch


AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


def check_autocast_dtype(dtype) -> torch.dtype:
    """`dtype` if autocast can run the network in it (bfloat16, float16), else a `ValueError` naming the fix."""
    if dtype not in AUTOCAST_DTYPES:
        raise ValueError(
            f"enable_autocast takes torch.bfloat16 (what the official code uses) or torch.float16, got {dtype!r}. "
            "For float32 call disable_autocast(); to store the weights in another dtype, load with "
            "`torch_dtype=` or cast with `.to(dtype)` instead."
        )
    return dtype


def autocast_region(tensor: torch.Tensor, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """Autocast to `dtype` on `tensor`'s device type (cuda, cpu, ...); no context when `dtype` is `None`."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(tensor.device.type, dtype=dtype)


def float32_region(tensor: torch.Tensor, active: bool) -> contextlib.AbstractContextManager:
    """Autocast switched off on `tensor`'s device type where `active` (the official `enabled=False` regions)."""
    if not active:
        return contextlib.nullcontext()
    return torch.autocast(tensor.device.type, enabled=False)


def inside_autocast(tensor: torch.Tensor) -> bool:
    """Whether autocast is on for `tensor`'s device type (a layer's float32 region applies only then)."""
    return torch.is_autocast_enabled(tensor.device.type)


def float32_outside_blocks(method):
    """
    Runs a network's method (`forward(sample, ...)`, LangFlow's `clean_prediction(logits)`) with autocast off on its
    first argument's device type while the network's switch is on, as the official code keeps its input and output
    sides out of its own autocast; the forward opens [`autocast_region`] around its blocks. Switched off, the call
    goes through untouched (a caller's autocast then applies to all of it, as it always did).
    """

    @functools.wraps(method)
    def wrapped(self, *args, **kwargs):
        tensor = args[0] if args else next(iter(kwargs.values()))
        with float32_region(tensor, self.autocast_dtype is not None):
            return method(self, *args, **kwargs)

    return wrapped


class AutocastMixin:
    """
    The runtime switch `enable_autocast(dtype)` / `disable_autocast()` of a network. It is an attribute of the loaded
    module, not of its config: `save_pretrained` writes the same files with it on or off.
    """

    _autocast_dtype: torch.dtype | None = None  # off unless switched on: the float32 forward

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        """The dtype the network's blocks autocast to, or `None` (float32 throughout, the default)."""
        return self._autocast_dtype

    def enable_autocast(self, dtype: torch.dtype = torch.bfloat16) -> None:
        """
        Runs the transformer blocks under `torch.autocast(dtype)` on the input's device type from now on, the parts
        the official code keeps in float32 in float32 (see the model's class docstring). The weights are not cast.

        Args:
            dtype (`torch.dtype`, defaults to `torch.bfloat16`): `torch.bfloat16` (the official choice) or
                `torch.float16`.
        """
        self._autocast_dtype = check_autocast_dtype(dtype)

    def disable_autocast(self) -> None:
        """Back to the float32 forward (the default): bit for bit what it is without ever switching autocast on."""
        self._autocast_dtype = None
