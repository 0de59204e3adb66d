"""The self-conditioned flow-map language models (FMLM*, ELF*; https://huggingface.co/papers/2607.00714).

The network of `github.com/Ugness/self-conditioned-fmlm@f2472c9` (`pytorch_lightning/modules/model.py`, `ELF`): the
ELF block on GPT-2-Large latents, with two times (`double_time_emb`: a source time s and a target time t in the time
prefix), the SC-CFG scale as an input, a bank of CDEQ phase tokens, and an exact-GELU decoder head. Blocks, embedders
and the bottleneck are ELF's, imported from `elf_transformer`. Also the converter from the official Lightning
checkpoint (`load_official_flowmap`), which swaps in the EMA weights as the official evaluation does.
"""

import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin
from diffusers.utils import BaseOutput
from torch import nn

from ..hub import resolve_local
from .convert import _check_state_dict, _torch_load
from .elf_transformer import BottleneckTextProj, ELFBlock, FinalLayer, TimestepEmbedder, interleaved_rope_tables
from .embeddings import DtypeAliasMixin, broadcast_per_example
from .official_checkpoints import cache_snapshot
from .weights_config import flowmap_config_from_weights


OFFICIAL_FMLM = "github.com/Ugness/self-conditioned-fmlm@f2472c9"
# The released models: the stage each checkpoint file holds (README "Checkpoints"), and how the official evaluation
# builds its network (`pytorch_lightning/eval_lightning.py` lines 108-130 with the stage's training config).
FLOWMAP_VARIANTS: dict[str, dict] = {
    # Stage 3, `train_owt_FMLM_star.yml`: double_time_emb, the phase bank pinned at cdeq_inference_phase = 0.002.
    "fmlm-star": {"file": "fmlm_star.ckpt", "two_time": True, "const_phase": 0.002},
    # Stage 2, `train_owt_ELF_star.yml`: double_time_emb, the phase bank fed per call (cdeq: 0.002).
    "elf-star": {"file": "elf_star.ckpt", "two_time": True, "const_phase": None},
    # Stage 1, `train_owt_ELF-B_gpt2.yml`: the self-conditioned ELF teacher, single time, no phase bank.
    "elf": {"file": "elf.ckpt", "two_time": False, "const_phase": None},
}
FLOWMAP_HUB_REPO = "wonjKim/self-conditioned-fmlm"
# The released configs' sequence length (`max_length: 1024` in every `train_owt_*.yml`).
FLOWMAP_MAX_LENGTH = 1024


@dataclass
class FlowMapTransformerOutput(BaseOutput):
    """
    Output of [`FlowMapTransformerModel`].

    Args:
        sample (`torch.Tensor` of shape `(batch, length, latent_dim)`): the clean-latent prediction x̂(z, s, t).
        logits (`torch.Tensor` of shape `(batch, length, vocab_size)`, *optional*): decoder-head logits, only on
            the decode pass (`decoder_step_active=True`).
    """

    sample: torch.Tensor
    logits: torch.Tensor | None = None


