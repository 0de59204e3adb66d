"""How a pipeline is loaded: from a local folder or a Hub repo id, with sampler statistics published on their own,
and our module files read as the package's classes (never through diffusers' remote-code import)."""

import importlib
import os
from pathlib import Path

from ..hub import HUB_KWARGS, resolve_local

# Every component class a folder of ours names, under one library (`components.py`). Importing it also imports each
# module model_index.json names: diffusers resolves a component's library only among modules already imported.
from . import components
from .artifact_checks import check_pipeline_folder
from .remote_code import MODULE_NAME, is_package_component, is_package_module, package_components


class PretrainedMixin:
    """The loading methods of [`LanguageFlowPipeline`], over diffusers' `DiffusionPipeline` ones."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs):
        """
        Loads a pipeline from a local folder or a Hub repo id.

        A repo id is downloaded with `huggingface_hub.snapshot_download` (honouring `HF_HUB_OFFLINE`, `cache_dir`,
        `revision`, `token`) and then loaded locally: stock diffusers cannot load third-party components by repo
        id. Other keyword arguments (`torch_dtype`, `device_map`, component overrides) go to diffusers.

        `sampler_statistics` given as a folder or repo id (a str or path) loads the pipeline's weights with sampler
        statistics published on their own (`push_sampler_statistics`; a calibrated pipeline's folder or repo also
        serves, without its weights): their coefficients and tuning records replace the scheduler config's, and
        statistics computed for other weights are refused, naming both sources. `revision`, `token` and `cache_dir`
        apply to the pipeline; `sampler_statistics_revision` is the statistics repo's revision (`token` and
        `cache_dir` apply to it too). A `SamplerStatistics` object (or `None`) is used as it is, as diffusers does.

        The pipeline's `origin` ([`~untied_sc.pipelines.statistics_repo.PipelineOrigin`]) records its Hub repo and
        commit and the official checkpoint it was converted from, for `push_sampler_statistics`.
        """
        from .statistics_repo import folder_origin, install_statistics, load_statistics_source

        statistics_revision = kwargs.pop("sampler_statistics_revision", None)
        statistics_source = kwargs.get("sampler_statistics")
        if not isinstance(statistics_source, str | os.PathLike):
            if statistics_revision is not None:
                raise TypeError(
                    "sampler_statistics_revision is the revision of a statistics repo: give the repo too, "
                    "`from_pretrained(..., sampler_statistics='owner/name', sampler_statistics_revision=...)`."
                )
            statistics_source = None
        hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        published = None
        if statistics_source is not None:  # the small download first: a wrong or unreachable repo fails at once
            kwargs["sampler_statistics"] = None  # the base's own statistics are not loaded
            shared = {key: value for key, value in hub_kwargs.items() if key != "revision"}
            published = load_statistics_source(statistics_source, revision=statistics_revision, **shared)
        folder = resolve_local(pretrained_model_name_or_path, **hub_kwargs)
        check_pipeline_folder(folder, cls, passed=set(kwargs))
        pipe = super().from_pretrained(folder, **kwargs)
        pipe.origin = folder_origin(folder, str(pretrained_model_name_or_path), hub_kwargs.get("revision"))
        if published is not None:
            install_statistics(pipe, published)
        return pipe

    @classmethod
    def _attach_official_statistics(cls, pipe, source, revision: str | None, hub_kwargs: dict):
        """`from_official`'s `sampler_statistics=` source, installed as in `from_pretrained`."""
        if source is None:
            if revision is not None:
                raise TypeError("sampler_statistics_revision needs sampler_statistics (a statistics folder or repo).")
            return pipe
        from .statistics_repo import attach_statistics

        shared = {key: value for key, value in hub_kwargs.items() if key in HUB_KWARGS and key != "revision"}
        attach_statistics(pipe, source, revision=revision, **shared)
        return pipe

    @classmethod
    def load_config(cls, *args, **kwargs):
        """
        diffusers' `load_config`, reading our module file's `[module, class]` name as the plain class name, and each
        component whose folder holds our module file (see `remote_code.py`) as the package class: the package's own
        classes load the folder, never through diffusers' remote-code import (which several processes loading at once
        would race on). Any other module file is left to diffusers' rule.
        """
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        folder = Path(source) if isinstance(source, str | os.PathLike) else None
        folder = folder.parent if folder is not None and folder.name == "model_index.json" else folder
        if folder is None or not folder.is_dir():
            return loaded
        name = config.get("_class_name")
        if isinstance(name, list | tuple) and name[0] == MODULE_NAME and is_package_module(folder):
            config["_class_name"] = name[-1]
        for component, (module, class_name) in package_components(config).items():
            if is_package_component(folder, component, module, class_name):
                try:
                    target = getattr(importlib.import_module(module), class_name, None)
                except ImportError:
                    continue
                if target is not None and getattr(components, class_name, None) is target:
                    config[component] = [components.__name__, class_name]  # no module file of that name
        return loaded
