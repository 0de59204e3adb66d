"""The model families untied-sc samples (ELF, LangFlow, the self-conditioned flow maps): one record each, in one
registry.

A [`Family`] names everything that differs between families: the network, the official and the untied scheduler,
the pipeline, the converter of an official checkpoint, the model-index entries, the paper presets and the sampling
defaults (the diversity knob, the official curve's and the frontier's values, the bootstrap's resampling unit). Code
that depends on the family reads it here ([`get_family`], [`family_of`]) instead of keeping a table of its own.

This module imports nothing of the package: the classes are named as `(module, class)` references ([`ClassRef`])
and imported on first use, so that every floor (the schedulers, the models, the argument parsers that must not
import torch) can read the registry without importing what builds on it.

Adding a family is one [`register`] call at the end of this module, with:
- its network (a `ModelMixin` whose class attribute `family` is the family's name), official scheduler and untied
  scheduler (a subclass of `UntiedSelfConditioningMixin`), each with `family` set likewise, and its pipeline;
- `converter`, the function that loads an official checkpoint as the network, and `config_from_weights`, the config
  fields its weights fix (`models/weights_config.py`);
- the `untied-sc convert` options its converter takes (`convert_options`, `convert_required`, `convert_defaults`; a
  new option is one entry of `cli.py`'s `CONVERT_OPTIONS` and one argument of the `convert` parser);
- its paper presets in `data/coefficients.json` named `<family>-...`, and `default_preset` among them;
- its sampling defaults (the fields below without a default), and the comparison samplers' classes of each method in
  `sampling_methods.py` (a method without one for the family is refused for it).

The fields that describe the untied sampler of Algorithm 1 and the lab's measurements of it (`default_preset`,
`diversity_knob`, `curve_values`, `frontier_values`, `resampling_unit`, `protocol`) are `None`
for a family that has none of them (the flow maps: no paper preset, no GenPPL protocol of the lab); the code that needs one asks [`Family.require`], which refuses such a family naming the field and the use.
The families the untied sampler of Algorithm 1 serves are [`untied_families`].

What differs in behaviour rather than in a value is written in the family's classes, except in these functions,
which still branch on the family name and need a branch of the new family's: the self-conditioning geometry
(`schedulers/sampler_statistics.py` `input_projection_weights`, `calibration/overlap.py` `overlap_basis_from_model`),
the calibration's ELF-only steps (`calibration/calibrate.py`), the diagnostics' forward corruption and time
coordinate (`diagnostics/family.py`, `diagnostics/step_scaling.py`) and the reference recurrence's classes
(`calibration/reference.py`). The families the lab trains are the lab's own table, keyed by family name (its
`training/cli.py`); a family that is not there has no `untied-sc train`. The GenPPL protocols
(`evaluation/metrics.py`) are the official evaluations, not families: a new family names the one it is scored with
(`protocol`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class ClassRef:
    """A class (or function) named by its module and name, imported on first [`load`]."""

    module: str
    name: str

    def load(self):
        return getattr(importlib.import_module(self.module), self.name)

    def index_entry(self) -> list[str]:
        """The `[module, class]` pair of `model_index.json`, as `save_pretrained` writes it."""
        return [self.module, self.name]


@dataclass(frozen=True)
class Family:
    """
    One model family.

    Args:
        name (`str`): the family's name (`"elf"`), the `family` attribute of its classes.
        display_name (`str`): its name in messages (`"ELF"`).
        network, official_scheduler, untied_scheduler, pipeline (`ClassRef`): its classes.
        converter (`ClassRef`): the function that loads an official checkpoint (a path or Hub id) as the network.
        config_from_weights (`ClassRef`): `f(state_dict, source) -> dict`, the config fields the weights fix.
        block_prefix (`str`): the prefix of the transformer blocks' weights (`"blocks."`), to count them.
        latent_width_key (`str`): the network config field that is D, the width of the latent the sampler moves.
        updates_on_last_step (`bool`): whether the final evaluation updates the state (ELF: its last step is the ODE
            step), so that K_u = N; otherwise K_u = N − 1.
        default_preset (`str`, *optional*): the paper preset `untied-sc calibrate` uses when none is named; `None`
            for a family without paper presets (not sampled by Algorithm 1's untied scheduler).
        diversity_knob (`str`, *optional*): the pipeline-call argument that moves the family's entropy.
        curve_values (`tuple[float, ...]`, *optional*): the official curve's knob values on the tuning bank (the
            default first).
        frontier_values (`tuple[float, ...]`, *optional*): the `baselines` experiment's default sweep of the
            diversity knob.
        resampling_unit, resampling_why (`str`, *optional*): the unit the bootstrap resamples (`"batch"` or
            `"sample"`) and why.
        protocol (`str`, *optional*): the GenPPL protocol its samples are scored with by default
            (`evaluation/metrics.py`: the official evaluation of ELF or of LangFlow).
        tokenizer (`ClassRef`): the tokenizer class saved in `model_index.json`.
        convert_options (`tuple[str, ...]`): the `untied-sc convert` options (argument names) this family takes
            beyond SOURCE, OUTPUT, --tokenizer, --revision and --overwrite; any other given is refused.
        convert_required (`tuple[str, ...]`): those of `convert_options` the family cannot convert without.
        convert_defaults (`tuple[tuple[str, object], ...]`): `(option, value)` for the options left out whose default
            is the family's own (ELF's weight set `ema_params1`, the flow maps' `ema`).
        variants (`tuple[str, ...]`): the released models a checkpoint of the family may hold where its weights do not
            say which (`untied-sc convert --variant`); empty where they do.
        missing_why (`str`): why the optional fields left `None` are missing, for [`require`]'s message.
    """

    name: str
    display_name: str
    network: ClassRef
    official_scheduler: ClassRef
    untied_scheduler: ClassRef
    pipeline: ClassRef
    converter: ClassRef
    config_from_weights: ClassRef
    block_prefix: str
    latent_width_key: str
    updates_on_last_step: bool
    default_preset: str | None
    diversity_knob: str | None
    curve_values: tuple[float, ...] | None
    frontier_values: tuple[float, ...] | None
    resampling_unit: str | None
    resampling_why: str | None
    protocol: str | None
    tokenizer: ClassRef = ClassRef("transformers", "PreTrainedTokenizerFast")
    convert_options: tuple[str, ...] = ()
    convert_required: tuple[str, ...] = ()
    convert_defaults: tuple[tuple[str, object], ...] = ()
    variants: tuple[str, ...] = ()
    missing_why: str = ""

    def require(self, field: str, use: str):
        """The value of `field`; a `ValueError` naming the family, the field and `use` where the family has none."""
        value = getattr(self, field)
        if value is None:
            served = ", ".join(get_family(name).display_name for name in untied_families())
            raise ValueError(
                f"{use}: not available for the {self.display_name} family ({self.pipeline.name}), which has no "
                f"{field} ({self.missing_why}); it serves the {served} pipelines."
            )
        return value

    def num_update_steps(self, num_inference_steps: int) -> int:
        """K_u, the evaluations that update the state in a run of `num_inference_steps`."""
        return num_inference_steps if self.updates_on_last_step else num_inference_steps - 1

    def official_checkpoints(self) -> list:
        """The released checkpoints of this family (`models/official_checkpoints.py`)."""
        checkpoints = ClassRef("untied_sc.models.official_checkpoints", "OFFICIAL_CHECKPOINTS").load()
        return [checkpoint for checkpoint in checkpoints if checkpoint.family == self.name]

    def presets(self) -> list[str]:
        """The paper presets measured on this family (`data/coefficients.json`)."""
        return ClassRef("untied_sc.schedulers.coefficients", "family_presets").load()(self.name)


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Adds `family` to the registry (a name registered twice is refused)."""
    if family.name in _FAMILIES:
        raise ValueError(f"A model family {family.name!r} is registered already.")
    _FAMILIES[family.name] = family
    return family