class FlowMapTransformerModel(DtypeAliasMixin, ModelMixin, ConfigMixin):
    r"""
    The two-time FMLM*/ELF* network, an x-prediction x̂(z, s → t, m, w) on normalised GPT-2-Large latents.

    Prefix per example (official `build_context`, `model.py` lines 149-175, and `forward`, lines 186-216):
    `[time (num_time_tokens), SC-CFG (num_sc_cfg_tokens), phase (num_phase_tokens), mode (num_mode_tokens), latent]`.
    With `two_time`, the first `num_time_tokens // 2` time tokens carry the embedding of the target time t and the
    rest that of the source time s (s = t: the single-time model). All prefix rows get the identity rotation. The
    self-conditioning input m enters as ELF's, `text_proj(self_cond_proj([z, m]))`.

    Args:
        latent_dim (`int`, defaults to 1280): the latent width (GPT-2-Large's hidden size).
        max_length (`int`, defaults to 1024): the sequence length the RoPE tables are built for.
        hidden_size, num_layers, num_attention_heads, intermediate_size, bottleneck_dim: ELF-B's sizes by default.
        num_time_tokens (`int`, defaults to 4), num_sc_cfg_tokens (`int`, defaults to 4), num_phase_tokens (`int`,
            defaults to 4), num_mode_tokens (`int`, defaults to 4): the prefix blocks (0 drops SC-CFG, phase, mode).
        vocab_size (`int`, defaults to 50257): the GPT-2 vocabulary of the decoder head.
        two_time (`bool`, defaults to `True`): the official `double_time_emb`.
        const_phase (`float`, *optional*): the phase a denoiser pass uses when none is given (FMLM*: 0.002, the
            official `const_phase`); `None`: phase 0. The decode pass always uses phase 0, as the official one.
        rope_theta (`float`, defaults to 10000.0): the RoPE base.
    """

    family = "flowmap"
    _supports_gradient_checkpointing = False
    _no_split_modules = ["ELFBlock"]

    @register_to_config
    def __init__(
        self,
        latent_dim: int = 1280,
        max_length: int = FLOWMAP_MAX_LENGTH,
        hidden_size: int = 768,
        num_layers: int = 12,
        num_attention_heads: int = 12,
        intermediate_size: int = 2048,
        bottleneck_dim: int = 128,
        num_time_tokens: int = 4,
        num_sc_cfg_tokens: int = 4,
        num_phase_tokens: int = 4,
        num_mode_tokens: int = 4,
        vocab_size: int = 50257,
        two_time: bool = True,
        const_phase: float | None = None,
        rope_theta: float = 10000.0,
    ):
        super().__init__()
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"hidden_size={hidden_size} is not divisible by num_attention_heads={num_attention_heads}."
            )
        if num_time_tokens < (2 if two_time else 1):
            raise ValueError(f"num_time_tokens={num_time_tokens} is too few: time enters only through these tokens.")
        if const_phase is not None and num_phase_tokens == 0:
            raise ValueError("const_phase needs phase tokens (num_phase_tokens > 0).")
        self.self_cond_proj = nn.Linear(2 * latent_dim, latent_dim)
        self.text_proj = BottleneckTextProj(latent_dim, hidden_size, bottleneck_dim)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_emb_tokens = nn.Parameter(torch.zeros(1, num_time_tokens, hidden_size))
        if num_sc_cfg_tokens > 0:
            self.self_cond_cfg_embedder = TimestepEmbedder(hidden_size)
            self.self_cond_cfg_tokens = nn.Parameter(torch.zeros(1, num_sc_cfg_tokens, hidden_size))
        if num_phase_tokens > 0:
            self.phase_embedder = TimestepEmbedder(hidden_size)
            self.phase_emb_tokens = nn.Parameter(torch.zeros(1, num_phase_tokens, hidden_size))
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
        self.num_prefix_tokens = num_time_tokens + num_sc_cfg_tokens + num_phase_tokens + num_mode_tokens
        cos, sin = interleaved_rope_tables(
            hidden_size // num_attention_heads, max_length, self.num_prefix_tokens, rope_theta
        )
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def input_maps(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(W_z, W_m) = (proj1 · W_sc[:, :D], proj1 · W_sc[:, D:]) in float64 on the CPU: the maps of the latent and
        of the self-conditioning input into the shared bottleneck (docs/algorithm.md §4.1, as for ELF)."""
        with torch.no_grad():
            w_sc = self.self_cond_proj.weight.detach().to(device="cpu", dtype=torch.float64)
            w_b = self.text_proj.proj1.weight.detach().to(device="cpu", dtype=torch.float64)
            dim = w_sc.shape[0]
            return w_b @ w_sc[:, :dim], w_b @ w_sc[:, dim:]

    def forward(
        self,
        sample: torch.Tensor,
        timestep: torch.Tensor | float,
        source_timestep: torch.Tensor | float | None = None,
        self_conditioning: torch.Tensor | None = None,
        sc_cfg_scale: torch.Tensor | float | None = None,
        phase: torch.Tensor | float | None = None,
        decoder_step_active: bool = False,
        return_dict: bool = True,
    ) -> FlowMapTransformerOutput | tuple:
        r"""
        Args:
            sample (`torch.Tensor` of shape `(batch, max_length, latent_dim)`): the latent z at the source time s.
            timestep (`torch.Tensor` of shape `(batch,)` or `float`): the target time t ∈ [0, 1] (1 = data).
            source_timestep (`torch.Tensor` or `float`, *optional*): the source time s; `None` means s = t.
            self_conditioning (`torch.Tensor`, *optional*): the self-conditioning input m; `None` means zeros.
            sc_cfg_scale (`torch.Tensor` or `float`): the SC-CFG scale w (required with SC-CFG tokens).
            phase (`torch.Tensor` or `float`, *optional*): the CDEQ phase; `None`: `const_phase` on a denoiser pass
                (0 without one), 0 on the decode pass.
            decoder_step_active (`bool`, defaults to `False`): the decode pass: mode tokens on, logits computed.
            return_dict (`bool`, defaults to `True`): return a [`FlowMapTransformerOutput`] or a tuple.
        """
        config = self.config
        batch = self._check_latent(sample, "sample")
        device, dtype = sample.device, self.self_cond_proj.weight.dtype
        if self_conditioning is None:
            self_conditioning = torch.zeros_like(sample)
        else:
            self._check_latent(self_conditioning, "self_conditioning", batch)
        x = self.text_proj(self.self_cond_proj(torch.cat([sample, self_conditioning], dim=-1).to(dtype)))

        target = broadcast_per_example(timestep, batch, device, "timestep")
        t_emb = self.t_embedder(target)[:, None]
        if config.two_time:
            source = target if source_timestep is None else broadcast_per_example(source_timestep, batch, device, "s")
            n_t = config.num_time_tokens // 2
            s_emb = self.t_embedder(source)[:, None]
            t_emb = torch.cat([t_emb.expand(-1, n_t, -1), s_emb.expand(-1, config.num_time_tokens - n_t, -1)], dim=1)
        prefix = [self.t_emb_tokens + t_emb]
        if config.num_sc_cfg_tokens > 0:
            if sc_cfg_scale is None:
                raise ValueError("This model has SC-CFG tokens, so `sc_cfg_scale` is required (FMLM*: 5.0).")
            scale = broadcast_per_example(sc_cfg_scale, batch, device, "sc_cfg_scale")
            prefix.append(self.self_cond_cfg_tokens + self.self_cond_cfg_embedder(scale)[:, None])
        if config.num_phase_tokens > 0:
            if phase is None:
                phase = config.const_phase if (config.const_phase is not None and not decoder_step_active) else 0.0
            phases = broadcast_per_example(phase, batch, device, "phase")
            prefix.append(self.phase_emb_tokens + self.phase_embedder(phases)[:, None])
        if config.num_mode_tokens > 0:
            prefix.append(self.mode_tokens.expand(batch, -1, -1) * float(bool(decoder_step_active)))
        x = torch.cat([torch.cat([p.expand(batch, -1, -1) for p in prefix], dim=1), x], dim=1)
        for block in self.blocks:
            x = block(x, self.rope_cos, self.rope_sin, None)
        hidden = x[:, self.num_prefix_tokens :]
        logits = None
        if decoder_step_active:
            # exact GELU (official `model.py` line 224)
            logits = F.gelu(hidden @ self.proj_kernel + self.proj_bias) @ self.unembed_kernel + self.unembed_bias
        prediction = self.final_layer(hidden)
        if not return_dict:
            return (prediction, logits)
        return FlowMapTransformerOutput(sample=prediction, logits=logits)

    def _check_latent(self, tensor: torch.Tensor, name: str, batch: int | None = None) -> int:
        expected = (batch if batch is not None else tensor.shape[0], self.config.max_length, self.config.latent_dim)
        if tensor.ndim != 3 or tuple(tensor.shape) != expected:
            raise ValueError(
                f"`{name}` has shape {tuple(tensor.shape)}, expected {expected} (batch, max_length, latent_dim)."
            )
        if not torch.is_floating_point(tensor):
            raise ValueError(f"`{name}` must be a floating-point tensor, got {tensor.dtype}.")
        return tensor.shape[0]


# The official parameter names that differ from ours (the official `FinalLayer` calls its norm `norm`).
_RENAMES = {"final_layer.norm.weight": "final_layer.norm_final.weight"}


def flowmap_config_from_state_dict(state_dict: dict[str, torch.Tensor], max_length: int, variant: str) -> dict:
    """The [`FlowMapTransformerModel`] config of an official state dict: sizes from the shapes, the two-time switch
    and the constant phase from the released `variant` (the shapes of FMLM* and ELF* are the same)."""
    if variant not in FLOWMAP_VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {sorted(FLOWMAP_VARIANTS)}.")
    try:
        config = flowmap_config_from_weights(state_dict, "The weights")
    except ValueError as error:
        raise ValueError(
            f"{error} An official FMLM*/ELF* network state dict has it (built with self_cond_prob > 0, as the "
            "released ones)."
        ) from None
    config["max_length"] = max_length
    config["two_time"] = FLOWMAP_VARIANTS[variant]["two_time"]
    config["const_phase"] = FLOWMAP_VARIANTS[variant]["const_phase"]
    return config


def ema_state_dict(payload: dict, source: str) -> dict[str, torch.Tensor]:
    """
    The network's weights as the official evaluation uses them (`eval_lightning.py` lines 136-154): the `model.*`
    entries of the Lightning `state_dict`, each parameter the EMA shadow holds replaced by its shadow (`EMA.swap_in`,
    `lightning_module.py` lines 53-60). A checkpoint without an `ema` entry is an error (the official evaluation
    would warn and sample the raw weights; say `weights="raw"` for that).
    """
    if not isinstance(payload, dict) or "state_dict" not in payload:
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{source} has no 'state_dict' entry (found: {keys}); is it a Lightning checkpoint?")
    state = {k.removeprefix("model."): v for k, v in payload["state_dict"].items() if k.startswith("model.")}
    if not state:
        raise ValueError(f"{source}: its state_dict has no 'model.*' entries (the official network's weights).")
    ema = payload.get("ema")
    if not isinstance(ema, dict) or not isinstance(ema.get("shadow"), dict):
        raise ValueError(
            f"{source} has no EMA weights ('ema' with a 'shadow'); the official evaluation samples the EMA. "
            "Pass weights='raw' (CLI: --weights raw) to convert the raw weights."
        )
    unknown = sorted(set(ema["shadow"]) - set(state))
    if unknown:
        raise ValueError(f"{source}: EMA entries without a network weight: {', '.join(unknown[:5])}.")
    return {**state, **ema["shadow"]}


@dataclass(frozen=True)
class FlowMapCheckpointSettings:
    """
    What an official checkpoint's training config records beyond its weights, with where each was read.

    Args:
        max_length (`int`): the sequence length (`max_length`).
        self_conditioning (`str`): FMLM*'s sampling regime, `"free"` (`elfmap_student_sc_free: true`, the released
            one) or `"chained"` (the legacy hybrid regime); `"free"` for ELF* (cdeq feeds zeros) and the teacher.
        source (`str`): where they were read.
    """

    max_length: int
    self_conditioning: str
    source: str


# What a training config says a checkpoint is (`eval_lightning.py` lines 108-130): the stage from `cdeq_enabled`
# (ELF*) and `elfmap_enabled` (FMLM*), else the stage-1 teacher.
def _variant_of_config(config: dict) -> str:
    if config.get("cdeq_enabled"):
        return "elf-star"
    return "fmlm-star" if config.get("elfmap_enabled") else "elf"


def _released(source: str | os.PathLike, path: Path) -> bool:
    if str(source).lower() == FLOWMAP_HUB_REPO.lower():
        return True
    snapshot = cache_snapshot(path)
    return snapshot is not None and snapshot[0].lower() == FLOWMAP_HUB_REPO.lower()


def flowmap_checkpoint_settings(
    source: str | os.PathLike,
    path: Path,
    variant: str,
    max_length: int | None = None,
    self_conditioning: str | None = None,
) -> FlowMapCheckpointSettings:
    """
    The settings of an official checkpoint: for the released repo `wonjKim/self-conditioned-fmlm` (its id, or a path
    in a Hugging Face cache snapshot of it) from its training configs (`max_length: 1024`, FMLM*
    self-conditioning-free); else from the trainer's `config.yml` beside it (`train_lightning.py` writes it into
    `output_dir`, beside `last.ckpt`), checked against `variant`; otherwise both must be given (FMLM*; ELF* and the teacher need only `max_length`). A given value that
    disagrees with a recorded one is an error.
    """
    given_sc = self_conditioning
    if given_sc is not None and given_sc not in ("free", "chained"):
        raise ValueError(f"self_conditioning must be 'free' or 'chained', got {given_sc!r}.")
    config_path = path.parent / "config.yml"
    if _released(source, path):
        recorded_length, recorded_sc = FLOWMAP_MAX_LENGTH, "free"
        where = f"the released training configs ({OFFICIAL_FMLM} train_owt_*.yml; FMLM*: elfmap_student_sc_free)"
    elif config_path.is_file():
        try:
            config = yaml.safe_load(config_path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"{config_path} is not a readable training config ({error}); fix or remove it.") from None
        implied = _variant_of_config(config)
        if implied != variant:
            raise ValueError(
                f"{config_path} is the training config of {implied} (cdeq_enabled={config.get('cdeq_enabled')}, "
                f"elfmap_enabled={config.get('elfmap_enabled')}), not {variant}: pass --variant {implied}."
            )
        recorded_length = config.get("max_length")
        recorded_sc = "free" if config.get("elfmap_student_sc_free") or variant != "fmlm-star" else "chained"
        where = str(config_path)
    else:
        missing = [] if max_length is not None else ["--max-length N (max_length=N; the released models: 1024)"]
        if variant == "fmlm-star" and given_sc is None:
            missing.append("--self-conditioning free|chained (the released FMLM*: free)")
        if missing:
            raise ValueError(
                f"{path} records neither its sequence length nor its sampling regime, and no config.yml (the "
                f"trainer's, written beside last.ckpt) is beside it. Pass {' and '.join(missing)}."
            )
        return FlowMapCheckpointSettings(max_length, given_sc or "free", "given")
    if not isinstance(recorded_length, int) or isinstance(recorded_length, bool) or recorded_length < 1:
        raise ValueError(f"{where}: max_length = {recorded_length!r} is not a positive integer; fix it.")
    for name, given, recorded in (
        ("max_length", max_length, recorded_length),
        ("self_conditioning", given_sc, recorded_sc),
    ):
        if given is not None and given != recorded:
            raise ValueError(f"{name}={given!r} disagrees with {recorded!r} recorded by {where}: leave it out.")
    return FlowMapCheckpointSettings(recorded_length, recorded_sc, where)


def read_official_flowmap(
    source: str | os.PathLike,
    variant: str,
    max_length: int | None = None,
    self_conditioning: str | None = None,
    weights: str = "ema",
    allow_pickle: bool = False,
    **hub_kwargs,
) -> tuple[FlowMapTransformerModel, FlowMapCheckpointSettings]:
    """[`load_official_flowmap`], also returning the checkpoint's [`FlowMapCheckpointSettings`]."""
    if variant not in FLOWMAP_VARIANTS:
        raise ValueError(f"Unknown variant {variant!r}; choose one of {sorted(FLOWMAP_VARIANTS)} (--variant).")
    if weights not in ("ema", "raw"):
        raise ValueError(f"weights must be 'ema' or 'raw', got {weights!r}.")
    filename = FLOWMAP_VARIANTS[variant]["file"]
    path = resolve_local(source, [filename], **hub_kwargs)
    if path.is_dir():
        path = Path(path) / filename
        if not path.is_file():
            raise FileNotFoundError(f"{path.parent} has no {filename} (the {variant} checkpoint); give the file.")
    settings = flowmap_checkpoint_settings(source, path, variant, max_length, self_conditioning)
    payload = _torch_load(path, allow_pickle)
    if weights == "ema":
        state_dict = ema_state_dict(payload, str(path))
    else:
        state_dict = ema_state_dict({**payload, "ema": {"shadow": {}}}, str(path))
    state_dict = {_RENAMES.get(k, k): v for k, v in state_dict.items()}
    config = flowmap_config_from_state_dict(state_dict, settings.max_length, variant)
    model = FlowMapTransformerModel(**config)
    _check_state_dict(model, state_dict, str(path))
    model.load_state_dict({k: v.float() for k, v in state_dict.items()})
    return model.eval(), settings


