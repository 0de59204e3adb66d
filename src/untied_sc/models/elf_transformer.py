"""The ELF network (Embedded Language Flows, https://huggingface.co/papers/2605.10938), layer for layer.

Parameter names equal the official PyTorch port's `state_dict` keys, so an official `ema_params1` dict loads
without renaming. The network predicts the clean latent x̂ (x-prediction) in the normalised encoder space; at
t = 1 with the mode tokens switched on, its factored decoder head gives token logits.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from .autocast import AutocastMixin, autocast_region, float32_outside_blocks
from .embeddings import DtypeAliasMixin, broadcast_per_example, sinusoidal_embedding


# Official sizes (`ELF_B`, `ELF_M`, `ELF_L` in the official model file). The SwiGLU width is int(int(4H)·2/3).
ELF_PRESETS: dict[str, dict[str, int]] = {
    "elf-b": {"num_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 2048},
    "elf-m": {"num_layers": 24, "hidden_size": 1056, "num_attention_heads": 16, "intermediate_size": 2816},
    "elf-l": {"num_layers": 32, "hidden_size": 1280, "num_attention_heads": 16, "intermediate_size": 3413},
}


@dataclass
class ELFTransformerOutput(BaseOutput):
    """
    Output of [`ELFTransformerModel`].

    Args:
        sample (`torch.Tensor` of shape `(batch, length, latent_dim)`):
            The clean-latent prediction x̂.
        logits (`torch.Tensor` of shape `(batch, length, vocab_size)`, *optional*):
            Decoder-head logits; only computed when `decoder_step_active` is not `None`.
    """

    sample: torch.Tensor
    logits: torch.Tensor | None = None


class RMSNorm(nn.Module):
    """RMSNorm with the variance taken in float32 (eps 1e-6)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        variance = hidden_states.float().pow(2).mean(dim=-1, keepdim=True)
        inv_std = torch.rsqrt(variance + self.eps).to(hidden_states.dtype)
        return self.weight.to(hidden_states.dtype) * (hidden_states * inv_std)


