"""`ELFText2TextPipeline.from_official`: a conditional ELF checkpoint (XSum, WMT14 De-En) with its tokenizer, its
frozen T5 encoder and the official conditional sampler at the official settings.

The order is `official.py`'s, so every refusal is cheap: the settings (the table's, or the trainer's `config.yml`)
before the weights are read, the tokenizer and the encoder (a Hub id through the Hugging Face cache, or a folder)
before the checkpoint is unpickled, and the encoder's width against the network's before the pipeline is built.
"""

import os
from dataclasses import dataclass
from pathlib import Path

from ..hub import fetch_error_message, hub_offline, resolve_local
from ..models.convert import ELF_HUB_PATTERNS, load_official_elf, newest_checkpoint
from ..models.official_checkpoints import Sourced, by_steps
from ..models.official_settings import (
    CheckpointOrigin,
    elf_conditional_settings,
    elf_training_config,
    is_conditional_config,
    recognise,
)
from .official import Conversion, _split_hub_kwargs, _tokenizer, check_vocabulary, elf_scheduler


# The keyword arguments (and CLI flags) only a conditional checkpoint takes.
CONDITIONAL_OPTIONS = {
    "text_encoder": "--text-encoder",
    "guidance_scale": "--guidance-scale",
    "max_source_length": "--max-source-length",
}


@dataclass(frozen=True)
class ConditionalConversion(Conversion):
    """[`Conversion`] of a conditional checkpoint, with the text encoder's name (and where it was read)."""

    text_encoder: Sourced[str] | None = None


def _resolve(source, official_id: str | None, hub_kwargs: dict) -> tuple[CheckpointOrigin, Path]:
    path = resolve_local(source, ELF_HUB_PATTERNS, **hub_kwargs)
    origin = recognise(str(source), path, official_id)
    revision = hub_kwargs.get("revision")
    return CheckpointOrigin(origin.given, origin.repo_id, revision, origin.commit, origin.checkpoint), path


def is_conditional_elf(source: str | os.PathLike, official_id: str | None = None, **hub_kwargs) -> bool:
    """
    Whether an official ELF checkpoint takes a source text: a released conditional one (by its Hub id, a Hugging
    Face cache path of it, or `official_id`; nothing is downloaded for those), or one whose trainer's `config.yml`
    sets `eval_data_path` or `max_input_length`. Reads no weights.
    """
    released = recognise(str(source), None, official_id).checkpoint
    if released is not None:
        return released.conditioning is not None
    path = resolve_local(source, ELF_HUB_PATTERNS, **hub_kwargs)
    released = recognise(str(source), path, official_id).checkpoint
    if released is not None:
        return released.conditioning is not None
    found = elf_training_config(newest_checkpoint(path) if path.is_dir() else path)
    return found is not None and is_conditional_config(found[1])


def load_text_encoder(name: Sourced[str]):
    """The `T5EncoderModel` `name` names (a Hub id through the Hugging Face cache, or a folder), in eval mode, with a
    clear error naming `--text-encoder`."""
    from transformers import T5EncoderModel

    try:
        encoder = T5EncoderModel.from_pretrained(name.value, local_files_only=hub_offline())
    except (OSError, ValueError) as error:
        if Path(name.value).expanduser().exists():
            cause = f"the folder is not a T5 encoder ({type(error).__name__}: {error})"
        else:
            cause = fetch_error_message(name.value, {"local_files_only": hub_offline()}, error)
        raise ValueError(
            f"The text encoder {name.value!r} ({name.source}) could not be loaded: {cause.rstrip('.')}. Pass "
            "--text-encoder NAME_OR_PATH (text_encoder=): a T5 encoder folder, or a Hub id that is cached or "
            "reachable (t5-small for the released models)."
        ) from None
    return encoder.eval()


