"""The sampler spec: which scheduler one sampler builds and with what settings, as a typed record.

In files (a report's `samplers`, `--spec`, a run store's keys) a spec is a JSON object, e.g. `{"scheduler": "momentum",
"knobs_by_steps": {"8": {"momentum_beta": 0.8}}, "temperature": 0.9}`: `scheduler`, the pipeline-call arguments
([`CALL_KEYS`]), `<coefficient>_scale` keys, `knobs_by_steps` (config overrides per NFE) and every other key a
scheduler config override. [`SamplerSpec.from_json`] reads it once; [`SamplerSpec.to_json`] writes back the very
object it was read from (keys, order and values), so that reports and store keys keep their bytes.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..per_nfe import read_steps_table, write_steps_table


# Pipeline-call arguments a sampler spec may carry; every other key is a scheduler config override.
CALL_KEYS = ("temperature", "sc_cfg_scale", "decode_temperature")
# A spec key holding config overrides by NFE (`{"8": {"momentum_beta": 0.8}}`): knobs tuned per NFE.
KNOBS_KEY = "knobs_by_steps"
SCHEDULER_KEY = "scheduler"
SCALE_SUFFIX = "_scale"
# The sampler whose spec names no scheduler runs the official one; every other sampler the untied one.
OFFICIAL = "official"


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: Any, key: str, where: str) -> float:
    """`value` of `key` when it is a number, else an error naming the key and what it takes."""
    if not _is_number(value):
        raise ValueError(f"{where}: {key!r} must be a number, e.g. {{{key!r}: 0.5}}, got {value!r}.")
    return value


def split_scales(entries: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, float]]:
    """`(overrides, scales)`: the `<coefficient>_scale` keys of `entries` as `{coefficient: factor}`, apart from the
    other keys (kept as they are)."""
    overrides = {key: value for key, value in entries.items() if not key.endswith(SCALE_SUFFIX)}
    scales = {key.removesuffix(SCALE_SUFFIX): value for key, value in entries.items() if key.endswith(SCALE_SUFFIX)}
    return overrides, scales


def _knobs_entry(steps: int, value: Any, where: str) -> dict[str, Any]:
    """One NFE's knobs of a `knobs_by_steps` table: a mapping of config key to value."""
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ValueError(
            f"{where} must map config keys to values, e.g. {{'momentum_beta': 0.8}}, got {value!r} (NFE {steps})."
        )
    return dict(value)


