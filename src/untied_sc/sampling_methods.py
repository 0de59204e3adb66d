"""The sampling methods beside the official sampler: the untied sampler and the comparison samplers, one record each.

A [`SamplingMethod`] is what a sampler spec's `"scheduler"` names (`"momentum"`): its scheduler per model family,
the knobs the tuning rule searches (`calibration/search.py`), the values at which it is the official sampler bit
for bit, where its search starts, and its name in reports. The schedulers' `_compatibles` lists, the sampler specs
([`build_scheduler`]), the search and the `baselines` experiment read it here.

Like [`untied_sc.families`], this module imports nothing of the package but that registry (the schedulers are named
by class, and imported on first use), so that the schedulers themselves can list the comparison schedulers as compatibles.

Adding a method is one [`register`] call at the end of this module: its scheduler class per family (exported by
`untied_sc.schedulers`), its knobs ([`Knob`]), its neutral values and search start. A family without a scheduler of
the method is refused for it by [`SamplingMethod.scheduler_class`].
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .families import ClassRef


# Where a modified prediction goes: into the solver, into the next self-conditioning input, or both (the comparison
# samplers' `*_routing` and the untied sampler's `correction_routing`).
ROUTINGS = ("solver", "self_conditioning", "both")


@dataclass(frozen=True)
class Knob:
    """
    One coordinate of a method's search.

    `kind` is `"scale"` (a non-negative strength moved by multiplicative steps) or `"choice"` (one of `choices`). A
    scale knob with `complement` moves `1 − value` instead (Momentum's β: the step acts on 1 − β, so β = 1, no
    momentum, is its 0). `upper` caps the moved quantity (a hard limit, inclusive); `positive` excludes 0 (α).
    """

    name: str
    kind: str = "scale"
    upper: float | None = None
    positive: bool = False
    complement: bool = False
    choices: tuple[str, ...] = ()
    why: str = ""

    def to_search(self, value):
        return 1.0 - float(value) if self.complement else value

    def to_config(self, x):
        return 1.0 - float(x) if self.complement else x

    def lowest(self) -> float | None:
        """The moved quantity's hard lower limit (`None` where it is open, as α's 0)."""
        return None if self.positive else 0.0

    def step(self, x: float, factor: float) -> float | None:
        """`x·factor` within the knob's limits (capped at `upper`; `None` when it leaves them)."""
        value = x * factor
        if self.positive and value <= 0:
            return None
        if self.upper is not None:
            value = min(value, self.upper)
        return value


@dataclass(frozen=True)
class SamplingMethod:
    """
    One sampling method.

    Args:
        name (`str`): what a sampler spec's `"scheduler"` names (`"momentum"`).
        label (`str`): its name in reports (`"Momentum"`).
        schedulers (`Mapping[str, str]`): family name → its scheduler class, exported by `untied_sc.schedulers`.
        knobs (`tuple[Knob, ...]`): the coordinates of its search: its strengths and the choices its source leaves
            open (docs/algorithm.md §9).
        neutral (`Mapping[str, object]`): the knob values at which it is the official sampler bit for bit (knobs not
            named keep their start).
        start (`Mapping[str, object]`, *optional*): its source's defaults, where its search starts; `None` for the
            untied sampler, which starts from its calibrated coefficients.
        uses_ace (`bool`): whether it steers with ACE's direction (the pipeline component `ace_statistics`).
    """

    name: str
    label: str
    schedulers: Mapping[str, str]
    knobs: tuple[Knob, ...]
    neutral: Mapping[str, object]
    start: Mapping[str, object] | None = None
    uses_ace: bool = False

    @property
    def comparison(self) -> bool:
        """Whether it is a comparison sampler (every method but the untied sampler, which starts from calibration)."""
        return self.start is not None

    def scheduler_class(self, family: str) -> type:
        """The method's scheduler for `family` (a `ValueError` where it has none)."""
        if family not in self.schedulers:
            raise ValueError(
                f"No {self.name!r} sampler for family {family!r}: it has schedulers for {', '.join(self.schedulers)}."
            )
        return ClassRef("untied_sc.schedulers", self.schedulers[family]).load()