def family_names() -> tuple[str, ...]:
    """The registered families' names, in registration order."""
    return tuple(_FAMILIES)


def families() -> tuple[Family, ...]:
    return tuple(_FAMILIES.values())


def untied_families() -> tuple[str, ...]:
    """The families Algorithm 1's untied scheduler, its calibration and the lab's experiments serve: those with
    paper presets (`default_preset`)."""
    return tuple(name for name, family in _FAMILIES.items() if family.default_preset is not None)


def get_family(name: str) -> Family:
    """The family named `name`; an unknown name raises a `ValueError` listing the known ones."""
    if name not in _FAMILIES:
        raise ValueError(f"Unknown model family {name!r}; the families are {', '.join(_FAMILIES)}.")
    return _FAMILIES[name]


def family_of(component) -> Family:
    """The family of a pipeline, network or scheduler (its `family` attribute); a `ValueError` for anything else."""
    name = getattr(component, "family", None)
    if name not in _FAMILIES:
        raise ValueError(
            f"Expected a component of one of the model families ({', '.join(_FAMILIES)}), got {type(component).__name__}."
        )
    return _FAMILIES[name]


def default_protocol(name: str) -> str:
    """The GenPPL protocol of family `name`'s samples (an unknown name raises, listing the families; a family
    without one, naming it)."""
    return get_family(name).require("protocol", "Scoring samples with a default GenPPL protocol")


def family_of_pipeline_class(class_name: str | None) -> Family | None:
    """The family whose pipeline class is named `class_name` (`None` where none is)."""
    return next((family for family in _FAMILIES.values() if family.pipeline.name == class_name), None)


