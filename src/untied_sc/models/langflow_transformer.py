"""The LangFlow network (https://huggingface.co/papers/2604.11748), layer for layer.

Parameter names equal the official `model.safetensors` keys (`backbone.*`, `proposal.*`), so the released weights
load without renaming. The network works in γ = −log SNR (VP: α² = sigmoid(−γ), σ² = sigmoid(γ)); it outputs
token logits, and its clean prediction is the expected normalised embedding softmax(logits)·E_norm.
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from .autocast import AutocastMixin, autocast_region, float32_outside_blocks, float32_region, inside_autocast
from .embeddings import DtypeAliasMixin, broadcast_per_example, sinusoidal_embedding


@dataclass
class LangFlowTransformerOutput(BaseOutput):
    """
    Output of [`LangFlowTransformerModel`].

    Args:
        logits (`torch.Tensor` of shape `(batch, length, vocab_size)`):
            Token logits, including the `α/σ²·z·E_normᵀ` skip term.
    """

    logits: torch.Tensor


def normalized_embedding(weight: torch.Tensor) -> torch.Tensor:
    """Rows scaled to norm √D (LangFlow's `layernorm` embedding normalisation), computed in float32."""
    return (F.normalize(weight.float(), dim=-1) * math.sqrt(weight.shape[-1])).to(weight.dtype)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """`x·(1 + scale) + shift` in x's dtype: the official's scripted version, under autocast, takes bf16 shift and
    scale into float32 math instead of rounding `1 + scale` to bf16 (a no-op cast in float32)."""
    return x * (1 + scale.to(x.dtype)) + shift.to(x.dtype)


def gated_residual(x: torch.Tensor, gate: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """`x + gate·update` in x's dtype, the official's scripted residual: under autocast the bf16 product is not
    rounded to bf16 before it is added (a no-op cast in float32)."""
    return x + gate.to(x.dtype) * update.to(x.dtype)


def rotate_half_split(x: torch.Tensor) -> torch.Tensor:
    """(x_a, x_b) → (−x_b, x_a) on the two halves of the head dimension: RoPE in the half-split layout."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


class LayerNorm(nn.Module):
    """LayerNorm without bias, normalised in float32 (eps 1e-5), returned in the input's dtype."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with float32_region(x, inside_autocast(x)):  # the official normalises outside autocast
            normalized = F.layer_norm(x.float(), [self.weight.shape[0]])
        return (normalized * self.weight.float()).to(x.dtype)


class Rotary(nn.Module):
    """Half-split rotary tables built from `inv_freq` (a persistent buffer, as in the official checkpoint)."""

    def __init__(self, head_dim: int, base: float = 10000.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, head_dim, 2).float() / head_dim)))

    def forward(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        positions = torch.arange(length, device=device).type_as(self.inv_freq)
        angles = torch.outer(positions, self.inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size: int, frequency_embedding_size: int = 256):
        super().__init__()
        self.frequency_embedding_size = frequency_embedding_size
        self.mlp = nn.Sequential(
            nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(), nn.Linear(hidden_size, hidden_size)
        )

    def forward(self, values: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoidal_embedding(values, self.frequency_embedding_size).to(self.mlp[0].weight.dtype))


class DDiTBlock(nn.Module):
    """adaLN DiT block: shift/scale/gate from the time condition for attention and MLP."""

    def __init__(self, dim: int, num_heads: int, cond_dim: int, mlp_ratio: int = 4):
        super().__init__()
        self.num_heads = num_heads
        self.norm1 = LayerNorm(dim)
        self.attn_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.attn_out = nn.Linear(dim, dim, bias=False)
        self.norm2 = LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(approximate="tanh"), nn.Linear(mlp_ratio * dim, dim)
        )
        self.adaLN_modulation = nn.Linear(cond_dim, 6 * dim)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c)[:, None].chunk(
            6, dim=2
        )
        h = modulate(self.norm1(x), shift_msa, scale_msa)
        q, k, v = self.attn_qkv(h).reshape(batch, length, 3, self.num_heads, -1).unbind(dim=2)
        with float32_region(q, inside_autocast(q)):  # the official rotates outside autocast, in q's dtype
            cos, sin = cos.to(q.dtype)[None, :, None], sin.to(q.dtype)[None, :, None]
            q = q * cos + rotate_half_split(q) * sin
            k = k * cos + rotate_half_split(k) * sin
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = gated_residual(x, gate_msa, self.attn_out(attn.transpose(1, 2).reshape(batch, length, -1)))
        return gated_residual(x, gate_mlp, self.mlp(modulate(self.norm2(x), shift_mlp, scale_mlp)))


class DDiTFinalLayer(nn.Module):
    def __init__(self, hidden_size: int, out_channels: int, cond_dim: int):
        super().__init__()
        self.norm_final = LayerNorm(hidden_size)
        self.linear = nn.Linear(hidden_size, out_channels)
        self.adaLN_modulation = nn.Linear(cond_dim, 2 * hidden_size)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(c)[:, None].chunk(2, dim=2)
        return self.linear(modulate(self.norm_final(x), shift, scale))


