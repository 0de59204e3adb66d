"""Pipelines from official checkpoints: the network, its tokenizer and the official sampler at its official settings.

`ELFPipeline.from_official` and `LangFlowPipeline.from_official` run these; `untied-sc convert` saves what they build
(`conversion.py`). The order makes every refusal cheap: a released conditional checkpoint is refused before anything
is downloaded, missing settings before the weights are read, and an unreachable tokenizer before the checkpoint is
unpickled.
"""

import os
from dataclasses import dataclass, replace
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..hub import HUB_KWARGS, fetch_error_message, hub_offline, resolve_local
from ..models.convert import (
    ELF_HUB_PATTERNS,
    LANGFLOW_HUB_PATTERNS,
    check_langflow_folder,
    load_official_elf,
    load_official_langflow,
    newest_checkpoint,
)
from ..models.official_checkpoints import ELFSampling, LangFlowSampling, Sourced, by_steps
from ..models.official_settings import (
    CheckpointOrigin,
    OfficialSettings,
    elf_settings,
    elf_training_config,
    langflow_settings,
    recognise,
    refuse_conditional,
)
from ..schedulers import ELFScheduler, LangFlowScheduler


@dataclass(frozen=True)
class Conversion:
    """
    What a pipeline was built from, for its model card (`conversion.py`): the settings and the file read.

    Args:
        settings: the checkpoint's origin and every setting, with where each was read.
        checkpoint_file: the file the weights were read from.
        tokenizer: the tokenizer's name or path (with where it was read).
        max_length: the sequence length the network was built for.
        weights: which weight set of the file was read (ELF: `ema_params1`, as the official evaluation); `None` for
            a file of one set.
    """

    settings: OfficialSettings
    checkpoint_file: Path
    tokenizer: Sourced[str]
    max_length: int
    weights: str | None = None


def _tokenizer_name(tokenizer) -> Sourced[str] | None:
    if tokenizer is None or isinstance(tokenizer, str | os.PathLike):
        return None
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    return Sourced(str(name), "given by the caller (a tokenizer object)")


def load_named_tokenizer(name: Sourced[str]) -> PreTrainedTokenizerBase:
    """The tokenizer `name` names (a Hub id through the Hugging Face cache, or a folder), with a clear error."""
    try:
        # HF_HUB_OFFLINE read now (huggingface_hub reads it once, at import): offline, only the cache is asked
        return AutoTokenizer.from_pretrained(name.value, local_files_only=hub_offline())
    except (OSError, ValueError) as error:
        if Path(name.value).expanduser().exists():
            cause = f"the folder is not a tokenizer ({type(error).__name__}: {error})"
        else:  # a Hub id: say which endpoint, whether offline, and the cache
            cause = fetch_error_message(name.value, {"local_files_only": hub_offline()}, error)
        raise ValueError(
            f"The tokenizer {name.value!r} ({name.source}) could not be loaded: {cause.rstrip('.')}. Pass --tokenizer "
            "NAME_OR_PATH (tokenizer=): a tokenizer folder, or a Hub id that is cached or reachable."
        ) from None


def check_vocabulary(tokenizer, vocab_size: int, tokenizer_name: Sourced[str], checkpoint_file: Path) -> None:
    """The tokenizer's vocabulary must be the network's (`len(tokenizer)` or `tokenizer.vocab_size`, as the
    official ELF code sizes the head from either)."""
    if vocab_size in (len(tokenizer), tokenizer.vocab_size):
        return
    raise ValueError(
        f"The tokenizer {tokenizer_name.value!r} ({tokenizer_name.source}) has {len(tokenizer)} tokens, but the "
        f"network in {checkpoint_file} predicts {vocab_size} (vocab_size): they belong to different models. Pass "
        "--tokenizer NAME_OR_PATH (tokenizer=) with the tokenizer the checkpoint was trained with."
    )


def _resolve(source, family: str, official_id: str | None, hub_kwargs: dict) -> tuple[CheckpointOrigin, Path]:
    """The checkpoint's origin and its local path: a released conditional checkpoint is refused before downloading."""
    refuse_conditional(recognise(str(source), None, official_id).checkpoint, family)
    patterns = ELF_HUB_PATTERNS if family == "elf" else LANGFLOW_HUB_PATTERNS
    path = resolve_local(source, patterns, **hub_kwargs)
    origin = recognise(str(source), path, official_id)
    revision = hub_kwargs.get("revision")
    return CheckpointOrigin(origin.given, origin.repo_id, revision, origin.commit, origin.checkpoint), path


def _split_hub_kwargs(kwargs: dict) -> tuple[dict, dict]:
    hub = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
    return hub, kwargs


