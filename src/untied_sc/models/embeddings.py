"""Small pieces shared by both networks: sinusoidal embeddings and the `dtype=` loading alias."""

import math
import os
from pathlib import Path

import torch

from .weights_config import check_saved_model


def sinusoidal_embedding(values: torch.Tensor, dim: int, max_period: float = 10000.0) -> torch.Tensor:
    """DiT sinusoidal features of raw scalars, `[cos(v·f_j), sin(v·f_j)]` with `f_j = max_period^(-j/half)`.

    Both ELF (on t ∈ [0, 1] and on the SC-CFG scale) and LangFlow (on γ) embed the raw value, unscaled.

    Args:
        values (`torch.Tensor` of shape `(batch,)`): the scalars to embed.
        dim (`int`): embedding width; an odd width gets a zero last column.
        max_period (`float`, defaults to 10000): the longest period.

    Returns:
        `torch.Tensor` of shape `(batch, dim)`, float32.
    """
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=values.device) / half)
    args = values[:, None].to(torch.float32) * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


def broadcast_per_example(
    value: torch.Tensor | float, batch_size: int, device: torch.device, name: str
) -> torch.Tensor:
    """Turns a scalar or a `(batch,)` tensor into a float32 `(batch,)` tensor, with a clear error otherwise."""
    value = torch.as_tensor(value, dtype=torch.float32, device=device)
    if value.ndim == 0:
        return value.expand(batch_size)
    if value.shape != (batch_size,):
        raise ValueError(f"`{name}` must be a scalar or have shape ({batch_size},), got {tuple(value.shape)}.")
    return value


class DtypeAliasMixin:
    """
    Accepts transformers-5 style `dtype=` in `from_pretrained` as well as diffusers' `torch_dtype=`, and checks a
    local folder's `config.json` against its weights first (`weights_config.check_saved_model`): diffusers would load a
    config that builds fewer blocks, or other sizes, than the weights hold with a bare list of unused names.
    """

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, **kwargs):
        if "dtype" in kwargs:
            if kwargs.get("torch_dtype") is not None:
                raise ValueError("Pass either `dtype` or `torch_dtype`, not both.")
            kwargs["torch_dtype"] = kwargs.pop("dtype")
        if isinstance(pretrained_model_name_or_path, str | os.PathLike):
            folder = Path(pretrained_model_name_or_path) / (kwargs.get("subfolder") or "")
            if folder.is_dir():  # a Hub repo id is checked where a pipeline loads it, from its local snapshot
                check_saved_model(cls, folder, kwargs.get("variant"))
        return super().from_pretrained(pretrained_model_name_or_path, **kwargs)
