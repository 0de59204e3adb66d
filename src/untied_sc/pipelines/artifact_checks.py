"""Checks of a saved pipeline folder before diffusers loads it, so that a damaged artifact fails with its name.

diffusers reports a missing component as "no file named config.json found in directory <pipeline dir>", a truncated
weights file as "Unable to load weights", a statistics file that lacks a tensor by a training hint and then runs on
zeros, and loads a scheduler config with out-of-range values as it is. Each check here names the file, the field
and the fix.
"""

import inspect
import json
import struct
from pathlib import Path

from .. import schedulers
from ..families import family_names, family_of_pipeline_class, get_family
from ..schedulers.coefficients import check_coefficients, coefficients_table
from ..schedulers.config_checks import check_config_ranges
from ..schedulers.contract import init_keys
from ..schedulers.flowmap_statistics import FlowMapStatistics
from ..schedulers.sampler_statistics import SamplerStatistics
from .remote_code import saved_class_name


# Written by `untied-sc convert` beside the model card: the official source and the length the weights do not fix.
CONVERSION_RECORD = "converted_from.json"
CONFIG_FILES = {"scheduler": ("scheduler_config.json",), "tokenizer": ("tokenizer_config.json", "tokenizer.json")}
MODEL_CONFIG_FILES = ("config.json",)


def safetensors_tensor_names(path: Path) -> list[str]:
    """
    The tensor names in a safetensors file, after checking that it is whole: a readable header, and at least as many
    bytes as the header's offsets reach. Raises a ValueError whose first line names the file and says what is wrong.
    """
    return list(safetensors_tensor_shapes(path))


