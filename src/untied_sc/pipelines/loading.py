"""Loading a pipeline folder without knowing its class in advance."""

import json
import os

from ..hub import HUB_KWARGS, resolve_local
from .pipeline_elf import ELFPipeline
from .pipeline_langflow import LangFlowPipeline


PIPELINES = {cls.__name__: cls for cls in (ELFPipeline, LangFlowPipeline)}


def load_pipeline(source: str | os.PathLike, **kwargs):
    """Loads an [`ELFPipeline`] or [`LangFlowPipeline`] folder (or Hub repo id), picking the class from `model_index.json`."""
    hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
    folder = resolve_local(source, **hub_kwargs)
    index = folder / "model_index.json"
    if not index.is_file():
        raise FileNotFoundError(f"{folder} has no model_index.json; is it a pipeline folder?")
    name = json.loads(index.read_text()).get("_class_name")
    if name not in PIPELINES:
        raise ValueError(f"{index} names pipeline {name!r}; untied-sc loads {sorted(PIPELINES)}.")
    return PIPELINES[name].from_pretrained(folder, **kwargs)
