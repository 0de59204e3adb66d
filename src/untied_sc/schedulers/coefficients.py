"""Where the coefficients η_R, η_T, η_O, α of an untied run come from (docs/algorithm.md §4.5).

For N steps, per coefficient, the first of these that has a value wins:

1. the explicit scalar in the scheduler config (`eta_r`, `eta_t`, `eta_o`, `alpha`);
2. the paper preset named by the config's `coefficients` (e.g. `"elf-b"`), if it lists N;
3. the config's `coefficients_by_steps` entry of N (what `untied-sc tune` or calibration wrote);
4. the named preset at an NFE it does not list: its entry at the nearest listed NFE (`preset_entry`);

and if none has, a `ValueError` names every option and the NFEs each one covers.

An entry of `coefficients_by_steps` may also hold the family's diversity knob (`temperature` for LangFlow,
`decode_temperature` for ELF, [`DIVERSITY_KEYS`]): the value `untied-sc tune` chose on its bank so that the untied
sampler runs at the official sampler's entropy at that NFE. The pipeline's call uses it when the call gives no value
of its own and the coefficients came from that entry ([`entropy_matched_setting`]); an entry with η_R = η_T = 0 (the
official sampler bit for bit) may not hold one.
"""

import json
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, NamedTuple

from ..families import family_names, get_family
from ..per_nfe import check_steps, read_steps_table, write_steps_table
from ..seeds import DEFAULT_RECORD_SPACE
from .config_checks import unusual_coefficient_message
from .sampler_statistics import COEFFICIENT_NAMES


class UntiedCoefficients(NamedTuple):
    """The coefficients of one untied run by name, as the scheduler holds them from `set_timesteps` to the step."""

    eta_r: float  # η_R, strength of the SC transform (λ_R = λ_R^(0)·η_R)
    eta_t: float  # η_T, strength of the solver correction (eq. (11))
    eta_o: float  # η_O, weight of the disagreement term in U_k (eq. (10))
    alpha: float  # α, E's averaging weight (eq. (6))

    @classmethod
    def of(cls, values: Mapping[str, float]) -> "UntiedCoefficients":
        """The coefficients of a mapping by name ([`resolve_coefficients`]' result, a preset's entry)."""
        return cls(**{name: float(values[name]) for name in cls._fields})


def paper_coefficients() -> dict[str, dict[int, dict[str, float]]]:
    """The paper's coefficient table (ELF-B/M/L, LangFlow OWT/LM1B), keyed by preset name and NFE."""
    text = resources.files("untied_sc").joinpath("data/coefficients.json").read_text()
    return {
        name: read_steps_table(table, f"data/coefficients.json[{name!r}]")
        for name, table in json.loads(text).items()
        if not name.startswith("_")
    }


def nearest_listed_steps(listed, num_steps: int) -> int:
    """
    The listed NFE nearest to `num_steps` in log2 (|log2 n − log2 N| smallest), ties going to the smaller NFE
    **[choice]**: with 8/16/32/64 listed, the boundaries are the geometric means 8√2 ≈ 11.3, 16√2 ≈ 22.6 and
    32√2 ≈ 45.3, so 5 → 8, 11 → 8, 12 → 16, 22 → 16, 24 → 32, 48 → 64, 1000 → 64 (ties cannot occur between powers
    of two; they would between e.g. 8 and 18, at 12).
    """
    steps = sorted(listed)
    if not steps:
        raise ValueError("No NFEs listed.")
    return min(steps, key=lambda n: (abs(math.log2(n) - math.log2(num_steps)), n))


def preset_entry(name: str, num_steps: int) -> tuple[int, dict[str, float]]:
    """
    A paper preset's coefficients for any NFE (docs/algorithm.md §4.5): its entry at `num_steps` if it lists it,
    else its entry at the nearest listed NFE in log2, ties to the smaller NFE ([`nearest_listed_steps`]). Returns
    (the NFE the entry is listed at, η_R, η_T, η_O, α as a new dict).
    """
    check_preset(name)
    check_steps(num_steps, "num_steps", minimum=1)
    table = paper_coefficients()[name]
    listed = num_steps if num_steps in table else nearest_listed_steps(table, num_steps)
    return listed, {key: float(value) for key, value in table[listed].items()}


