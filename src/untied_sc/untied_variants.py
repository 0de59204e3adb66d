"""The untied sampler's variants: schedulers that take the untied config plus switches of their own.

The library's untied schedulers run the paper's sampler. The paper's ablations (docs/algorithm.md §3.6, §3.8) are
switches of the lab's schedulers (`untied_sc_lab.ablations`), whose values [`ABLATION_DEFAULTS`] are the paper's
sampler: a saved config that carries them at these values loads into the untied schedulers, other values need the
lab's. A package that defines such schedulers registers them when it is imported ([`register_untied_variant`]), so
that a sampler spec `{"scheduler": "untied", "correction_routing": "both"}` is built with them
([`untied_variant_class`], read by `build_scheduler`) without the library importing that package.

Like [`untied_sc.families`], this module imports nothing of the package but that registry (a variant names its
schedulers by [`ClassRef`], imported on first use), so that registering loads no torch.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .families import ClassRef


# The paper's sampler as the ablation switches of the lab's schedulers have it (docs/algorithm.md §3.6, §3.8).
ABLATION_DEFAULTS = {
    "correction_routing": "solver",
    "transform_assignment": "overlap",
    "transform_seed": 0,
    "global_scaling": True,
    "cosine_distance": "precomputed",
    "correction_direction": "history",
    "direction_seed": 0,
}


@dataclass(frozen=True)
class UntiedVariant:
    """
    Schedulers of the untied sampler with switches of their own, one per model family.

    Args:
        name (`str`): the variant's name in messages (`"ablations"`).
        switches (`tuple[str, ...]`): the config keys it takes beyond the untied config.
        schedulers (`Mapping[str, ClassRef]`): family name → its scheduler class.
    """

    name: str
    switches: tuple[str, ...]
    schedulers: Mapping[str, ClassRef]

    def scheduler_class(self, family: str) -> type:
        """The variant's scheduler for `family` (a `ValueError` where it has none)."""
        if family not in self.schedulers:
            raise ValueError(
                f"The untied variant {self.name!r} has no scheduler for family {family!r}: it has schedulers for "
                f"{', '.join(self.schedulers)}."
            )
        return self.schedulers[family].load()


_BY_SWITCH: dict[str, UntiedVariant] = {}


def register_untied_variant(variant: UntiedVariant) -> UntiedVariant:
    """Registers `variant` for its switches; a switch another variant registered is refused (the same one again is
    kept as it is)."""
    taken = {switch: _BY_SWITCH[switch].name for switch in variant.switches if switch in _BY_SWITCH}
    taken = {switch: name for switch, name in taken.items() if _BY_SWITCH[switch] != variant}
    if taken:
        raise ValueError(f"The untied variant {variant.name!r} takes switches registered already: {taken}.")
    for switch in variant.switches:
        _BY_SWITCH[switch] = variant
    return variant


def untied_variant_class(family: str, keys: Iterable[str]) -> type | None:
    """
    The scheduler of `family` that takes config `keys`: `None` where they name no switch (the untied scheduler takes
    them), else the registered variant's. An ablation switch without a registered variant is refused with how to
    install the lab.
    """
    switches = [key for key in keys if key in _BY_SWITCH or key in ABLATION_DEFAULTS]
    if not switches:
        return None
    missing = [switch for switch in switches if switch not in _BY_SWITCH]
    if missing:
        what = "an ablation switch" if len(missing) == 1 else "ablation switches"
        raise ValueError(
            f"{', '.join(map(repr, missing))}: {what} of the lab's untied schedulers, which are not loaded: "
            'pip install "untied-sc[lab]" (importing untied_sc_lab registers them), or remove the keys.'
        )
    variants = {_BY_SWITCH[switch].name: _BY_SWITCH[switch] for switch in switches}
    if len(variants) > 1:
        raise ValueError(f"The keys {switches} are switches of different untied variants: {sorted(variants)}.")
    return next(iter(variants.values())).scheduler_class(family)