def safetensors_tensor_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor in a safetensors file, checked whole as [`safetensors_tensor_names`] says."""
    size = path.stat().st_size
    try:
        with path.open("rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            if header_size > size - 8:
                raise ValueError("header longer than the file")
            header = json.loads(handle.read(header_size))
        entries = {name: entry for name, entry in header.items() if name != "__metadata__"}
        ends = [int(entry["data_offsets"][1]) for entry in entries.values()]
        shapes = {name: tuple(int(dim) for dim in entry["shape"]) for name, entry in entries.items()}
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
    return shapes


# The statistics components a folder may hold, by class name: their class knows their layout.
STATISTICS_CLASSES = {cls.__name__: cls for cls in (SamplerStatistics, FlowMapStatistics)}


def check_statistics_folder(folder: Path, cls: type = SamplerStatistics) -> None:
    """A statistics component's file (`cls`: [`SamplerStatistics`] or [`FlowMapStatistics`]) holds every tensor its
    config promises (each calibrated NFE's), in the shapes the config gives."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    cls.check_config(config, str(config_path))
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        return  # a .bin file: diffusers reports it
    present = {name: shape for path in weights for name, shape in safetensors_tensor_shapes(path).items()}
    expected = cls.tensor_shapes(config)
    missing = [name for name in expected if name not in present]
    steps = sorted(config.get("calibrated_steps") or [])
    if missing:
        if cls is SamplerStatistics:
            fix = f"`untied-sc calibrate PIPELINE_DIR --nfe {' '.join(map(str, steps or [8]))} --overwrite`"
        else:
            fix = cls.recalibrate_hint
        raise ValueError(
            f"The {cls.statistics_name} in {folder} lack tensors {missing} that {config_path.name} promises "
            f"(calibrated_steps {steps}). The folder is incomplete: recalibrate with {fix}, or remove the NFEs "
            "without tensors from calibrated_steps."
        )
    wrong = [
        f"{name} {present[name]} (expected {shape})" for name, shape in expected.items() if present[name] != shape
    ]
    if wrong:
        solver = f"solver {config.get('solver')!r}, " if "solver" in config else ""
        raise ValueError(
            f"The {cls.statistics_name} in {folder} do not fit {config_path.name} ({solver}latent_dim "
            f"{config.get('latent_dim')}, rank {config.get('rank')}): tensor shapes {'; '.join(wrong)}. The tensor "
            "file and the config come from different calibrations (or the file was edited): recalibrate with "
            f"{cls.recalibrate_hint} into a fresh copy of the pipeline."
        )


# The records of a folder's sequence length: what it was trained at (`untied-sc train ... export`) or converted
# at (`untied-sc convert`), as (file, how to read the length, what the length was).
LENGTH_RECORDS = (
    ("training_info.json", lambda record: (record.get("config") or {}).get("seq_len"), "trained at seq_len"),
    (CONVERSION_RECORD, lambda record: record.get("max_length"), "converted at max_length"),
)


def check_recorded_length(folder: Path) -> None:
    """
    The transformer's `max_length` is the length its training or conversion record names (`training_info.json`,
    `converted_from.json`): no weight of either network fixes it (ELF builds its RoPE tables from it, LangFlow's
    rotary tables have no length), so a changed value would sample at another length without an error.
    """
    config_path = folder / "transformer" / "config.json"
    for name, read, what in LENGTH_RECORDS:
        record_path = folder / name
        if not record_path.is_file() or not config_path.is_file():
            continue
        try:
            recorded = read(json.loads(record_path.read_text()))
            given = json.loads(config_path.read_text()).get("max_length")
        except (OSError, ValueError, AttributeError):
            continue  # an unreadable record says nothing; diffusers reports an unreadable config
        if isinstance(recorded, int) and isinstance(given, int) and recorded != given:
            raise ValueError(
                f"{config_path}: max_length = {given}, but {record_path} records that the model was {what} "
                f"{recorded}. The weights do not fix the length, so the network would sample {given}-token "
                f'sequences without an error, at a length it never saw. Fix: set "max_length": {recorded} in '
                f"{config_path} (or restore the config.json saved with these weights)."
            )


def read_json(path: Path):
    """`path` parsed as JSON; a file cut short or edited into invalid JSON is an error naming it and where it breaks."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{path} is not valid JSON ({error.msg} at line {error.lineno}, column {error.colno}): it was cut short "
            "or edited by hand. Restore it from the original pipeline (or download the folder again)."
        ) from None
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{path} is not UTF-8 text ({error.reason}): restore it from the original pipeline."
        ) from None


def check_scheduler_config(path: Path) -> None:
    """A scheduler config of this package has every numeric setting in range (see `_config_ranges`) and, for an
    untied scheduler, every stored per-NFE coefficient entry checked."""
    config = read_json(path)
    cls = getattr(schedulers, str(config.get("_class_name")), None)
    if "sc_cfg_scale" in config and (cls is None or "sc_cfg_scale" not in init_keys(cls)):
        raise ValueError(
            f"{path} holds `sc_cfg_scale: {config['sc_cfg_scale']}`, which this untied-sc reads from the pipeline, not "
            'the scheduler. Move it to the folder\'s model_index.json (`"sc_cfg_scale": '
            f"{config['sc_cfg_scale']}`) and delete it from {path.name}, or re-export the pipeline (`untied-sc "
            "convert` of the checkpoint)."
        )
    ranges = getattr(cls, "_config_ranges", None)
    if ranges:
        check_config_ranges(cls.__name__, config, ranges, where=str(path))
    if cls is not None and issubclass(cls, schedulers.UntiedSelfConditioningMixin):
        check_coefficients(config, where=f" in {path}")
    try:  # an official scheduler's config keeps them too, for the untied scheduler made from it
        coefficients_table(config.get("coefficients_by_steps"))
    except ValueError as error:
        raise ValueError(f"{path}: {error} Fix the entry (or run `untied-sc tune` again).") from None


# The `model_index.json` entry of each component the families share, as `save_pretrained` writes it.
COMPONENT_ENTRIES = {
    "sampler_statistics": ["untied_sc.schedulers.sampler_statistics", "SamplerStatistics"],
    "ace_statistics": ["untied_sc.calibration.ace", "ACEStatistics"],
    "flowmap_statistics": ["untied_sc.schedulers.flowmap_statistics", "FlowMapStatistics"],
}


def _index_entry(name: str, family: str | None) -> str:
    """The `"name": [module, class]` line to add to `model_index.json` for component `name`."""
    record = get_family(family or family_names()[0])
    family_entries = {
        "transformer": record.network,
        "scheduler": record.official_scheduler,
        "tokenizer": record.tokenizer,
    }
    entry = family_entries[name].index_entry() if name in family_entries else COMPONENT_ENTRIES.get(name)
    return f'"{name}": {json.dumps(entry)}' if entry else f'"{name}": [MODULE, CLASS]'


def check_index_lists_components(folder: Path, index: dict, pipeline_class: type, passed: set[str]) -> None:
    """
    `model_index.json` lists every component the pipeline requires (unless passed as an argument), and every
    statistics component the folder holds: one left out would be ignored, and the untied sampler would then ask for a
    calibration the folder already has.
    """
    index_path = folder / "model_index.json"
    saved = family_of_pipeline_class(saved_class_name(index))
    family = saved.name if saved is not None else getattr(pipeline_class, "family", None)
    parameters = inspect.signature(pipeline_class.__init__).parameters.values()
    required = [p.name for p in parameters if p.name != "self" and p.default is inspect.Parameter.empty]
    optional = getattr(pipeline_class, "_optional_components", [])
    for name in [*required, *optional]:
        if name in index or name in passed:
            continue
        on_disk = (folder / name).is_dir()
        if name in optional and not on_disk:
            continue  # an optional component that was never saved
        held = f"the folder has {folder / name}, but " if on_disk else ""
        effect = "it would be ignored" if name in optional else f"{pipeline_class.__name__} cannot be built without it"
        remedy = (
            f"add {_index_entry(name, family)} to {index_path}"
            if on_disk
            else f"restore {folder / name} from the original pipeline and list it in {index_path}"
        )
        raise ValueError(
            f"{index_path} does not list the {name!r} component ({held}{effect}). Fix: {remedy}, or pass it: "
            f"`from_pretrained(..., {name}=...)`."
        )


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
    index = read_json(index_path)
    saved_class = saved_class_name(index)
    family = getattr(pipeline_class, "family", None)
    saved_family = getattr(family_of_pipeline_class(saved_class), "name", None)
    if family is not None and saved_family is not None and saved_family != family:
        raise ValueError(
            f"{folder} holds a {saved_class} ({saved_family!r} model), not a {pipeline_class.__name__}. Load it with "
            f"`{saved_class}.from_pretrained(...)` (or `untied_sc.pipelines.load_pipeline`, which picks the class)."
        )
    check_index_lists_components(folder, index, pipeline_class, passed)
    if "transformer" not in passed:
        check_recorded_length(folder)
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
        for config in sorted(component.glob("*.json")):  # every config whole before diffusers parses it
            read_json(config)
        for weights in sorted(component.glob("*.safetensors")):
            safetensors_tensor_names(weights)
        if name == "scheduler":
            check_scheduler_config(component / "scheduler_config.json")
        if value[-1] in STATISTICS_CLASSES:
            check_statistics_folder(component, STATISTICS_CLASSES[value[-1]])
