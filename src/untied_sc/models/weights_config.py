"""What a network's weights fix of its config: the sizes read from the tensor shapes, and the check that a saved
model folder's `config.json` builds exactly the tensors its weights hold. Imports no model class, so the models'
own `from_pretrained` can use it."""

import json
import os
import re
from pathlib import Path

import torch
from safetensors import safe_open

from ..families import get_family


def _count_blocks(state_dict: dict[str, torch.Tensor], prefix: str) -> int:
    indices = {int(m.group(1)) for key in state_dict if (m := re.match(re.escape(prefix) + r"(\d+)\.", key))}
    if indices != set(range(len(indices))):
        raise ValueError(f"Block indices under {prefix!r} are not contiguous: {sorted(indices)}.")
    return len(indices)


def _require(state_dict: dict[str, torch.Tensor], key: str, source: str) -> torch.Tensor:
    if key not in state_dict:
        raise ValueError(f"{source} has no {key!r}: is it an official checkpoint of this model family?")
    return state_dict[key]


def elf_config_from_state_dict(state_dict: dict[str, torch.Tensor], max_length: int, source: str = "state dict"):
    """Reads every ELF size from the tensor shapes; only `max_length` (RoPE, not stored) must be given."""
    latent_dim = _require(state_dict, "self_cond_proj.weight", source).shape[0]
    bottleneck_dim = _require(state_dict, "text_proj.proj1.weight", source).shape[0]
    hidden_size = _require(state_dict, "text_proj.proj2.weight", source).shape[0]
    head_dim = _require(state_dict, "blocks.0.attn.q_norm.weight", source).shape[0]
    sc_cfg = state_dict.get("self_cond_cfg_tokens")
    mode = state_dict.get("mode_tokens")
    return {
        "latent_dim": latent_dim,
        "max_length": max_length,
        "hidden_size": hidden_size,
        "num_layers": _count_blocks(state_dict, "blocks."),
        "num_attention_heads": hidden_size // head_dim,
        "intermediate_size": _require(state_dict, "blocks.0.mlp.w3.weight", source).shape[1],
        "bottleneck_dim": bottleneck_dim,
        "num_time_tokens": _require(state_dict, "t_emb_tokens", source).shape[1],
        "num_sc_cfg_tokens": 0 if sc_cfg is None else sc_cfg.shape[1],
        "num_mode_tokens": 0 if mode is None else mode.shape[1],
        "vocab_size": _require(state_dict, "unembed_bias", source).shape[0],
    }


def langflow_config_from_state_dict(state_dict: dict[str, torch.Tensor], source: str = "state dict") -> dict:
    """The LangFlow sizes the tensor shapes fix (not `max_length`, `use_skip_logits` or `gumbel_cutoff`: no weight
    holds them)."""
    vocab_size, hidden_size = _require(state_dict, "backbone.vocab_embed.embedding", source).shape
    head_dim = 2 * _require(state_dict, "backbone.rotary_emb.inv_freq", source).shape[0]
    return {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "cond_dim": _require(state_dict, "backbone.sigma_map.mlp.0.weight", source).shape[0],
        "num_layers": _count_blocks(state_dict, "backbone.blocks."),
        "num_attention_heads": hidden_size // head_dim,
        "self_conditioning": "backbone.self_cond_proj.weight" in state_dict,
    }


def elf_config_from_weights(weights: dict, source: str) -> dict:
    """What ELF weights say about the config (`max_length` aside: the weights do not fix it)."""
    return {key: value for key, value in elf_config_from_state_dict(weights, 0, source).items() if key != "max_length"}


def flowmap_config_from_weights(weights: dict, source: str = "state dict") -> dict:
    """The flow-map network sizes the tensor shapes fix (official `ELF`, `model.py` lines 38-226; not `max_length`,
    `two_time` or `const_phase`, which no weight holds: the stage of the checkpoint says them)."""
    hidden_size = _require(weights, "t_emb_tokens", source).shape[2]
    head_dim = _require(weights, "blocks.0.attn.q_norm.weight", source).shape[0]
    prefix_blocks = {"num_sc_cfg_tokens": "self_cond_cfg_tokens", "num_phase_tokens": "phase_emb_tokens"}
    prefix_blocks["num_mode_tokens"] = "mode_tokens"
    return {
        "latent_dim": _require(weights, "self_cond_proj.weight", source).shape[0],
        "hidden_size": hidden_size,
        "num_layers": _count_blocks(weights, "blocks."),
        "num_attention_heads": hidden_size // head_dim,
        "intermediate_size": _require(weights, "blocks.0.mlp.w3.weight", source).shape[1],
        "bottleneck_dim": _require(weights, "text_proj.proj1.weight", source).shape[0],
        "num_time_tokens": _require(weights, "t_emb_tokens", source).shape[1],
        **{name: weights[key].shape[1] if key in weights else 0 for name, key in prefix_blocks.items()},
        "vocab_size": _require(weights, "unembed_bias", source).shape[0],
    }