def _tokenizer(tokenizer, settings: OfficialSettings) -> tuple[PreTrainedTokenizerBase, Sourced[str]]:
    named = _tokenizer_name(tokenizer)
    if named is not None:  # an object: used as it is
        return tokenizer, named
    return load_named_tokenizer(settings.tokenizer), settings.tokenizer


def elf_scheduler(sampling: ELFSampling) -> ELFScheduler:
    """The official ELF sampler at `sampling`'s settings."""
    return ELFScheduler(
        noise_scale=sampling.noise_scale.value,
        p_mean=sampling.p_mean.value,
        p_std=sampling.p_std.value,
        sde_gamma=None if sampling.sde_gamma is None else sampling.sde_gamma.value,
        sde_gamma_by_steps=by_steps(sampling.sde_gamma_by_steps),
        t_eps=sampling.t_eps.value,
    )


def _elf_length_source(checkpoint_file: Path, max_length: int | None) -> Sourced[int] | None:
    """Where an unlisted ELF checkpoint's sequence length is read, for the card (the loader checks the value)."""
    found = elf_training_config(checkpoint_file)
    if found is not None and found[1].get("max_length") is not None:
        return Sourced(found[1]["max_length"], f"{found[0]} (max_length)")
    if max_length is not None:
        return Sourced(max_length, "given by the caller (--max-length)")
    return None


def build_elf(
    cls,
    checkpoint,
    tokenizer=None,
    max_length: int | None = None,
    official_id: str | None = None,
    sde_gamma: float | None = None,
    sc_cfg_scale: float | None = None,
    **kwargs,
):
    """[`ELFPipeline.from_official`]'s body (`cls`: the pipeline class)."""
    hub_kwargs, load_kwargs = _split_hub_kwargs(kwargs)
    origin, path = _resolve(checkpoint, "elf", official_id, hub_kwargs)
    checkpoint_file = newest_checkpoint(path) if path.is_dir() else path
    given = _tokenizer_name(tokenizer)
    settings = elf_settings(
        origin, checkpoint_file, tokenizer if given is None else given.value, sde_gamma, sc_cfg_scale
    )
    recorded = settings.max_length
    if recorded is not None and max_length is not None and max_length != recorded.value:
        raise ValueError(
            f"--max-length {max_length} (max_length={max_length}) disagrees with max_length {recorded.value} of "
            f"{origin.repo_id} ({recorded.source}), which it was trained at: leave it out."
        )
    if recorded is None:
        settings = replace(settings, max_length=_elf_length_source(checkpoint_file, max_length))
    loaded_tokenizer, tokenizer_name = _tokenizer(tokenizer, settings)
    released_id = origin.checkpoint.repo_id if origin.checkpoint is not None else None
    transformer = load_official_elf(checkpoint_file, max_length=max_length, official_id=released_id, **load_kwargs)
    check_vocabulary(loaded_tokenizer, transformer.config.vocab_size, tokenizer_name, checkpoint_file)
    sampling = settings.sampling
    pipe = cls(
        transformer=transformer,
        scheduler=elf_scheduler(sampling),
        tokenizer=loaded_tokenizer,
        sc_cfg_scale=sampling.sc_cfg_scale.value,
        sc_cfg_scale_by_steps=by_steps(sampling.sc_cfg_scale_by_steps) or None,
    )
    weights = load_kwargs.get("weights", "ema_params1")
    pipe.conversion = Conversion(settings, checkpoint_file, tokenizer_name, transformer.config.max_length, weights)
    return pipe


def build_langflow(cls, source, tokenizer=None, official_id: str | None = None, **kwargs):
    """[`LangFlowPipeline.from_official`]'s body (`cls`: the pipeline class)."""
    hub_kwargs, load_kwargs = _split_hub_kwargs(kwargs)
    origin, folder = _resolve(source, "langflow", official_id, hub_kwargs)
    check_langflow_folder(folder)  # the layout before any tokenizer download
    given = _tokenizer_name(tokenizer)
    settings = langflow_settings(origin, folder, tokenizer if given is None else given.value)
    loaded_tokenizer, tokenizer_name = _tokenizer(tokenizer, settings)
    transformer = load_official_langflow(folder, **load_kwargs)
    weights = folder / "model.safetensors"
    check_vocabulary(loaded_tokenizer, transformer.config.vocab_size, tokenizer_name, weights)
    sampling: LangFlowSampling = settings.sampling
    # the proposal in the config, so that a bare `set_timesteps(N)` works
    scheduler = LangFlowScheduler(
        quantile_eps=sampling.quantile_eps.value, proposal=list(transformer.gumbel_parameters())
    )
    pipe = cls(transformer=transformer, scheduler=scheduler, tokenizer=loaded_tokenizer)
    pipe.conversion = Conversion(settings, weights, tokenizer_name, transformer.config.max_length)
    return pipe