def check_coefficients(values: Mapping[str, float | None], where: str = "") -> None:
    """η_R, η_T, η_O ≥ 0 and α ∈ (0, 1], for those that are set, each a real number; `where` says where they came
    from. A value far outside the usual range warns (`config_checks.USUAL_COEFFICIENT_RANGES`)."""
    for name in COEFFICIENT_NAMES:
        value = values.get(name)
        if value is not None and (isinstance(value, str | bytes | bool) or not hasattr(value, "__float__")):
            raise ValueError(
                f"The untied scheduler's {name}{where} must be a number, got {value!r} ({type(value).__name__}): pass "
                f"e.g. `{name}=1.0`, or leave it out to use the preset's value."
            )
    for name in COEFFICIENT_NAMES:
        if values.get(name) is not None and not math.isfinite(float(values[name])):
            raise ValueError(
                f"{name}{where} must be a finite number, got {values[name]!r}: a NaN or infinite coefficient runs "
                "and gives NaN latents. Give a finite value, or leave it out to use the tuned or preset one."
            )
    for name in ("eta_r", "eta_t", "eta_o"):
        if values.get(name) is not None and not values[name] >= 0:
            raise ValueError(f"{name}{where} must be ≥ 0, got {values[name]}.")
        if values.get(name) is not None and (message := unusual_coefficient_message(name, values[name], where)):
            warnings.warn(message, UserWarning, stacklevel=3)
    if values.get("alpha") is not None and not 0 < values["alpha"] <= 1:
        raise ValueError(f"alpha{where} must lie in (0, 1], got {values['alpha']}.")


def _display_name(family: str) -> str:
    return get_family(family).display_name if family in family_names() else family


def preset_family(name: str) -> str:
    """The model family a paper preset was measured on: its name's prefix (`elf-b` → `"elf"`)."""
    return name.split("-", 1)[0]


def family_presets(family: str) -> list[str]:
    """The paper presets of one model family."""
    return sorted(name for name in paper_coefficients() if preset_family(name) == family)


def check_preset(name: str | None, family: str | None = None, where: str = "") -> None:
    """
    `name` is a paper preset, and (with `family`) one of that family's: another family's coefficients were measured
    for another network and sampler, and would run without complaint but out of their setting.
    """
    if name is None:
        return
    if name not in paper_coefficients():
        raise ValueError(f"Unknown coefficient preset {name!r}; choose one of {sorted(paper_coefficients())}.")
    if family is not None and preset_family(name) != family:
        owner = _display_name(preset_family(name))
        raise ValueError(
            f"Coefficient preset {name!r}{where} is the paper's {owner} preset, but this is a "
            f"{_display_name(family)} sampler: another family's coefficients would run out of their "
            f"setting. Choose one of the {_display_name(family)} presets: "
            f"{', '.join(family_presets(family))} (or leave coefficients out to use the tuned or calibrated ones)."
        )


# The pipeline-call knob that moves each family's entropy, as an entry of `coefficients_by_steps` may store it, with
# its neutral value (the official sampler's) and the smallest value allowed.
DIVERSITY_KEYS = {"temperature": (1.0, 0.0, False), "decode_temperature": (0.0, 0.0, True)}