def saved_weight_files(folder: Path, variant: str | None = None) -> list[Path]:
    """The safetensors files `from_pretrained` reads in a model folder (one file, or the shards an index names);
    empty where there are none (a `.bin` file: diffusers reads and checks it)."""
    stem = "diffusion_pytorch_model" + (f".{variant}" if variant else "")
    single, index = folder / f"{stem}.safetensors", folder / f"{stem}.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map") or {}
        return [folder / name for name in sorted(set(weight_map.values()))]
    return []


def check_saved_model(model_cls, folder: str | os.PathLike, variant: str | None = None) -> None:
    """
    Before diffusers loads a saved model folder: its `config.json` builds exactly the tensors its weights hold.
    diffusers prints unused weights as a bare list and loads the rest, so a `num_layers` lowered by one samples with a
    block missing; here a size that the weights fix and the config gives otherwise is an error naming the file, the
    field and both values, and any other missing, unused or mis-shaped tensor one that lists them.
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    files = saved_weight_files(folder, variant)
    if not config_path.is_file() or not files or not all(path.is_file() for path in files):
        return  # diffusers names what is missing
    shapes = {}
    for path in files:
        with safe_open(path, framework="pt") as handle:
            shapes.update({key: tuple(handle.get_slice(key).get_shape()) for key in handle.keys()})
    weights = files[0] if len(files) == 1 else folder / f"{files[0].name.split('-')[0]} (+ shards)"
    config = json.loads(config_path.read_text())
    with torch.device("meta"):  # the model the config builds, without memory or initialisation cost
        model = model_cls.from_config(config)
    tensors = {key: torch.empty(shape, device="meta") for key, shape in shapes.items()}
    family = get_family(model_cls.family)
    try:
        saved = family.config_from_weights.load()(tensors, str(weights))
    except (KeyError, ValueError):
        saved = {}  # a tensor the sizes are read from is missing: the comparison below lists it
    wrong = {key: value for key, value in saved.items() if model.config.get(key) != value}
    if wrong:
        prefix = family.block_prefix
        fields = "; ".join(
            f"{key} = {model.config.get(key)!r} in {config_path.name}, {value!r} in the weights"
            + (f" (they hold {prefix}0 … {prefix}{value - 1})" if key == "num_layers" and value else "")
            for key, value in wrong.items()
        )
        fix = ", ".join(f'"{key}": {json.dumps(value)}' for key, value in wrong.items())
        raise ValueError(
            f"{config_path} does not fit its weights {weights}: {fields}. The network would be built from the "
            f"config and sample with weights missing or unused. Fix: set {fix} in {config_path} (the values the "
            "weights were saved with), or restore the config.json saved with these weights."
        )
    expected = {key: tuple(value.shape) for key, value in model.state_dict().items()}
    missing = sorted(set(expected) - set(shapes))
    unused = sorted(set(shapes) - set(expected))
    mismatched = [
        f"{key} {shapes[key]} in the weights, {expected[key]} by the config"
        for key in sorted(set(expected) & set(shapes))
        if shapes[key] != expected[key]
    ]
    problems = [f"missing tensors ({len(missing)}): {', '.join(missing)}"] if missing else []
    problems += [f"unused tensors ({len(unused)}): {', '.join(unused)}"] if unused else []
    problems += [f"mis-shaped tensors ({len(mismatched)}): {'; '.join(mismatched)}"] if mismatched else []
    if problems:
        raise ValueError(
            f"{config_path} does not fit its weights {weights} ({model_cls.__name__}): {' | '.join(problems)}. The "
            "config and the weights come from different models (or one was edited): restore the config.json saved "
            "with these weights."
        )