register(
    Family(
        name="elf",
        display_name="ELF",
        network=ClassRef("untied_sc.models.elf_transformer", "ELFTransformerModel"),
        official_scheduler=ClassRef("untied_sc.schedulers.scheduling_elf", "ELFScheduler"),
        untied_scheduler=ClassRef("untied_sc.schedulers.scheduling_untied_elf", "UntiedELFScheduler"),
        pipeline=ClassRef("untied_sc.pipelines.pipeline_elf", "ELFPipeline"),
        converter=ClassRef("untied_sc.models.convert", "load_official_elf"),
        config_from_weights=ClassRef("untied_sc.models.weights_config", "elf_config_from_weights"),
        block_prefix="blocks.",
        latent_width_key="latent_dim",
        updates_on_last_step=True,
        default_preset="elf-b",
        # The decode's softmax temperature (the SC-CFG scale w, tried first, barely moved the bundled ELF, which
        # hardly uses self-conditioning); it only raises entropy from the argmax.
        diversity_knob="decode_temperature",
        curve_values=(0.0, 0.25, 0.5, 0.75, 1.0),
        frontier_values=(0.25, 0.5),
        resampling_unit="batch",
        resampling_why="ELF draws one time grid per batch, shared by the batch's samples",
        protocol="elf",
        convert_options=(
            *("official_id", "max_length", "sde_gamma", "sc_cfg_scale", "weights", "allow_pickle"),
            *("text_encoder", "guidance_scale", "max_source_length"),
        ),
        convert_defaults=(("weights", "ema_params1"),),
    )
)
register(
    Family(
        name="langflow",
        display_name="LangFlow",
        network=ClassRef("untied_sc.models.langflow_transformer", "LangFlowTransformerModel"),
        official_scheduler=ClassRef("untied_sc.schedulers.scheduling_langflow", "LangFlowScheduler"),
        untied_scheduler=ClassRef("untied_sc.schedulers.scheduling_untied_langflow", "UntiedLangFlowScheduler"),
        pipeline=ClassRef("untied_sc.pipelines.pipeline_langflow", "LangFlowPipeline"),
        converter=ClassRef("untied_sc.models.convert", "load_official_langflow"),
        config_from_weights=ClassRef("untied_sc.models.weights_config", "langflow_config_from_state_dict"),
        block_prefix="backbone.blocks.",
        latent_width_key="hidden_size",
        updates_on_last_step=False,
        default_preset="langflow-lm1b",
        # x̂'s softmax temperature: it moves entropy both ways.
        diversity_knob="temperature",
        curve_values=(1.0, 0.8, 0.9, 1.1, 1.2),
        frontier_values=(0.9, 1.1),
        resampling_unit="sample",
        resampling_why="LangFlow's time grid is fixed; samples share no random draw",
        protocol="langflow",
        # A LangFlow checkpoint records its sequence length, and the official LangFlow sampler has no setting here.
        convert_options=("official_id",),
    )
)
register(
    Family(
        name="flowmap",
        display_name="flow-map (FMLM*, ELF*)",
        network=ClassRef("untied_sc.models.flowmap_transformer", "FlowMapTransformerModel"),
        official_scheduler=ClassRef("untied_sc.schedulers.scheduling_flowmap", "FlowMapLMScheduler"),
        untied_scheduler=ClassRef("untied_sc.schedulers.scheduling_flowmap", "UntiedFlowMapLMScheduler"),
        pipeline=ClassRef("untied_sc.pipelines.pipeline_flowmap", "FlowMapPipeline"),
        converter=ClassRef("untied_sc.models.flowmap_transformer", "load_official_flowmap"),
        config_from_weights=ClassRef("untied_sc.models.weights_config", "flowmap_config_from_weights"),
        block_prefix="blocks.",
        latent_width_key="latent_dim",
        # Every flow-map step moves the state, the last one too (z_N = x̂_{N−1}, `sampling_utils.py` flow_map_step).
        updates_on_last_step=True,
        default_preset=None,
        diversity_knob=None,
        curve_values=None,
        frontier_values=None,
        resampling_unit=None,
        resampling_why=None,
        protocol=None,
        tokenizer=ClassRef("transformers", "GPT2TokenizerFast"),
        convert_options=("variant", "max_length", "self_conditioning", "weights", "allow_pickle"),
        convert_required=("variant",),  # the weights of FMLM* and ELF* have the same shapes
        convert_defaults=(("weights", "ema"),),  # the official evaluation's (`eval_lightning.py` lines 146-152)
        # FMLM* (stage 3), ELF* (stage 2) and the ELF teacher (stage 1): README "Checkpoints".
        variants=("fmlm-star", "elf-star", "elf"),
        missing_why="its untied transform is calibrated by `untied_sc.calibration.flowmap`, without paper presets; "
        "no GenPPL protocol of the lab covers it",
    )
)
