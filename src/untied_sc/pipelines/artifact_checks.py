"""Checks of a saved pipeline folder before diffusers loads it, so that a damaged artifact fails with its name.

diffusers reports a missing component as "no file named config.json found in directory <pipeline dir>", a truncated
weights file as "Unable to load weights", a statistics file that lacks a tensor by a training hint and then runs on
zeros, and loads a scheduler config with out-of-range values as it is. Each check here names the file, the field
and the fix.
"""

import json
import struct
from pathlib import Path

from ..schedulers.sampler_statistics import SamplerStatistics
from .remote_code import saved_class_name


CONFIG_FILES = {"scheduler": ("scheduler_config.json",), "tokenizer": ("tokenizer_config.json", "tokenizer.json")}
MODEL_CONFIG_FILES = ("config.json",)
PIPELINE_FAMILIES = {"ELFPipeline": "elf", "LangFlowPipeline": "langflow"}
FAMILY_PIPELINES = {family: name for name, family in PIPELINE_FAMILIES.items()}


def safetensors_tensor_names(path: Path) -> list[str]:
    """
    The tensor names in a safetensors file, after checking that it is whole: a readable header, and at least as many
    bytes as the header's offsets reach. Raises a ValueError whose first line names the file and says what is wrong.
    """
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            if header_size > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(handle.read(header_size))
        ends = [int(entry["data_offsets"][1]) for name, entry in header.items() if name != "__metadata__"]
    except (struct.error, ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is corrupt: it is not a readable safetensors file ({error}).\nReplace it with an intact copy "
            "(re-download the pipeline, or re-save it with `pipe.save_pretrained`)."
        ) from None
    expected = 8 + header_size + max(ends, default=0)
    if size < expected:
        raise ValueError(
            f"{path} is truncated: its header describes {expected:,} bytes, the file has {size:,}.\nReplace it with "
            "an intact copy (re-download the pipeline, or re-save it with `pipe.save_pretrained`)."
        )
    return [name for name in header if name != "__metadata__"]


def check_statistics_folder(folder: Path) -> None:
    """The sampler statistics file holds every tensor its config promises (each calibrated NFE's moments)."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return  # a .bin file: diffusers reports it
    present = {name for path in weights for name in safetensors_tensor_names(path)}
    missing = [name for name in SamplerStatistics.tensor_names(config) if name not in present]
    if missing:
        steps = sorted(config.get("calibrated_steps") or [])
        raise ValueError(
            f"The sampler statistics in {folder} lack tensors {missing} that {config_path.name} promises "
            f"(calibrated_steps {steps}). The folder is incomplete: recalibrate with `untied-sc calibrate "
            f"PIPELINE_DIR --nfe {' '.join(map(str, steps or [8]))} --overwrite`, or remove the NFEs without "
            "tensors from calibrated_steps."
        )


def check_scheduler_config(path: Path) -> None:
    """A scheduler config of this package has every numeric setting in range (see `_config_ranges`)."""
    from .. import schedulers
    from ..schedulers.config_checks import check_config_ranges

    config = json.loads(path.read_text())
    cls = getattr(schedulers, str(config.get("_class_name")), None)
    ranges = getattr(cls, "_config_ranges", None)
    if ranges:
        check_config_ranges(cls.__name__, config, ranges, where=str(path))


def check_pipeline_folder(folder: Path, pipeline_class: type, passed: set[str] = frozenset()) -> None:
    """
    Checks a local pipeline folder before loading: `model_index.json` names a pipeline of `pipeline_class`'s family,
    every component it lists (except those `passed` as arguments) has its folder and config, every safetensors file
    is whole, the scheduler config is in range and the sampler statistics hold every tensor their config lists.
    """
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        raise ValueError(
            f"{folder} has no model_index.json, so it is not a saved pipeline. Pass the folder that "
            "`pipe.save_pretrained` wrote (or convert an official checkpoint with `untied-sc convert`)."
        )
    index = json.loads(index_path.read_text())
    saved_class = saved_class_name(index)
    family = getattr(pipeline_class, "family", None)
    saved_family = PIPELINE_FAMILIES.get(saved_class)
    if family is not None and saved_family is not None and saved_family != family:
        raise ValueError(
            f"{folder} holds a {saved_class} ({saved_family!r} model), not a {pipeline_class.__name__}. Load it with "
            f"`{saved_class}.from_pretrained(...)` (or `untied_sc.pipelines.load_pipeline`, which picks the class)."
        )
    for name, value in index.items():
        if name.startswith("_") or name in passed or not isinstance(value, list) or None in value:
            continue
        component = folder / name
        if not component.is_dir():
            raise ValueError(
                f"The pipeline's {name!r} component is missing: {component} does not exist (model_index.json lists "
                f"it as {value}). Restore the folder from the original pipeline, or pass the component: "
                f"`from_pretrained(..., {name}=...)`."
            )
        configs = CONFIG_FILES.get(name, MODEL_CONFIG_FILES)
        if not any((component / config).is_file() for config in configs):
            raise ValueError(
                f"The pipeline's {name!r} component is incomplete: {component} has no {' or '.join(configs)}. "
                "Restore the folder from the original pipeline."
            )
        for weights in sorted(component.glob("*.safetensors")):
            safetensors_tensor_names(weights)
        if name == "scheduler":
            check_scheduler_config(component / "scheduler_config.json")
        if value[-1] == "SamplerStatistics":
            check_statistics_folder(component)
