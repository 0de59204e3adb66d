"""Where the coefficients η_R, η_T, η_O, α of an untied run come from (docs/algorithm.md §4.5).

For N steps, per coefficient, the first of these that has a value wins:

1. the explicit scalar in the scheduler config (`eta_r`, `eta_t`, `eta_o`, `alpha`);
2. the paper preset named by the config's `coefficients` (e.g. `"elf-b"`), if it lists N;
3. the config's `coefficients_by_steps[str(N)]` (what `untied-sc tune` or calibration wrote);
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
from importlib import resources
from typing import NamedTuple

from ..families import family_names, get_family
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


def paper_coefficients() -> dict[str, dict[str, dict[str, float]]]:
    """The paper's coefficient table (ELF-B/M/L, LangFlow OWT/LM1B), keyed by preset name and NFE."""
    text = resources.files("untied_sc").joinpath("data/coefficients.json").read_text()
    return {name: table for name, table in json.loads(text).items() if not name.startswith("_")}


def nearest_listed_steps(listed, num_steps: int) -> int:
    """
    The listed NFE nearest to `num_steps` in log2 (|log2 n − log2 N| smallest), ties going to the smaller NFE
    **[choice]**: with 8/16/32/64 listed, the boundaries are the geometric means 8√2 ≈ 11.3, 16√2 ≈ 22.6 and
    32√2 ≈ 45.3, so 5 → 8, 11 → 8, 12 → 16, 22 → 16, 24 → 32, 48 → 64, 1000 → 64 (ties cannot occur between powers
    of two; they would between e.g. 8 and 18, at 12).
    """
    steps = sorted(int(n) for n in listed)
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
    if not isinstance(num_steps, int) or num_steps < 1:
        raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
    table = paper_coefficients()[name]
    listed = num_steps if str(num_steps) in table else nearest_listed_steps(table, num_steps)
    return listed, {key: float(value) for key, value in table[str(listed)].items()}


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


def coefficients_table(table: Mapping | None) -> dict[str, dict[str, float]] | None:
    """
    `coefficients_by_steps` as the config stores it: NFE keys as strings, each entry exactly η_R, η_T, η_O, α (and
    at most one entropy-matching knob of [`DIVERSITY_KEYS`]) as plain floats (JSON numbers, so a tuned 0.3 reloads
    as 0.3), checked. `None` stays `None`.
    """
    if table is None:
        return None
    normalised = {}
    for steps, entry in table.items():
        where = f"coefficients_by_steps[{str(steps)!r}]"
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
        for key in extra:
            values[key] = _check_diversity(key, entry[key], values, where)
        normalised[str(steps)] = values
    return normalised


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
    if preset is not None and str(num_inference_steps) in paper_coefficients().get(preset, {}):
        return None
    entry = (config.get("coefficients_by_steps") or {}).get(str(num_inference_steps)) or {}
    value = entry.get(key)
    return None if value is None else float(value)


def _steps(table: Mapping | None) -> list[int]:
    return sorted(int(n) for n in table or {})


def resolve_coefficients(config: Mapping, num_inference_steps: int) -> dict[str, float]:
    """
    (η_R, η_T, η_O, α) for `num_inference_steps` from an untied scheduler's `config` (the module's rule).

    Args:
        config (`Mapping`): the scheduler config (`eta_r`…`alpha`, `coefficients`, `coefficients_by_steps`).
        num_inference_steps (`int`): N.
    """
    n = str(num_inference_steps)
    resolved = {name: config.get(name) for name in COEFFICIENT_NAMES}
    missing = [name for name in COEFFICIENT_NAMES if resolved[name] is None]
    if not missing:
        return {name: float(value) for name, value in resolved.items()}
    preset = config.get("coefficients")
    preset_table = paper_coefficients()[preset] if preset is not None else {}
    by_steps = config.get("coefficients_by_steps") or {}
    if n in preset_table:
        fallback = preset_table[n]
    elif n in by_steps:
        fallback = {name: by_steps[n][name] for name in COEFFICIENT_NAMES}
    elif preset is not None:
        fallback = preset_entry(preset, num_inference_steps)[1]
    else:
        sources = [f"`coefficients_by_steps` (this config has NFEs {_steps(by_steps)}; `untied-sc tune` writes them)"]
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
