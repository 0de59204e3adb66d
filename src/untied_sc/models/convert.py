"""Converters from the official checkpoint formats to diffusers-format model folders.

- ELF (official PyTorch port): one `torch.save` file `checkpoint_<step>` holding `params`, `ema_params1`, optimizer
  state and counters. Evaluation uses `ema_params1`, and so do we. The file is read with `weights_only=True`; a
  checkpoint that needs arbitrary unpickling is refused unless the caller opts in with `allow_pickle=True`.
- LangFlow: a transformers custom-code folder with `config.json` and `model.safetensors`.

Either source may be a local path or a Hugging Face Hub repo id (downloaded with `snapshot_download`).
"""

import json
import os
import pickle
import re
from pathlib import Path

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file

from ..hub import resolve_local
from .elf_transformer import ELFTransformerModel
from .langflow_transformer import LangFlowTransformerModel
from .official_checkpoints import official_checkpoint
from .weights_config import elf_config_from_state_dict


# The training config the official trainer writes beside its checkpoints (`config.yml` in its output_dir).
ELF_CONFIG_FILES = ("config.yml", "config.yaml", "config.json")
# What a converter downloads of a Hub repo: the checkpoints and the trainer's config (no optimizer side files).
ELF_HUB_PATTERNS = ["checkpoint_*", *ELF_CONFIG_FILES]
LANGFLOW_HUB_PATTERNS = ["config.json", "*.safetensors"]
COMMON_ELF_MAX_LENGTHS = "1024 for OpenWebText (ELF-B/M/L-owt), 1088 for XSum, 128 for WMT14 De-En"


class UnsafeCheckpointError(RuntimeError):
    """Raised when a checkpoint can only be read by unpickling arbitrary Python objects."""


def newest_checkpoint(folder: Path) -> Path:
    """The official loader's rule: the `checkpoint_<step>` file with the largest step."""
    candidates = [p for p in folder.iterdir() if re.fullmatch(r"checkpoint_\d+", p.name)]
    if not candidates:
        raise FileNotFoundError(
            f"No `checkpoint_<step>` file in {folder}: an official ELF checkpoint folder holds the trainer's "
            "`checkpoint_<step>` files (and its config.yml). Give the folder or file the trainer wrote."
        )
    return max(candidates, key=lambda p: int(p.name.split("_")[1]))


def _torch_load(path: Path, allow_pickle: bool) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=not allow_pickle)
    except pickle.UnpicklingError as error:
        if allow_pickle:
            raise ValueError(f"{path} is not a readable PyTorch checkpoint: {error}") from error
        raise UnsafeCheckpointError(
            f"{path} can only be loaded by unpickling arbitrary Python objects, which can run code. It was refused "
            f"(torch.load(weights_only=True) said: {str(error).splitlines()[0]}). If you trust its source, pass "
            "`allow_pickle=True` (CLI: `--allow-pickle`)."
        ) from error
    except (RuntimeError, EOFError, OSError) as error:
        raise ValueError(f"{path} is not a readable PyTorch checkpoint (corrupt or truncated?): {error}") from error


def _check_state_dict(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Missing keys, unexpected keys and shape mismatches are all errors, listed in full."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    mismatched = [
        f"{key}: checkpoint {tuple(state_dict[key].shape)} vs model {tuple(expected[key].shape)}"
        for key in sorted(set(expected) & set(state_dict))
        if tuple(state_dict[key].shape) != tuple(expected[key].shape)
    ]
    problems = []
    if missing:
        problems.append(f"missing keys ({len(missing)}): {', '.join(missing)}")
    if unexpected:
        problems.append(f"unexpected keys ({len(unexpected)}): {', '.join(unexpected)}")
    if mismatched:
        problems.append(f"shape mismatches ({len(mismatched)}): {'; '.join(mismatched)}")
    if problems:
        raise ValueError(f"The weights in {source} do not fit {type(model).__name__}: " + " | ".join(problems))