@dataclass(frozen=True)
class StepCoefficients:
    """
    One NFE's entry of `coefficients_by_steps`: η_R, η_T, η_O, α and at most one entropy-matching knob of
    [`DIVERSITY_KEYS`] (`knob` names it, `None` without one), as `untied-sc tune` or calibration wrote them.
    """

    eta_r: float
    eta_t: float
    eta_o: float
    alpha: float
    knob: str | None = None
    knob_value: float | None = None

    @classmethod
    def read(cls, steps: int, entry, where: str) -> "StepCoefficients":
        """The entry of a file or config (`where` names it for the errors), checked: exactly η_R, η_T, η_O, α and at
        most one knob, each a number in its range."""
        extra = set(entry) - set(COEFFICIENT_NAMES) if isinstance(entry, Mapping) else set()
        if (
            not isinstance(entry, Mapping)
            or not set(COEFFICIENT_NAMES) <= set(entry)
            or len(extra) > 1
            or (extra - set(DIVERSITY_KEYS))
        ):
            given = sorted(entry) if isinstance(entry, Mapping) else repr(entry)
            raise ValueError(
                f"{where} must give exactly {list(COEFFICIENT_NAMES)} and at most one of {list(DIVERSITY_KEYS)} "
                f"(the entropy-matching knob), got {given}."
            )
        for name in COEFFICIENT_NAMES:
            if isinstance(entry[name], bool) or not isinstance(entry[name], int | float):
                raise ValueError(f"{where}[{name!r}] must be a number, got {entry[name]!r}.")
        values = {name: float(entry[name]) for name in COEFFICIENT_NAMES}
        check_coefficients(values, where=f" at {steps} steps")
        knob = next(iter(extra), None)
        value = None if knob is None else _check_diversity(knob, entry[knob], values, where)
        return cls(**values, knob=knob, knob_value=value)

    @classmethod
    def stored(cls, steps: int, entry: Mapping, where: str) -> "StepCoefficients":
        """The entry of a config that holds checked entries (a scheduler's, which [`read`] checked when it was
        built), without checking it again."""
        knob = next((key for key in entry if key not in COEFFICIENT_NAMES), None)
        values = {name: float(entry[name]) for name in COEFFICIENT_NAMES}
        return cls(**values, knob=knob, knob_value=None if knob is None else float(entry[knob]))

    @property
    def coefficients(self) -> dict[str, float]:
        """η_R, η_T, η_O, α by name."""
        return {name: getattr(self, name) for name in COEFFICIENT_NAMES}

    def setting(self, key: str) -> float | None:
        """The entropy-matching knob `key`'s value, `None` where this entry holds another or none."""
        return self.knob_value if self.knob == key else None

    def to_json(self) -> dict[str, float]:
        """The entry as the config stores it: the four coefficients, then the knob where there is one."""
        return {**self.coefficients, **({self.knob: self.knob_value} if self.knob is not None else {})}


@dataclass(frozen=True)
class TuningRecord:
    """
    One NFE's entry of `tuning_by_steps`: how `untied-sc tune` chose that NFE's coefficients. The library reads the
    bank it was tuned on and the coefficients calibration ran at; the other fields are the lab's record, kept as
    written (`fields`).
    """

    fields: Mapping[str, Any]

    @classmethod
    def read(cls, steps: int, record, where: str) -> "TuningRecord":
        if not isinstance(record, Mapping):
            raise ValueError(f"{where} must be a tuning record (a mapping), got {record!r}.")
        return cls(dict(record))

    @property
    def seed(self) -> int:
        """The seed of the bank the search scored on."""
        return int(self.fields["seed"])

    @property
    def seed_space(self) -> str:
        """The bank's seed space; a record without one drew benchmark seeds (`untied_sc.seeds`)."""
        return self.fields.get("seed_space", DEFAULT_RECORD_SPACE)

    @property
    def num_samples(self) -> int | None:
        """The bank's size, where the record gives it."""
        return self.fields.get("num_samples")

    @property
    def calibrated(self) -> dict[str, float]:
        """The coefficients calibration ran at (a record without them: those the search started from)."""
        source = self.fields.get("calibrated") or self.fields["start"]
        return {name: float(source[name]) for name in COEFFICIENT_NAMES}

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


def coefficients_table(table: Mapping | None) -> dict[int, StepCoefficients]:
    """`coefficients_by_steps` of a file or config per NFE (`None`: none), every entry checked (`StepCoefficients`)."""
    return read_steps_table(table, "coefficients_by_steps", StepCoefficients.read)


def tuning_table(table: Mapping | None) -> dict[int, TuningRecord]:
    """`tuning_by_steps` of a file or config (`None`: none) per NFE ([`TuningRecord`])."""
    return read_steps_table(table, "tuning_by_steps", TuningRecord.read)


def stored_coefficients(config: Mapping) -> dict[int, StepCoefficients]:
    """A scheduler config's `coefficients_by_steps` per NFE, as stored (an untied scheduler checked them when it was
    built; an official one keeps them as hidden keys)."""
    return read_steps_table(config.get("coefficients_by_steps"), "coefficients_by_steps", StepCoefficients.stored)


def stored_tuning(config: Mapping) -> dict[int, TuningRecord]:
    """A scheduler config's `tuning_by_steps` per NFE."""
    return tuning_table(config.get("tuning_by_steps"))


def write_coefficients_table(table: Mapping[int, StepCoefficients]) -> dict[str, dict[str, float]]:
    """`coefficients_by_steps` as a config or file keeps it: NFE keys as strings, plain floats."""
    return write_steps_table(table, StepCoefficients.to_json)