def _text_encoder(text_encoder, name: Sourced[str]):
    if text_encoder is None or isinstance(text_encoder, str | os.PathLike):
        return load_text_encoder(name), name
    given = getattr(text_encoder, "name_or_path", "") or type(text_encoder).__name__
    return text_encoder, Sourced(str(given), "given by the caller (a text encoder object)")


def check_conditioning_width(encoder, latent_dim: int, name: Sourced[str], checkpoint_file: Path) -> None:
    """The encoder's width must be the network's latent width (the official `text_encoder_dim=d_model`)."""
    width = getattr(encoder.config, "d_model", None)
    if width == latent_dim:
        return
    raise ValueError(
        f"The text encoder {name.value!r} ({name.source}) gives {width}-wide latents, but the network in "
        f"{checkpoint_file} conditions on {latent_dim}-wide ones (latent_dim): they belong to different models. Pass "
        "--text-encoder NAME_OR_PATH (text_encoder=) with the encoder the checkpoint was trained with (t5-small, 512 "
        "wide, for the released models)."
    )


def build_elf_text2text(
    cls,
    checkpoint,
    tokenizer=None,
    text_encoder=None,
    max_length: int | None = None,
    max_source_length: int | None = None,
    official_id: str | None = None,
    sde_gamma: float | None = None,
    sc_cfg_scale: float | None = None,
    guidance_scale: float | None = None,
    **kwargs,
):
    """[`ELFText2TextPipeline.from_official`]'s body (`cls`: the pipeline class)."""
    hub_kwargs, load_kwargs = _split_hub_kwargs(kwargs)
    origin, path = _resolve(checkpoint, official_id, hub_kwargs)
    checkpoint_file = newest_checkpoint(path) if path.is_dir() else path
    tokenizer_given = None if tokenizer is None or not isinstance(tokenizer, str | os.PathLike) else str(tokenizer)
    encoder_given = text_encoder if isinstance(text_encoder, str | os.PathLike) else None
    settings = elf_conditional_settings(
        origin,
        checkpoint_file,
        tokenizer_given,
        None if encoder_given is None else str(encoder_given),
        sde_gamma,
        sc_cfg_scale,
        guidance_scale,
        max_source_length,
    )
    recorded = settings.max_length
    if recorded is not None and max_length is not None and max_length != recorded.value:
        raise ValueError(
            f"--max-length {max_length} (max_length={max_length}) disagrees with max_length {recorded.value} of "
            f"{origin.repo_id} ({recorded.source}), which it was trained at: leave it out."
        )
    conditioning = settings.conditioning
    loaded_tokenizer, tokenizer_name = _tokenizer(tokenizer, settings)
    encoder, encoder_name = _text_encoder(text_encoder, conditioning.text_encoder)
    released_id = origin.checkpoint.repo_id if origin.checkpoint is not None else None
    transformer = load_official_elf(checkpoint_file, max_length=max_length, official_id=released_id, **load_kwargs)
    check_vocabulary(loaded_tokenizer, transformer.config.vocab_size, tokenizer_name, checkpoint_file)
    check_conditioning_width(encoder, transformer.config.latent_dim, encoder_name, checkpoint_file)
    sampling = settings.sampling
    pipe = cls(
        transformer=transformer,
        scheduler=elf_scheduler(sampling),
        tokenizer=loaded_tokenizer,
        text_encoder=encoder,
        sc_cfg_scale=sampling.sc_cfg_scale.value,
        sc_cfg_scale_by_steps=by_steps(sampling.sc_cfg_scale_by_steps) or None,
        max_source_length=conditioning.max_source_length.value,
        guidance_scale=conditioning.guidance_scale.value,
        latent_mean=conditioning.latent_mean.value,
        latent_std=conditioning.latent_std.value,
        pad_token=conditioning.pad_token.value,
    )
    weights = load_kwargs.get("weights", "ema_params1")
    pipe.conversion = ConditionalConversion(
        settings, checkpoint_file, tokenizer_name, transformer.config.max_length, weights, encoder_name
    )
    return pipe