def _config_max_length(config, where: str) -> tuple[int, str] | None:
    """`max_length` from a training config (a mapping or an object with attributes), with where it was read."""
    value = config.get("max_length") if isinstance(config, dict) else getattr(config, "max_length", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{where}: max_length = {value!r} is not a positive integer; fix it or pass --max-length.")
    return value, where


def recorded_elf_max_length(source: str | os.PathLike, path: Path, payload: dict) -> tuple[int, str] | None:
    """
    The sequence length an official ELF checkpoint was trained at, where something records it, with where: the
    checkpoint's own `config` entry, the trainer's `config.yml` (or `.yaml`, `.json`) beside the checkpoint file, or
    the table of released checkpoints by repo id. `None` when nothing does.
    """
    if payload.get("config") is not None:
        found = _config_max_length(payload["config"], f"{path} (its 'config' entry)")
        if found is not None:
            return found
    for name in ELF_CONFIG_FILES:
        config_path = path.parent / name
        if not config_path.is_file():
            continue
        try:
            config = yaml.safe_load(config_path.read_text())  # YAML is a superset of JSON: it reads all three
        except (OSError, yaml.YAMLError) as error:
            raise ValueError(f"{config_path} is not a readable training config ({error}); fix or remove it.") from None
        found = _config_max_length(config, str(config_path)) if isinstance(config, dict) else None
        if found is not None:
            return found
    released = official_checkpoint(str(source))
    if released is not None:
        return released.max_length.value, f"the official training config of {released.repo_id}"
    return None


def resolve_elf_max_length(
    source: str | os.PathLike, path: Path, payload: dict, max_length: int | None
) -> tuple[int, str | None]:
    """
    The `max_length` to build the model with: the recorded one ([`recorded_elf_max_length`]) or the one given; both
    must agree. With neither, an error names `--max-length` and the released models' values: the RoPE tables are
    built for exactly this length, so a guess would give a model that refuses (or mis-positions) every sample.
    Returns the length and where it was read (`None` when given).
    """
    recorded = recorded_elf_max_length(source, path, payload)
    if recorded is None:
        if max_length is None:
            raise ValueError(
                f"{path} does not record the sequence length it was trained at (max_length: the RoPE tables are built "
                f"for exactly that many positions), and no {' / '.join(ELF_CONFIG_FILES)} beside it does. Pass it: "
                f"--max-length N (CLI) or max_length=N; the official models use {COMMON_ELF_MAX_LENGTHS}."
            )
        return max_length, None
    if max_length is not None and max_length != recorded[0]:
        raise ValueError(
            f"--max-length {max_length} (max_length={max_length}) disagrees with max_length {recorded[0]} in "
            f"{recorded[1]}, which the checkpoint was trained at: leave it out, or fix the config."
        )
    return recorded


def _build(model_cls, config: dict, state_dict: dict[str, torch.Tensor], source: str):
    model = model_cls(**config)
    _check_state_dict(model, state_dict, source)
    model.load_state_dict({key: value.float() for key, value in state_dict.items()})
    return model.eval()


def load_official_elf(
    source: str | os.PathLike,
    max_length: int | None = None,
    weights: str = "ema_params1",
    allow_pickle: bool = False,
    official_id: str | None = None,
    **hub_kwargs,
) -> ELFTransformerModel:
    """
    Builds an [`ELFTransformerModel`] from an official ELF PyTorch checkpoint.

    Args:
        source (`str` or `os.PathLike`): a `checkpoint_<step>` file, a folder holding such files (the newest step is
            taken, as the official loader does), or a Hub repo id such as `embedded-language-flows/ELF-B-owt-torch`.
        max_length (`int`, *optional*): the training sequence length, which the checkpoint file does not store.
            Read from the trainer's `config.yml` beside the checkpoint, or for a released checkpoint from its
            official config (1024 for the OpenWebText models, 1088 for XSum, 128 for WMT14 De-En); required when
            neither records it, and must agree with a recorded one.
        weights (`str`, defaults to `"ema_params1"`): which weight set to load; the official evaluation uses the EMA.
        allow_pickle (`bool`, defaults to `False`): read the file with full unpickling. Only for trusted files.
        official_id (`str`, *optional*): the Hub id of the released checkpoint a local `source` is a copy of, whose
            recorded sequence length then applies.
        hub_kwargs: passed to `huggingface_hub.snapshot_download` (`revision`, `cache_dir`, `token`, ...).
    """
    path = resolve_local(source, ELF_HUB_PATTERNS, **hub_kwargs)
    if path.is_dir():
        path = newest_checkpoint(path)
    payload = _torch_load(path, allow_pickle)
    if not isinstance(payload, dict) or weights not in payload:
        keys = sorted(payload) if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(f"{path} has no {weights!r} entry (found: {keys}); is it an official ELF checkpoint?")
    state_dict = dict(payload[weights])
    max_length, _ = resolve_elf_max_length(official_id or source, path, payload, max_length)
    config = elf_config_from_state_dict(state_dict, max_length, str(path))
    return _build(ELFTransformerModel, config, state_dict, str(path))


def langflow_config_from_official(official: dict) -> dict:
    """Maps an official LangFlow `config.json` onto [`LangFlowTransformerModel`]'s config."""
    if (
        official.get("use_normalized_embedding", True) is not True
        or official.get("embedding_norm_method", "layernorm") != "layernorm"
    ):
        raise ValueError(
            "Only LangFlow checkpoints with `use_normalized_embedding: true` and `embedding_norm_method: layernorm` "
            f"are supported (the released ones); got {official.get('use_normalized_embedding')!r} and "
            f"{official.get('embedding_norm_method')!r}."
        )
    return {
        "vocab_size": official["vocab_size"],
        "hidden_size": official["hidden_size"],
        "cond_dim": official["cond_dim"],
        "num_layers": official["n_blocks"],
        "num_attention_heads": official["n_heads"],
        "max_length": official["model_length"],
        "self_conditioning": official["self_conditioning"],
        "use_skip_logits": official["use_bias"],
        "gumbel_cutoff": official["gumbel_cutoff"],
    }


def check_langflow_folder(folder: Path) -> tuple[Path, Path]:
    """An official LangFlow folder's `config.json` and `model.safetensors`; a missing one is an error naming both."""
    config_file, weights_file = folder / "config.json", folder / "model.safetensors"
    for file in (config_file, weights_file):
        if not file.is_file():
            raise FileNotFoundError(
                f"{folder} has no {file.name}; an official LangFlow folder holds both config.json and "
                "model.safetensors (as the Hub repos Continuous-Rivals-Discrete/langflow-* do)."
            )
    return config_file, weights_file


def load_official_langflow(source: str | os.PathLike, **hub_kwargs) -> LangFlowTransformerModel:
    """
    Builds a [`LangFlowTransformerModel`] from an official LangFlow folder (`config.json` + `model.safetensors`).

    Args:
        source (`str` or `os.PathLike`): a local folder or a Hub repo id such as
            `Continuous-Rivals-Discrete/langflow-owt`.
        hub_kwargs: passed to `huggingface_hub.snapshot_download` (`revision`, `cache_dir`, `token`, ...).

    The Gumbel proposal's `loc` and `scale` come from the weights (`proposal.*`), not from `config.json`.
    """
    folder = resolve_local(source, LANGFLOW_HUB_PATTERNS, **hub_kwargs)
    config_file, weights_file = check_langflow_folder(folder)
    try:
        official = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_file} is not valid JSON: {error}") from error
    missing = [
        k
        for k in ("vocab_size", "hidden_size", "cond_dim", "n_blocks", "n_heads", "model_length")
        if k not in official
    ]
    if missing:
        raise ValueError(f"{config_file} lacks {missing}; is it an official LangFlow config?")
    official = {"self_conditioning": True, "use_bias": True, "gumbel_cutoff": 1e-5, **official}
    try:
        state_dict = load_file(weights_file)
    except (SafetensorError, OSError) as error:
        raise ValueError(
            f"{weights_file} is not a readable safetensors file (corrupt or truncated?): {error}"
        ) from error
    return _build(LangFlowTransformerModel, langflow_config_from_official(official), state_dict, str(weights_file))


def convert_official_elf(source: str | os.PathLike, output_dir: str | os.PathLike, **kwargs) -> ELFTransformerModel:
    """Loads an official ELF checkpoint (see [`load_official_elf`]) and saves it as a diffusers model folder."""
    model = load_official_elf(source, **kwargs)
    model.save_pretrained(output_dir)
    return model


def convert_official_langflow(
    source: str | os.PathLike, output_dir: str | os.PathLike, **kwargs
) -> LangFlowTransformerModel:
    """Loads an official LangFlow folder (see [`load_official_langflow`]) and saves it as a diffusers model folder."""
    model = load_official_langflow(source, **kwargs)
    model.save_pretrained(output_dir)
    return model
