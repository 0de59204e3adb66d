"""Loading a pipeline folder without knowing its class in advance."""

import dataclasses
import json
import os
from pathlib import Path

from ..families import families
from ..hub import HUB_KWARGS, resolve_local
from ..input_checks import check_writes_stay_inside, pipeline_writes
from .pipeline_elf_text2text import ELFText2TextPipeline
from .remote_code import saved_class_name, write_remote_code


# The families' pipelines, and the conditional one, which only callers that handle prompts load.
PIPELINES = {family.pipeline.name: family.pipeline.load() for family in families()}
PIPELINES[ELFText2TextPipeline.__name__] = ELFText2TextPipeline
CONDITIONAL = {ELFText2TextPipeline.__name__}


def load_pipeline(source: str | os.PathLike, conditional: bool = False, **kwargs):
    """
    Loads a pipeline folder (or Hub repo id) of a registered family ([`ELFPipeline`], [`LangFlowPipeline`],
    [`FlowMapPipeline`]), picking the class from `model_index.json`; the keyword arguments are `from_pretrained`'s (`sampler_statistics=` a statistics folder or
    repo, `sampler_statistics_revision=` its revision; a flow map's `flowmap_statistics=` and
    `flowmap_statistics_revision=` likewise). With `conditional=True` (a caller that handles prompts), an
    [`ELFText2TextPipeline`] folder too; otherwise such a folder is refused, naming what takes it.
    """
    hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
    folder = resolve_local(source, **hub_kwargs)
    index = folder / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{folder} has no model_index.json; is it a pipeline folder?")
    name = saved_class_name(json.loads(index.read_text()))
    if name not in PIPELINES:
        raise ValueError(f"{index} names pipeline {name!r}; untied-sc loads {sorted(PIPELINES)}.")
    if name in CONDITIONAL and not conditional:
        raise ValueError(
            f"{index} names {name}, a conditional model that generates from a source text; this command samples "
            f"without prompts. Sample it with `{name}.from_pretrained(...)(prompt=...)`; `untied-sc calibrate "
            "--prompts FILE` and `untied-sc push-statistics` take it."
        )
    # The Hub arguments again: the folder is local now, and they still name its revision (for `pipe.origin`) and
    # serve a statistics repo's download (token, cache_dir).
    pipe = PIPELINES[name].from_pretrained(folder, **hub_kwargs, **kwargs)
    if getattr(pipe, "origin", None) is None:  # a pipeline that records no origin (the flow maps')
        return pipe
    if pipe.origin.given != str(source):
        pipe.origin = dataclasses.replace(pipe.origin, given=str(source))
    return pipe


def save_sampler_statistics(pipe, folder: str | os.PathLike) -> Path:
    """Writes only `pipe.sampler_statistics` into the existing pipeline folder `folder` and registers the component in
    its `model_index.json`. The other components stay byte for byte as they were (re-saving the whole pipeline would
    rewrite the weights in the loaded dtype, e.g. bf16 files as float32, and the tokenizer files)."""
    folder = Path(folder)
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        raise FileNotFoundError(f"{folder} has no model_index.json: give an existing pipeline folder (or --output).")
    statistics = pipe.sampler_statistics
    if statistics is None:
        raise ValueError("The pipeline has no sampler statistics to save.")
    check_writes_stay_inside(folder, pipeline_writes(folder, ("sampler_statistics",)), "saving the sampler statistics")
    statistics.save_pretrained(folder / "sampler_statistics")
    index = json.loads(index_path.read_text())
    index["sampler_statistics"] = [type(statistics).__module__, type(statistics).__name__]
    index_path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    write_remote_code(folder)  # the component's module file, for loading by repo id with diffusers' generic class
    return folder / "sampler_statistics"