def load_official_flowmap(
    source: str | os.PathLike,
    variant: str,
    max_length: int | None = None,
    self_conditioning: str | None = None,
    weights: str = "ema",
    allow_pickle: bool = False,
    **hub_kwargs,
) -> FlowMapTransformerModel:
    """
    Builds a [`FlowMapTransformerModel`] from an official Lightning checkpoint of FMLM*, ELF* or the ELF teacher.

    Args:
        source (`str` or `os.PathLike`): a `.ckpt` file, a folder holding the variant's file (`fmlm_star.ckpt`,
            `elf_star.ckpt`, `elf.ckpt`), or the Hub repo `wonjKim/self-conditioned-fmlm`.
        variant (`str`): `"fmlm-star"`, `"elf-star"` or `"elf"` (the stage-1 teacher); the weights of FMLM* and ELF*
            cannot be told apart (same shapes), and the official evaluation builds them differently (`const_phase`).
        max_length (`int`, *optional*): the sequence length, which the checkpoint does not store (the RoPE tables
            are not saved): read from the trainer's `config.yml` beside it, or the released configs' 1024 for the
            released repo; required otherwise ([`flowmap_checkpoint_settings`]).
        self_conditioning (`str`, *optional*): FMLM*'s regime, recorded the same way; required as `max_length` is.
        weights (`str`, defaults to `"ema"`): `"ema"` (the official evaluation's) or `"raw"`.
        allow_pickle (`bool`, defaults to `False`): read with full unpickling; Lightning checkpoints pickle their
            hyper-parameters, so this is needed for most of them. Only for trusted files.
        hub_kwargs: passed to `huggingface_hub.snapshot_download`.
    """
    return read_official_flowmap(source, variant, max_length, self_conditioning, weights, allow_pickle, **hub_kwargs)[
        0
    ]


def convert_official_flowmap(
    source: str | os.PathLike, output_dir: str | os.PathLike, variant: str, **kwargs
) -> FlowMapTransformerModel:
    """Loads an official checkpoint (see [`load_official_flowmap`]) and saves it as a diffusers model folder."""
    model = load_official_flowmap(source, variant, **kwargs)
    model.save_pretrained(output_dir)
    return model
