"""`untied-sc convert`: an official checkpoint to a complete pipeline folder, written whole or not at all.

The pipeline is `ELFPipeline.from_official` / `LangFlowPipeline.from_official` (a conditional ELF checkpoint:
`ELFText2TextPipeline.from_official`) and its `save_pretrained` (the network, the tokenizer, the official scheduler's
config, `model_index.json`, the module files and the model card).
It is written into a temporary folder beside the output and renamed onto it at the end, so that an error or an
interruption leaves no half-written pipeline behind.
"""

import os
from pathlib import Path

from ..families import family_names, get_family
from ..hub import HUB_KWARGS
from ..models.official_settings import UnconditionalCheckpointError
from .atomic_folder import refuse_non_empty, replace_atomically
from .official_text2text import CONDITIONAL_OPTIONS, is_conditional_elf
from .pipeline_elf_text2text import ELFText2TextPipeline


def save_atomically(pipe, output: str | os.PathLike, overwrite: bool = False) -> Path:
    """
    `pipe.save_pretrained` into a temporary folder beside `output`, then renamed onto it: `output` is either the
    complete folder or untouched. A non-empty `output` is refused unless `overwrite` (then it is replaced).
    """
    output = Path(output).expanduser()
    refuse_non_empty(output, overwrite, "pass --overwrite")
    return replace_atomically(output, pipe.save_pretrained)


def convert_official(
    family: str, source: str | os.PathLike, output: str | os.PathLike, overwrite: bool = False, **kwargs
):
    """
    Builds the pipeline of an official checkpoint (`ELFPipeline.from_official` / `LangFlowPipeline.from_official`
    with `kwargs`) and saves it to `output` whole ([`save_atomically`]). Returns the pipeline.
    """
    if family not in family_names():
        raise ValueError(f"family must be one of {sorted(family_names())}, got {family!r}.")
    refuse_non_empty(Path(output).expanduser(), overwrite, "pass --overwrite")  # before any download or load
    pipeline_class = get_family(family).pipeline.load()
    if family == "elf":
        pipeline_class, kwargs = conversion_pipeline_class(pipeline_class, source, kwargs)
    pipe = pipeline_class.from_official(source, **kwargs)
    save_atomically(pipe, output, overwrite)
    return pipe


def conversion_pipeline_class(unconditional: type, source, kwargs: dict) -> tuple[type, dict]:
    """
    The pipeline class `untied-sc convert elf` builds for `source` ([`ELFText2TextPipeline`] for a conditional
    checkpoint, `unconditional` (the family's, [`ELFPipeline`]) otherwise), and the keyword arguments it takes: the
    conditional options left out where none was given; given to an unconditional checkpoint, they are refused
    naming the flags.
    """
    given = {key: kwargs[key] for key in CONDITIONAL_OPTIONS if kwargs.get(key) is not None}
    rest = {key: value for key, value in kwargs.items() if key not in CONDITIONAL_OPTIONS}
    hub_kwargs = {key: value for key, value in rest.items() if key in HUB_KWARGS}
    if is_conditional_elf(source, rest.get("official_id"), **hub_kwargs):
        return ELFText2TextPipeline, {**rest, **given}
    if given:
        flags = ", ".join(CONDITIONAL_OPTIONS[key] for key in given)
        raise UnconditionalCheckpointError(
            f"{flags}: for a conditional checkpoint only, and {source} is unconditional (it takes no source text): "
            "leave them out."
        )
    return unconditional, rest