@dataclass(frozen=True)
class SamplerSpec:
    """
    One sampler's spec: the scheduler [`build_scheduler`] builds and the settings it builds and calls it with.

    Args:
        scheduler (`str`, *optional*): `"official"`, `"untied"` or a comparison method (`"momentum"`, …); `None`:
            the sampler's default ([`SamplerSpec.scheduler_for`]).
        overrides (`Mapping[str, Any]`): scheduler config overrides (`{"eta_r": 0.5}`, `{"coefficients": "paper"}`).
        scales (`Mapping[str, float]`): factors on resolved coefficients, by coefficient (`{"eta_t": 0.5}` is the
            key `eta_t_scale`).
        call (`Mapping[str, float]`): pipeline-call arguments ([`CALL_KEYS`]: `temperature`, …).
        knobs_by_steps (`Mapping[int, Mapping[str, Any]]`, *optional*): config overrides by NFE (tuned knobs).
        key_order (`tuple[str, ...]`): the JSON keys that come first in [`SamplerSpec.to_json`], in order (those
            [`SamplerSpec.from_json`] read); the others follow in the order of the fields above. Not compared.
    """

    scheduler: str | None = None
    overrides: Mapping[str, Any] = field(default_factory=dict)
    scales: Mapping[str, float] = field(default_factory=dict)
    call: Mapping[str, float] = field(default_factory=dict)
    knobs_by_steps: Mapping[int, Mapping[str, Any]] | None = None
    key_order: tuple[str, ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, entries: Any, where: str = "The sampler spec") -> "SamplerSpec":
        """
        Reads a spec from its JSON object; `where` names it in errors (e.g. `samplers['untied']`).

        Raises:
            `ValueError`: `entries` is no mapping, a key is no string, `scheduler` is no string, a call argument or a
                `_scale` factor is no number, or `knobs_by_steps` is no table of NFE to config overrides.
        """
        if isinstance(entries, SamplerSpec):
            return entries
        if not isinstance(entries, Mapping):
            raise ValueError(
                f"{where} must be a mapping of its settings, e.g. {{'scheduler': 'untied', 'eta_r': 0.5}}, got "
                f"{entries!r}."
            )
        wrong = [key for key in entries if not isinstance(key, str)]
        if wrong:
            raise ValueError(f"{where}: keys must be strings (setting names), got {wrong}.")
        scheduler = entries.get(SCHEDULER_KEY)
        if SCHEDULER_KEY in entries and not isinstance(scheduler, str):
            raise ValueError(
                f"{where}: 'scheduler' must be a scheduler's name, e.g. 'untied' or 'momentum', got {scheduler!r}; "
                "leave it out for the sampler's default."
            )
        call = {key: _number(value, key, where) for key, value in entries.items() if key in CALL_KEYS}
        rest = {key: value for key, value in entries.items() if key not in (SCHEDULER_KEY, KNOBS_KEY, *CALL_KEYS)}
        overrides, scales = split_scales(rest)
        knobs = None
        if KNOBS_KEY in entries:
            knobs = read_steps_table(entries[KNOBS_KEY], f"{where}: {KNOBS_KEY}", _knobs_entry)
        return cls(
            scheduler=scheduler,
            overrides=overrides,
            scales={key: _number(value, f"{key}{SCALE_SUFFIX}", where) for key, value in scales.items()},
            call=call,
            knobs_by_steps=knobs,
            key_order=tuple(entries),
        )

    @classmethod
    def of(cls, spec: "SamplerSpec | Mapping", where: str = "The sampler spec") -> "SamplerSpec":
        """`spec` as a record: a [`SamplerSpec`] as it is, a mapping read with [`SamplerSpec.from_json`]."""
        return spec if isinstance(spec, SamplerSpec) else cls.from_json(spec, where)

    def to_json(self) -> dict[str, Any]:
        """The spec's JSON object: the one [`SamplerSpec.from_json`] read (keys, order, values; NFE keys as
        strings)."""
        entries = {SCHEDULER_KEY: self.scheduler} if self.scheduler is not None else {}
        entries.update(self.overrides)
        entries.update({f"{key}{SCALE_SUFFIX}": value for key, value in self.scales.items()})
        entries.update(self.call)
        if self.knobs_by_steps is not None:
            entries[KNOBS_KEY] = write_steps_table(self.knobs_by_steps, dict)
        first = [key for key in self.key_order if key in entries]
        return {key: entries[key] for key in (*first, *(key for key in entries if key not in first))}

    def scheduler_for(self, name: str) -> str:
        """The scheduler sampler `name` runs: its `scheduler`, else `"official"` for the sampler named official and
        `"untied"` for every other."""
        if self.scheduler is not None:
            return self.scheduler
        return OFFICIAL if name == OFFICIAL else "untied"

    def with_scheduler(self, scheduler: str) -> "SamplerSpec":
        """The spec with its `scheduler` stated, `scheduler` where it names none; the key comes first in its JSON."""
        order = (SCHEDULER_KEY, *(key for key in self.key_order if key != SCHEDULER_KEY))
        return replace(self, scheduler=scheduler if self.scheduler is None else self.scheduler, key_order=order)

    def with_default_overrides(self, defaults: Mapping[str, Any]) -> "SamplerSpec":
        """The spec with the config overrides `defaults` where it sets none of its own; their keys come first in its
        JSON (as `{**defaults, **spec}`)."""
        order = (*defaults, *(key for key in self.key_order if key not in defaults))
        return replace(self, overrides={**defaults, **self.overrides}, key_order=order)

    def with_knobs(self, knobs_by_steps: Mapping[int, Mapping[str, Any]]) -> "SamplerSpec":
        """The spec with `knobs_by_steps` as its per-NFE config overrides."""
        return replace(self, knobs_by_steps={steps: dict(knobs) for steps, knobs in knobs_by_steps.items()})

    def without_knobs(self) -> "SamplerSpec":
        """The spec without its per-NFE config overrides (what the parts of one sweep share)."""
        return replace(self, knobs_by_steps=None)

    def knobs_at(self, num_inference_steps: int | None, *, missing_ok: bool = False) -> dict[str, Any] | None:
        """
        The config overrides `knobs_by_steps` gives at `num_inference_steps`: an error where it has none (or the
        spec has no table), or `None` with `missing_ok` (what names a run needs no knobs there: sampling it is
        refused all the same).
        """
        by_steps = self.knobs_by_steps or {}
        if num_inference_steps not in by_steps:
            if missing_ok:
                return None
            raise ValueError(
                f"The sampler spec has knobs for NFE {sorted(by_steps)} only, not {num_inference_steps}: tune "
                "its knobs at that NFE (`untied-sc benchmark --experiment baselines` tunes every --nfe)."
            )
        return dict(by_steps[num_inference_steps])

    def settings_at(self, num_inference_steps: int | None) -> tuple[dict[str, Any], dict[str, float]]:
        """`(overrides, scales)` the scheduler is built with at `num_inference_steps`: the spec's, then its knobs
        there (a knob `<coefficient>_scale` is a scale)."""
        knobs = {} if self.knobs_by_steps is None else self.knobs_at(num_inference_steps)
        knob_overrides, knob_scales = split_scales(knobs)
        return {**self.overrides, **knob_overrides}, {**self.scales, **knob_scales}