def rotate_interleaved_pairs(x: torch.Tensor) -> torch.Tensor:
    """(x_0, x_1, x_2, x_3, …) → (−x_1, x_0, −x_3, x_2, …): RoPE on adjacent pairs."""
    pairs = x.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def interleaved_rope_tables(head_dim: int, length: int, num_prefix: int, theta: float = 10000.0):
    """cos/sin tables of shape `(num_prefix + length, head_dim)`; prefix rows are the identity rotation."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32)[: head_dim // 2] / head_dim)
    angles = torch.outer(torch.arange(length, dtype=torch.float32), freqs).repeat_interleave(2, dim=-1)
    cos = torch.cat([torch.ones(num_prefix, angles.shape[-1]), torch.cos(angles)])
    sin = torch.cat([torch.zeros(num_prefix, angles.shape[-1]), torch.sin(angles)])
    return cos, sin


class TimestepEmbedder(nn.Module):
    """Sinusoidal features (width 256) → Linear → SiLU → Linear."""

    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256):
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp_0 = nn.Linear(frequency_embedding_size, hidden_size)
        self.mlp_2 = nn.Linear(hidden_size, hidden_size)

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        features = sinusoidal_embedding(values, self.frequency_embedding_size).to(self.mlp_0.weight.dtype)
        return self.mlp_2(F.silu(self.mlp_0(features)))


class BottleneckTextProj(nn.Module):
    """latent_dim → bottleneck_dim (no bias) → hidden_size: the shared bottleneck the overlap basis is read from."""

    def __init__(self, latent_dim: int, hidden_size: int, bottleneck_dim: int):
        super().__init__()
        self.proj1 = nn.Linear(latent_dim, bottleneck_dim, bias=False)
        self.proj2 = nn.Linear(bottleneck_dim, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj2(self.proj1(x))


class Attention(nn.Module):
    """Bidirectional multi-head attention with QK-RMSNorm per head and interleaved RoPE."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        head_dim = hidden_size // num_heads
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.q_norm = RMSNorm(head_dim)
        self.k_norm = RMSNorm(head_dim)
        self.proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor | None):
        batch, length, width = x.shape
        q, k, v = self.qkv(x).reshape(batch, length, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_interleaved_pairs(q) * sin
        k = k * cos + rotate_interleaved_pairs(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(out.permute(0, 2, 1, 3).reshape(batch, length, width))


class SwiGLU(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.w12 = nn.Linear(hidden_size, 2 * intermediate_size)
        self.w3 = nn.Linear(intermediate_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = self.w12(x).chunk(2, dim=-1)
        return self.w3(F.silu(gate) * value)


class ELFBlock(nn.Module):
    """Pre-RMSNorm attention and SwiGLU with residuals; no adaLN (time enters through prefix tokens)."""

    def __init__(self, hidden_size: int, num_heads: int, intermediate_size: int):
        super().__init__()
        self.norm1 = RMSNorm(hidden_size)
        self.attn = Attention(hidden_size, num_heads)
        self.norm2 = RMSNorm(hidden_size)
        self.mlp = SwiGLU(hidden_size, intermediate_size)

    def forward(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class FinalLayer(nn.Module):
    def __init__(self, hidden_size: int, latent_dim: int):
        super().__init__()
        self.norm_final = RMSNorm(hidden_size)
        self.linear = nn.Linear(hidden_size, latent_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm_final(x))


class ELFTransformerModel(AutocastMixin, DtypeAliasMixin, ModelMixin, ConfigMixin):
    r"""
    The ELF transformer: an x-prediction network on continuous text latents with self-conditioning, SC-CFG scale
    tokens and a factored decoder head.

    Input layout per example: `[time (num_time_tokens), SC-CFG (num_sc_cfg_tokens), mode (num_mode_tokens), latent
    (max_length)]`. The prefix gets the identity rotation; latent positions get interleaved RoPE (θ = 1e4). The
    self-conditioning input m enters through `self_cond_proj([z, m])` before the bottleneck, so the effective maps of
    z and m into the bottleneck are `proj1 · W_sc[:, :D]` and `proj1 · W_sc[:, D:]` (paper §4.1).

    Mixed precision ([`~ELFTransformerModel.enable_autocast`], off by default) autocasts what the official code
    autocasts: the transformer blocks. The input side (`self_cond_proj`, `text_proj`, the time and SC-CFG embedders
    and the prefix tokens) and the output side (the decoder head and `final_layer`) stay float32, so the prediction
    and the logits are float32.

    Args:
        latent_dim (`int`, defaults to 512): width D of the latent (T5-small's 512 for the released models).
        max_length (`int`, defaults to 1024): sequence length; the RoPE tables are built for exactly this length.
        hidden_size (`int`, defaults to 768): transformer width H.
        num_layers (`int`, defaults to 12): number of blocks.
        num_attention_heads (`int`, defaults to 12): heads; `hidden_size` must be divisible by it.
        intermediate_size (`int`, defaults to 2048): SwiGLU inner width F.
        bottleneck_dim (`int`, defaults to 128): width of the shared input bottleneck.
        num_time_tokens (`int`, defaults to 4): learned time prefix tokens.
        num_sc_cfg_tokens (`int`, defaults to 4): learned SC-CFG prefix tokens (0 disables the scale input).
        num_mode_tokens (`int`, defaults to 4): learned mode tokens, zeroed unless decoding.
        vocab_size (`int`, defaults to 32100): decoder-head vocabulary.
        rope_theta (`float`, defaults to 10000.0): RoPE base.
    """

    family = "elf"  # the model family (pipelines, calibration and statistics dispatch on it)
    _supports_gradient_checkpointing = False
    _no_split_modules = ["ELFBlock"]

    @register_to_config
    def __init__(
        self,
        latent_dim: int = 512,
        max_length: int = 1024,
        hidden_size: int = 768,
        num_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 2048,
        bottleneck_dim: int = 128,
        num_time_tokens: int = 4,
        num_sc_cfg_tokens: int = 4,
        num_mode_tokens: int = 4,
        vocab_size: int = 32100,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size={hidden_size} is not divisible by num_attention_heads={num_attention_heads}."
            )
        if num_time_tokens < 1:
            raise ValueError(
                f"num_time_tokens must be positive (time enters only through them), got {num_time_tokens}."
            )
        self.self_cond_proj = nn.Linear(2 * latent_dim, latent_dim)
        self.text_proj = BottleneckTextProj(latent_dim, hidden_size, bottleneck_dim)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_emb_tokens = nn.Parameter(torch.zeros(1, num_time_tokens, hidden_size))
        if num_sc_cfg_tokens > 0:
            self.self_cond_cfg_embedder = TimestepEmbedder(hidden_size)
            self.self_cond_cfg_tokens = nn.Parameter(torch.zeros(1, num_sc_cfg_tokens, hidden_size))
        if num_mode_tokens > 0:
            self.mode_tokens = nn.Parameter(torch.zeros(1, num_mode_tokens, hidden_size))
        self.blocks = nn.ModuleList(
            ELFBlock(hidden_size, num_attention_heads, intermediate_size) for _ in range(num_layers)
        )
        self.final_layer = FinalLayer(hidden_size, latent_dim)
        self.proj_kernel = nn.Parameter(torch.zeros(hidden_size, latent_dim))
        self.proj_bias = nn.Parameter(torch.zeros(latent_dim))
        self.unembed_kernel = nn.Parameter(torch.zeros(latent_dim, vocab_size))
        self.unembed_bias = nn.Parameter(torch.zeros(vocab_size))

        self.num_prefix_tokens = num_time_tokens + num_sc_cfg_tokens + num_mode_tokens
        cos, sin = interleaved_rope_tables(
            hidden_size // num_attention_heads, max_length, self.num_prefix_tokens, rope_theta
        )
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "ELFTransformerModel":
        """Builds a randomly initialised model with an official size: `"elf-b"`, `"elf-m"` or `"elf-l"`."""
        if name not in ELF_PRESETS:
            raise ValueError(f"Unknown ELF preset {name!r}; choose one of {sorted(ELF_PRESETS)}.")
        return cls(**{**ELF_PRESETS[name], **overrides})

    def reset_parameters(self) -> None:
        """The official initialisation: xavier-uniform linears, N(0, 0.02) embedders and tokens, zero flow head."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for embedder in (self.t_embedder, getattr(self, "self_cond_cfg_embedder", None)):
            if embedder is not None:
                nn.init.normal_(embedder.mlp_0.weight, std=0.02)
                nn.init.normal_(embedder.mlp_2.weight, std=0.02)
        for name in ("t_emb_tokens", "self_cond_cfg_tokens", "mode_tokens"):
            if hasattr(self, name):
                nn.init.normal_(getattr(self, name), std=0.02)
        nn.init.zeros_(self.final_layer.linear.weight)
        nn.init.zeros_(self.final_layer.linear.bias)
        nn.init.xavier_uniform_(self.proj_kernel)
        nn.init.xavier_uniform_(self.unembed_kernel)
        nn.init.zeros_(self.proj_bias)
        nn.init.zeros_(self.unembed_bias)

    @float32_outside_blocks
    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float,
        self_conditioning: torch.Tensor | None = None,
        sc_cfg_scale: torch.Tensor | float | None = None,
        decoder_step_active: bool | None = None,
        attention_mask: torch.Tensor | None = None,
        return_dict: bool = True,
        use_self_conditioning: bool = True,
    ) -> ELFTransformerOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch, max_length, latent_dim)`): the noisy latent z_t.
            timestep (`torch.Tensor` of shape `(batch,)` or `float`): t ∈ [0, 1] (0 = noise, 1 = data).
            self_conditioning (`torch.Tensor` of shape `(batch, max_length, latent_dim)`, *optional*):
                the self-conditioning input m; `None` means zeros (the first step, and the decode pass).
            sc_cfg_scale (`torch.Tensor` of shape `(batch,)` or `float`): the SC-CFG scale w, a network input
                (not an extrapolation). Required when the model has SC-CFG tokens.
            decoder_step_active (`bool`, *optional*): `None`: mode tokens ×0 and no logits; `False`: mode tokens ×0,
                logits computed; `True`: mode tokens ×1, logits computed (the decode pass at t = 1).
            attention_mask (`torch.Tensor` of shape `(batch, max_length)`, *optional*): 1 = valid, 0 = padding.
            return_dict (`bool`, defaults to `True`): return an [`ELFTransformerOutput`] rather than a tuple.
            use_self_conditioning (`bool`, defaults to `True`): `False` runs the network without its
                self-conditioning input, as the official forward does on a latent-width input (`x` of width D, not
                2D): `self_cond_proj` is skipped and z enters the bottleneck directly, `text_proj(z)`. This differs
                from a zero self-conditioning input (`self_conditioning=None`), which still passes `[z, 0]` through
                `self_cond_proj`. `self_conditioning` must then be `None`.
        """
        config = self.config
        batch = self._check_latent(sample, "sample")
        dtype, device = self.self_cond_proj.weight.dtype, sample.device
        if not use_self_conditioning:
            if self_conditioning is not None:
                raise ValueError(
                    "use_self_conditioning=False runs the network without its self-conditioning input, but "
                    "`self_conditioning` was given: pass one or the other (None for no input)."
                )
            x = self.text_proj(sample.to(dtype))
        else:
            if self_conditioning is None:
                self_conditioning = torch.zeros_like(sample)
            else:
                self._check_latent(self_conditioning, "self_conditioning", batch)
            x = self.text_proj(self.self_cond_proj(torch.cat([sample, self_conditioning], dim=-1).to(dtype)))
        time = broadcast_per_example(timestep, batch, device, "timestep")
        prefix = [self.t_emb_tokens + self.t_embedder(time)[:, None]]
        if config.num_sc_cfg_tokens > 0:
            if sc_cfg_scale is None:
                raise ValueError(
                    "This ELF model has SC-CFG tokens, so `sc_cfg_scale` is required (the released models use 3.0)."
                )
            scale = broadcast_per_example(sc_cfg_scale, batch, device, "sc_cfg_scale")
            prefix.append(self.self_cond_cfg_tokens + self.self_cond_cfg_embedder(scale)[:, None])
        if config.num_mode_tokens > 0:
            prefix.append(self.mode_tokens.expand(batch, -1, -1) * float(bool(decoder_step_active)))
        x = torch.cat([torch.cat(prefix, dim=1).expand(batch, -1, -1), x], dim=1)

        mask = None
        if attention_mask is not None:
            if attention_mask.shape != sample.shape[:2]:
                raise ValueError(
                    f"attention_mask must have shape {tuple(sample.shape[:2])}, got {tuple(attention_mask.shape)}."
                )
            prefix_mask = attention_mask.new_ones(batch, self.num_prefix_tokens)
            mask = torch.cat([prefix_mask, attention_mask], dim=1).bool()[:, None, None, :]
        with autocast_region(sample, self.autocast_dtype):
            for block in self.blocks:
                x = block(x, self.rope_cos, self.rope_sin, mask)
        hidden = x[:, self.num_prefix_tokens :]

        logits = None
        if decoder_step_active is not None:
            logits = F.gelu(hidden @ self.proj_kernel + self.proj_bias, approximate="tanh")
            logits = logits @ self.unembed_kernel + self.unembed_bias
        prediction = self.final_layer(hidden)
        if not return_dict:
            return (prediction, logits)
        return ELFTransformerOutput(sample=prediction, logits=logits)

    def _check_latent(self, tensor: torch.Tensor, name: str, batch: int | None = None) -> int:
        config = self.config
        expected = (batch if batch is not None else tensor.shape[0], config.max_length, config.latent_dim)
        if tensor.ndim != 3 or tuple(tensor.shape) != expected:
            got = tuple(tensor.shape)
            if tensor.ndim == 3 and got[-1] != config.latent_dim:
                hint = f"the latent width must be latent_dim={config.latent_dim}"
            elif tensor.ndim == 3 and got[1] != config.max_length:
                hint = (
                    f"the RoPE tables are built for max_length={config.max_length} positions; "
                    "sample at that length (pad with an attention_mask) or build the model with another max_length"
                )
            else:
                hint = "expected (batch, max_length, latent_dim)"
            raise ValueError(f"`{name}` has shape {got}, expected {expected}: {hint}.")
        if not torch.is_floating_point(tensor):
            raise ValueError(f"`{name}` must be a floating-point tensor, got {tensor.dtype}.")
        return tensor.shape[0]