def write_tuning_table(table: Mapping[int, TuningRecord]) -> dict[str, dict]:
    """`tuning_by_steps` as a config or file keeps it: NFE keys as strings."""
    return write_steps_table(table, TuningRecord.to_json)


def tables_config(
    coefficients: Mapping[int, StepCoefficients], tuning: Mapping[int, TuningRecord]
) -> dict[str, dict | None]:
    """The scheduler config keys (`register_to_config(**...)`) of per-NFE coefficients and tuning records, as JSON
    keeps them; an empty table is `None`."""
    return {
        "coefficients_by_steps": write_coefficients_table(coefficients) if coefficients else None,
        "tuning_by_steps": write_tuning_table(tuning) if tuning else None,
    }


def _check_diversity(key: str, value, coefficients: Mapping[str, float], where: str) -> float:
    neutral, lowest, inclusive = DIVERSITY_KEYS[key]
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (value >= lowest if inclusive else value > lowest)
    ):
        raise ValueError(f"{where}[{key!r}] must be a number {'≥' if inclusive else '>'} {lowest}, got {value!r}.")
    if coefficients["eta_r"] == 0 and coefficients["eta_t"] == 0 and value != neutral:
        raise ValueError(
            f"{where} has η_R = η_T = 0 (the official sampler bit for bit) and {key} = {value}: an entry that switches "
            f"the untied components off must leave {key} out (or at {neutral:g}). Remove it, or tune again."
        )
    return float(value)


def entropy_matched_setting(config: Mapping, num_inference_steps: int, key: str) -> float | None:
    """
    The diversity knob `key` stored for `num_inference_steps` in the untied scheduler `config`'s
    `coefficients_by_steps` (what `untied-sc tune` chose so that the untied sampler runs at official's entropy), or
    `None`: where no entry holds it, or where the run's coefficients do not come from that entry (an explicit
    coefficient in the config, or a paper preset that lists this NFE), since the value was matched for that entry's
    coefficients alone.
    """
    if any(config.get(name) is not None for name in COEFFICIENT_NAMES):
        return None
    preset = config.get("coefficients")
    if preset is not None and num_inference_steps in paper_coefficients().get(preset, {}):
        return None
    entry = stored_coefficients(config).get(num_inference_steps)
    return None if entry is None else entry.setting(key)


def resolve_coefficients(config: Mapping, num_inference_steps: int) -> dict[str, float]:
    """
    (η_R, η_T, η_O, α) for `num_inference_steps` from an untied scheduler's `config` (the module's rule).

    Args:
        config (`Mapping`): the scheduler config (`eta_r`…`alpha`, `coefficients`, `coefficients_by_steps`).
        num_inference_steps (`int`): N.
    """
    n = num_inference_steps
    resolved = {name: config.get(name) for name in COEFFICIENT_NAMES}
    missing = [name for name in COEFFICIENT_NAMES if resolved[name] is None]
    if not missing:
        return {name: float(value) for name, value in resolved.items()}
    preset = config.get("coefficients")
    preset_table = paper_coefficients()[preset] if preset is not None else {}
    by_steps = stored_coefficients(config)
    if n in preset_table:
        fallback = preset_table[n]
    elif n in by_steps:
        fallback = by_steps[n].coefficients
    elif preset is not None:
        fallback = preset_entry(preset, num_inference_steps)[1]
    else:
        sources = [f"`coefficients_by_steps` (this config has NFEs {sorted(by_steps)}; `untied-sc tune` writes them)"]
        raise ValueError(
            f"No coefficients for {num_inference_steps} steps ({', '.join(missing)} unset). Set them as config "
            f"values (`eta_r=`, `eta_t=`, `eta_o=`, `alpha=`), name a paper preset with `coefficients=` (one of "
            f"{sorted(paper_coefficients())}), or give them per NFE in `coefficients_by_steps` (e.g. "
            f"`untied-sc calibrate PIPELINE_DIR --nfe {num_inference_steps}` writes the family preset's, or "
            f"`--coefficients PRESET` / `--eta-r R --eta-t T --eta-o O --alpha A` ones). Consulted: "
            f"{'; '.join(sources)}."
        )
    resolved = {name: float(fallback[name] if resolved[name] is None else resolved[name]) for name in resolved}
    check_coefficients(resolved)
    return resolved
