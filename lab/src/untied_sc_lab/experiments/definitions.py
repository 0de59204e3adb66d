"""The sampler sets a benchmark compares: official vs untied (`main`) and the paper's controlled experiments.

A sampler set maps a name to a spec ([`run_sweep`]'s `samplers`, each a [`SamplerSpec`] read from the JSON objects
below): `{}` is the sampler at its defaults, other keys override the untied scheduler's config (`eta_t: 0.0`), route its correction (`correction_routing`), scale one resolved
coefficient (`eta_t_scale: 0.5`) or go to the pipeline call (`temperature`). The sampler named `official` is the
baseline of every paired comparison. The experiments (`--experiment`):

- `placement` (Table "placement" (a)): where the correction goes: off, into the solver, into the next
  self-conditioning input, or both;
- `components` (Table "placement" (b)): which components are on: the SC transform alone, the correction alone, both;
- `sensitivity` (Appendix "parameter sensitivity"): one coefficient at a time at ×½..×2 of its resolved value;
- `directions` (Table "Controls for the solver correction"): the full untied sampler with the history direction and
  with each control of it (`correction_direction`): the batch's common component, another sample's direction, a random
  direction with equal RMS;
- `baselines` (Table "matched sampler comparison"): official, untied and the comparison samplers (Momentum,
  ACE, HiGS, HiGS + ACE, DPM-Solver++(2M); docs/algorithm.md §9), each a spec naming its scheduler (`"scheduler":
  "momentum"`, ...). Their knobs are tuned per NFE on the tuning bank before sampling (`experiments/baselines.py`, the
  one rule of `calibration/search.py`) and carried in the spec's `knobs_by_steps`. Every sampler is also swept over
  the diversity knob (the family's `frontier_values` unless `--temperatures` says otherwise), so that each is read on its own
  frontier at official's entropy.
"""

from collections.abc import Mapping, Sequence
from pathlib import Path

from untied_sc.defaults import COEFFICIENT_NAMES, EXPERIMENTS  # (EXPERIMENTS re-exported here)
from untied_sc.generation import SamplerSpec
from untied_sc.sampling_methods import get_method


BASELINE = "official"
DEFAULT_SAMPLERS = {"official": SamplerSpec(), "untied": SamplerSpec()}
SENSITIVITY_FACTORS = (0.5, 0.75, 1.5, 2.0)
# The `baselines` experiment's comparison methods, in its reports' order, and their report names (the `label` of
# each method, a `scheduler` of `build_scheduler`).
BASELINE_ORDER = ("momentum", "ace", "higs", "higs_ace", "multistep")
BASELINE_METHODS = {get_method(name).label: name for name in BASELINE_ORDER}


def experiment_samplers(name: str) -> dict[str, SamplerSpec]:
    """Sampler specs of an experiment: `main`, `placement`, `components`, `sensitivity`, `directions` or `baselines`
    (official always first; the comparison samplers of `baselines` at their defaults until their knobs are tuned)."""
    return {
        label: SamplerSpec.from_json(spec, f"samplers[{label!r}]") for label, spec in _experiment_json(name).items()
    }


def _experiment_json(name: str) -> dict[str, dict]:
    """The JSON objects of [`experiment_samplers`]."""
    if name == "main":
        return {label: {} for label in DEFAULT_SAMPLERS}
    if name == "placement":
        return {
            BASELINE: {},
            "untied (correction off)": {"eta_t": 0.0},
            "untied (correction to solver)": {"correction_routing": "solver"},
            "untied (correction to next SC)": {"correction_routing": "self_conditioning"},
            "untied (correction to both)": {"correction_routing": "both"},
        }
    if name == "components":
        return {
            BASELINE: {},
            "untied (SC transform only)": {"eta_t": 0.0},
            "untied (correction only)": {"eta_r": 0.0},
            "untied (both)": {},
        }
    if name == "sensitivity":
        samplers = {BASELINE: {}, "untied": {}}
        for coefficient in COEFFICIENT_NAMES:
            for factor in SENSITIVITY_FACTORS:
                samplers[f"untied ({coefficient} x{factor:g})"] = {f"{coefficient}_scale": factor}
        return samplers
    if name == "directions":
        return {
            BASELINE: {},
            "untied (history)": {"correction_direction": "history"},
            "untied (common)": {"correction_direction": "common"},
            "untied (permuted)": {"correction_direction": "permuted"},
            "untied (random)": {"correction_direction": "random"},
        }
    if name == "baselines":
        return {
            **{label: {} for label in DEFAULT_SAMPLERS},
            **{label: {"scheduler": method} for label, method in BASELINE_METHODS.items()},
        }
    raise ValueError(f"Unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}.")


def select_samplers(name: str, names: Sequence[str] | None = None) -> dict[str, SamplerSpec]:
    """The experiment's sampler specs ([`experiment_samplers`]), only `names` of them (and official, the pairs' first
    side, always) in the experiment's order; all of them when `names` is `None`. An unknown name raises a `ValueError`
    that lists the experiment's samplers."""
    samplers = experiment_samplers(name)
    if names is None:
        return samplers
    unknown = [n for n in names if n not in samplers]
    if unknown:
        raise ValueError(
            f"{', '.join(map(repr, unknown))} {'is' if len(unknown) == 1 else 'are'} not among the {name} "
            f"experiment's samplers: {', '.join(map(repr, samplers))}."
        )
    return {key: spec for key, spec in samplers.items() if key == BASELINE or key in names}


def with_preset(samplers: Mapping[str, SamplerSpec], preset: str | None) -> dict[str, SamplerSpec]:
    """The sampler set with every untied sampler on the paper coefficient `preset` where it names none (unchanged
    when `None`); the official and comparison samplers have no coefficients."""
    if preset is None:
        return dict(samplers)
    return {
        name: spec.with_default_overrides({"coefficients": preset}) if is_untied(name, spec) else spec
        for name, spec in samplers.items()
    }


def is_untied(name: str, spec: SamplerSpec) -> bool:
    """Whether a sampler spec runs the untied scheduler (its `scheduler`, else every sampler but `official`)."""
    return spec.scheduler_for(name) == "untied"


def normalise_samplers(samplers: Mapping[str, SamplerSpec | Mapping]) -> dict[str, SamplerSpec]:
    """Each spec as a [`SamplerSpec`] (a JSON object read with [`SamplerSpec.from_json`]) with its `scheduler`
    stated: `"official"` for the sampler named official, else `"untied"`."""
    if BASELINE not in samplers:
        raise ValueError(
            f"`samplers` must include the baseline {BASELINE!r} (the pairs' first side), got {list(samplers)}."
        )
    read = {name: SamplerSpec.of(spec, f"samplers[{name!r}]") for name, spec in samplers.items()}
    return {name: spec.with_scheduler(spec.scheduler_for(name)) for name, spec in read.items()}


def experiment_name(pipeline: str, experiment: str, preset: str | None = None) -> str | None:
    """`<model>-<experiment>[-<preset>]` for the controlled experiments and presets, so that they do not overwrite the
    main results."""
    suffix = ("" if experiment == "main" else f"-{experiment}") + (f"-{preset}" if preset else "")
    return f"{Path(str(pipeline).rstrip('/')).name}{suffix}" if suffix else None