class EmbeddingLayer(nn.Module):
    def __init__(self, dim: int, vocab_size: int):
        super().__init__()
        self.embedding = nn.Parameter(torch.empty(vocab_size, dim))


class LangFlowBackbone(nn.Module):
    def __init__(self, vocab_size, hidden_size, cond_dim, num_layers, num_heads, self_conditioning):
        super().__init__()
        self.vocab_embed = EmbeddingLayer(hidden_size, vocab_size)
        self.sigma_map = TimestepEmbedder(cond_dim)
        self.rotary_emb = Rotary(hidden_size // num_heads)
        self.blocks = nn.ModuleList(DDiTBlock(hidden_size, num_heads, cond_dim) for _ in range(num_layers))
        self.output_layer = DDiTFinalLayer(hidden_size, vocab_size, cond_dim)
        if self_conditioning:
            self.self_cond_proj = nn.Linear(2 * hidden_size, hidden_size, bias=False)


class GumbelProposal(nn.Module):
    """The learned Gumbel(loc, scale) proposal over γ; its quantiles give the sampling grid."""

    def __init__(self, loc: float = 4.723, scale: float = 0.852, entropy: float = 7.02):
        super().__init__()
        self.loc = nn.Parameter(torch.tensor(loc))
        self.scale = nn.Parameter(torch.tensor(scale))
        self.entropy = nn.Parameter(torch.tensor(entropy))


class LangFlowTransformerModel(AutocastMixin, DtypeAliasMixin, ModelMixin, ConfigMixin):
    r"""
    The LangFlow DiT on noisy normalised token embeddings, with residual self-conditioning and a logits head.

    Forward pass (γ = −log SNR, z = α·E_norm[x] + σ·ε):
    `h = z + W_sc [z, m]` (W_sc zero-initialised, so self-conditioning starts as a no-op), adaLN blocks conditioned
    on `c = SiLU(MLP(sin-emb(γ)))`, logits from the final layer plus the skip term `α/σ²·z·E_normᵀ`
    (`α/σ² = exp((softplus(−γ) − γ)/2)`, the Gaussian log-likelihood of each token given z).

    Mixed precision ([`~LangFlowTransformerModel.enable_autocast`], off by default) autocasts what the official code
    autocasts: the blocks and the final layer, except their layer norms (normalised in float32) and the rotary
    application (in q's dtype, outside autocast). The self-conditioning projection, the time embedding, the rotary
    tables and the skip term stay float32. With the skip term the logits are float32 (the output layer's bf16 plus
    the skip), without it (`use_skip_logits=False`) bf16, as the official's.

    The proposal parameters (`proposal.loc`, `proposal.scale`) are weights, not config: read them with
    [`~LangFlowTransformerModel.gumbel_parameters`]; the sampling grid is their quantiles ([`LangFlowScheduler`]).

    Args:
        vocab_size (`int`, defaults to 50257): vocabulary size.
        hidden_size (`int`, defaults to 768): width D of the embeddings and the transformer.
        cond_dim (`int`, defaults to 128): width of the time condition.
        num_layers (`int`, defaults to 12): DiT blocks.
        num_attention_heads (`int`, defaults to 12): heads; `hidden_size` must be divisible by it.
        max_length (`int`, defaults to 1024): the training sequence length (the sampling default).
        self_conditioning (`bool`, defaults to `True`): whether the network has the `self_cond_proj` input.
        use_skip_logits (`bool`, defaults to `True`): add the `α/σ²·z·E_normᵀ` term (the official `use_bias`).
        gumbel_cutoff (`float`, defaults to 1e-5): the proposal's quantile cutoff; γ ∈ [γ_min, γ_max].
    """

    family = "langflow"  # the model family (pipelines, calibration and statistics dispatch on it)
    _no_split_modules = ["DDiTBlock"]

    @register_to_config
    def __init__(
        self,
        vocab_size: int = 50257,
        hidden_size: int = 768,
        cond_dim: int = 128,
        num_layers: int = 12,
        num_attention_heads: int = 12,
        max_length: int = 1024,
        self_conditioning: bool = True,
        use_skip_logits: bool = True,
        gumbel_cutoff: float = 1e-5,
    ):
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size={hidden_size} is not divisible by num_attention_heads={num_attention_heads}."
            )
        self.backbone = LangFlowBackbone(
            vocab_size, hidden_size, cond_dim, num_layers, num_attention_heads, self_conditioning
        )
        self.proposal = GumbelProposal()
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The official initialisation: default linears, Kaiming embedding, zero adaLN, head and SC projection."""
        nn.init.kaiming_uniform_(self.backbone.vocab_embed.embedding, a=math.sqrt(5))
        for module in self.backbone.modules():
            if isinstance(module, nn.Linear):
                module.reset_parameters()
        zero = [self.backbone.output_layer.linear, self.backbone.output_layer.adaLN_modulation]
        zero += [block.adaLN_modulation for block in self.backbone.blocks]
        zero += [self.backbone.self_cond_proj] if self.config.self_conditioning else []
        for module in zero:
            nn.init.zeros_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def embedding_matrix(self) -> torch.Tensor:
        """
        E_norm: the row-normalised embedding table `(vocab_size, hidden_size)`. Inside
        [`~LangFlowTransformerModel.reuse_embedding_matrix`] and without grad, the table normalised on first use is
        returned again while the weights are unchanged (not in a compiled forward, whose graph normalises it).
        """
        weight = self.backbone.vocab_embed.embedding
        if torch.compiler.is_compiling():
            # a compiled forward normalises E inside its graph (where it fuses): the cache's pointer test would
            # break the graph in two, and under CUDA graphs run eager Python between the halves at every step
            return normalized_embedding(weight)
        reuse = getattr(self, "_embedding_reuse", None)
        if reuse is None or torch.is_grad_enabled():
            return normalized_embedding(weight)
        key = (weight.data_ptr(), weight._version, weight.dtype, weight.device)  # any change of the weights misses
        if reuse.get("key") != key:
            reuse.update(key=key, matrix=normalized_embedding(weight))
        return reuse["matrix"]

    @contextlib.contextmanager
    def reuse_embedding_matrix(self):
        """
        Normalises E_norm once for a sampling loop instead of in every network call and clean prediction (twice per
        step): with a 50k vocabulary that is two passes over a 154 MB table per step, a third of the CPU time of a
        2-block OWT-shaped step at L = 128. Same values bit for bit; the table is held until the block ends.
        """
        # counted, so that nested or concurrent blocks (two pipelines sharing the network) release it only at the end
        self._embedding_reuse_depth = getattr(self, "_embedding_reuse_depth", 0) + 1
        if getattr(self, "_embedding_reuse", None) is None:
            self._embedding_reuse = {}
        try:
            yield
        finally:
            self._embedding_reuse_depth -= 1
            if self._embedding_reuse_depth == 0:
                self._embedding_reuse = None

    def embed(self, input_ids: torch.LongTensor) -> torch.Tensor:
        """Clean latents E_norm[x] of token ids."""
        return self.embedding_matrix()[input_ids]

    @float32_outside_blocks
    def clean_prediction(self, logits: torch.Tensor) -> torch.Tensor:
        """The clean prediction x̂ = softmax(logits)·E_norm (the expected normalised embedding), in float32."""
        probs = F.softmax(logits.float(), dim=-1)
        return torch.einsum("blv,ve->ble", probs, self.embedding_matrix().float())

    def gumbel_parameters(self) -> tuple[float, float, float]:
        """(loc, scale, cutoff) of the learned Gumbel proposal; loc and scale are read from the weights."""
        return self.proposal.loc.item(), self.proposal.scale.item(), self.config.gumbel_cutoff

    @float32_outside_blocks
    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float,
        self_conditioning: torch.Tensor | None = None,
        return_dict: bool = True,
    ) -> LangFlowTransformerOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch, length, hidden_size)`): the noisy latent z.
            timestep (`torch.Tensor` of shape `(batch,)` or `float`): γ = −log SNR (larger is noisier).
            self_conditioning (`torch.Tensor` of shape `(batch, length, hidden_size)`, *optional*): the
                self-conditioning input m (a previous clean prediction); `None` means zeros.
            return_dict (`bool`, defaults to `True`): return a [`LangFlowTransformerOutput`] rather than a tuple.
        """
        config = self.config
        if sample.ndim != 3 or sample.shape[-1] != config.hidden_size:
            raise ValueError(
                f"`sample` has shape {tuple(sample.shape)}, expected (batch, length, {config.hidden_size}): "
                f"the latent width must be hidden_size={config.hidden_size}."
            )
        if self_conditioning is not None and self_conditioning.shape != sample.shape:
            raise ValueError(
                f"`self_conditioning` has shape {tuple(self_conditioning.shape)}, expected {tuple(sample.shape)}."
            )
        backbone = self.backbone
        gamma = broadcast_per_example(timestep, sample.shape[0], sample.device, "timestep")
        x = sample.to(backbone.vocab_embed.embedding.dtype)
        if config.self_conditioning:
            if self_conditioning is None:
                self_conditioning = torch.zeros_like(x)
            x = x + backbone.self_cond_proj(torch.cat([x, self_conditioning.to(x.dtype)], dim=-1))
        c = F.silu(backbone.sigma_map(gamma))
        cos, sin = backbone.rotary_emb(x.shape[1], x.device)
        with autocast_region(sample, self.autocast_dtype):
            for block in backbone.blocks:
                x = block(x, cos, sin, c)
            logits = backbone.output_layer(x, c)
        if config.use_skip_logits:
            c_skip = ((F.softplus(-gamma) - gamma) / 2).exp()
            skip = sample.float() @ self.embedding_matrix().t().float()
            # autocast on: rounded to the output layer's bf16 before it is added (float32 logits), as the official
            logits = logits + c_skip[:, None, None] * skip.to(logits.dtype)
        if not return_dict:
            return (logits,)
        return LangFlowTransformerOutput(logits=logits)