_METHODS: dict[str, SamplingMethod] = {}


def register(method: SamplingMethod) -> SamplingMethod:
    """Adds `method` to the registry (a name registered twice is refused)."""
    if method.name in _METHODS:
        raise ValueError(f"A sampling method {method.name!r} is registered already.")
    _METHODS[method.name] = method
    return method


def get_method(name: str) -> SamplingMethod:
    """The method named `name`; an unknown name raises a `ValueError` listing the known ones."""
    if name not in _METHODS:
        raise ValueError(f"Unknown sampling method {name!r}; the methods are {', '.join(_METHODS)}.")
    return _METHODS[name]


def methods() -> tuple[SamplingMethod, ...]:
    """Every registered method, the untied sampler first, in registration order."""
    return tuple(_METHODS.values())


def comparison_methods() -> tuple[SamplingMethod, ...]:
    """The comparison samplers (every method but the untied sampler), in registration order."""
    return tuple(method for method in _METHODS.values() if method.comparison)


def comparison_scheduler_names(family: str) -> tuple[str, ...]:
    """The class names of `family`'s comparison schedulers, for `_compatibles` lists."""
    return tuple(method.schedulers[family] for method in comparison_methods() if family in method.schedulers)


def _per_family(stem: str) -> dict[str, str]:
    return {"elf": f"{stem}ELFScheduler", "langflow": f"{stem}LangFlowScheduler"}


_HIGS_ROUTING = Knob("higs_routing", "choice", choices=ROUTINGS, why="the paper does not say where D̃ goes")

register(
    SamplingMethod(
        name="untied",
        label="untied",
        schedulers=_per_family("Untied"),
        knobs=(
            *(Knob(name, why="the paper's coefficient") for name in ("eta_r", "eta_t", "eta_o")),
            Knob("alpha", upper=1.0, positive=True, why="the paper's coefficient, in (0, 1]"),
        ),
        neutral={"eta_r": 0.0, "eta_t": 0.0},
    )
)
register(
    SamplingMethod(
        name="momentum",
        label="Momentum",
        schedulers=_per_family("Momentum"),
        knobs=(
            Knob("momentum_beta", upper=0.95, complement=True, why="β ∈ (0, 1]; the search moves 1 − β"),
            Knob("momentum_routing", "choice", choices=ROUTINGS, why="written for samplers without self-conditioning"),
        ),
        neutral={"momentum_beta": 1.0},
        start={"momentum_beta": 0.9, "momentum_routing": "solver"},
    )
)
register(
    SamplingMethod(
        name="higs",
        label="HiGS",
        schedulers=_per_family("HiGS"),
        knobs=(Knob("higs_weight", why="w_HiGS"), _HIGS_ROUTING),
        neutral={"higs_weight": 0.0},
        start={"higs_weight": 1.75, "higs_routing": "both"},
    )
)
register(
    SamplingMethod(
        name="ace",
        label="ACE",
        schedulers=_per_family("ACE"),
        knobs=(Knob("ace_strength", why="λ; its routing (the next SC input) is the source's code"),),
        neutral={"ace_strength": 0.0},
        start={"ace_strength": 2.0},
        uses_ace=True,
    )
)
register(
    SamplingMethod(
        name="higs_ace",
        label="HiGS + ACE",
        schedulers=_per_family("HiGSACE"),
        knobs=(Knob("higs_weight", why="w_HiGS"), _HIGS_ROUTING, Knob("ace_strength", why="λ")),
        neutral={"higs_weight": 0.0, "ace_strength": 0.0},
        start={"higs_weight": 1.75, "higs_routing": "both", "ace_strength": 2.0},
        uses_ace=True,
    )
)
register(
    SamplingMethod(
        name="multistep",
        label="DPM-Solver++(2M)",
        schedulers=_per_family("Multistep"),
        knobs=(Knob("multistep_strength", why="1 = DPM-Solver++(2M)"),),
        neutral={"multistep_strength": 0.0},
        start={"multistep_strength": 1.0},
    )
)
