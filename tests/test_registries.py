"""The registries of model families and sampling methods: every reference resolves to the class it names, the
records agree with the classes, and unknown names fail with the known ones listed."""

import dataclasses
import re

import pytest

from untied_sc.defaults import CURVE_VALUES
from untied_sc.families import (
    default_protocol,
    families,
    family_names,
    family_of,
    get_family,
    register,
    untied_families,
)
from untied_sc.generation.sampling import diversity_knob, resampling_unit
from untied_sc.generation.sampling import family_of as sampling_family_of
from untied_sc.models.official_checkpoints import OFFICIAL_CHECKPOINTS
from untied_sc.sampling_methods import ROUTINGS, comparison_methods, get_method, methods
from untied_sc.sampling_methods import register as register_method
from untied_sc.schedulers import UntiedSelfConditioningMixin, UntiedSelfConditioningScheduler
from untied_sc.schedulers.coefficients import paper_coefficients
from untied_sc.schedulers.scheduling_ace import ACEStatisticsMixin


def test_unknown_names_list_the_known_ones():
    with pytest.raises(ValueError, match="Unknown model family 'dit'; the families are elf, langflow, flowmap"):
        get_family("dit")
    with pytest.raises(ValueError, match="Unknown sampling method 'dpm'; the methods are untied, momentum, "):
        get_method("dpm")
    with pytest.raises(ValueError, match="registered already"):
        register(get_family("elf"))
    with pytest.raises(ValueError, match="registered already"):
        register_method(get_method("ace"))
    with pytest.raises(ValueError, match="Expected a component of one of the model families"):
        family_of(object())


@pytest.mark.parametrize("name", family_names())
def test_family_references_name_the_family_classes(name):
    family = get_family(name)
    network, official, untied, pipeline = (
        ref.load() for ref in (family.network, family.official_scheduler, family.untied_scheduler, family.pipeline)
    )
    assert network.family == official.family == untied.family == pipeline.family == name
    assert callable(family.converter.load()) and callable(family.config_from_weights.load())
    assert family_of(pipeline) is family and hasattr(family.tokenizer.load(), "from_pretrained")
    assert family.official_checkpoints() == [c for c in OFFICIAL_CHECKPOINTS if c.family == name]
    assert family.num_update_steps(8) == (8 if family.updates_on_last_step else 7)
    assert family.latent_width_key in network._get_init_keys(network)  # a config field of the network
    assert family.block_prefix.endswith(".")
    if name not in untied_families():
        return  # the checks of Algorithm 1's sampler and the lab's measurements: below, for the families they serve
    assert issubclass(untied, UntiedSelfConditioningMixin) and not issubclass(official, UntiedSelfConditioningMixin)
    assert type(UntiedSelfConditioningScheduler.from_config(official().config)) is untied
    assert (
        family.official_scheduler.name in untied._compatibles and family.untied_scheduler.name in official._compatibles
    )
    assert family.default_preset in family.presets() and all(p in paper_coefficients() for p in family.presets())
    assert family.protocol in ("elf", "langflow") and family.resampling_unit in ("batch", "sample")
    assert resampling_unit(name) == family.resampling_unit and diversity_knob(name) == family.diversity_knob
    assert CURVE_VALUES[name] == family.curve_values


@pytest.mark.parametrize("name", [name for name in family_names() if name not in untied_families()])
def test_a_family_outside_algorithm_1_leaves_its_fields_out_and_is_refused_by_their_readers(name):
    """A family Algorithm 1's untied scheduler does not serve (the flow maps: their untied transform wraps the
    official flow-map sampler, `UntiedFlowMapLMScheduler`, with no paper preset, GenPPL protocol or training module)
    leaves those fields `None`; every reader refuses it with one message naming the family and the field."""
    family = get_family(name)
    untied, official = family.untied_scheduler.load(), family.official_scheduler.load()
    assert issubclass(untied, official) and not issubclass(untied, UntiedSelfConditioningMixin)
    for field in ("default_preset", "diversity_knob", "curve_values", "frontier_values", "protocol"):
        assert getattr(family, field) is None
        with pytest.raises(ValueError, match=f"{re.escape(family.display_name)} family.*no {field}"):
            family.require(field, "this")
    assert name not in CURVE_VALUES and family.presets() == []
    with pytest.raises(ValueError, match="no protocol"):
        default_protocol(name)
    with pytest.raises(ValueError, match="no resampling_unit"):
        resampling_unit(name)
    with pytest.raises(ValueError, match="no diversity_knob"):
        diversity_knob(name)
    with pytest.raises(
        ValueError, match=f"not sampled by Algorithm 1's untied scheduler: build its own, {untied.__name__}"
    ):
        UntiedSelfConditioningScheduler(solver=name)
    pipe = object.__new__(family.pipeline.load())  # the class is what the sampling commands check
    with pytest.raises(ValueError, match=f"got {family.pipeline.name}; {family.pipeline.name} is sampled by its own"):
        sampling_family_of(pipe)


def test_every_family_has_a_record_and_each_record_its_own_classes():
    records = families()
    assert [family.name for family in records] == list(family_names())
    for field in ("network", "official_scheduler", "untied_scheduler", "pipeline"):
        assert len({getattr(family, field) for family in records}) == len(records)


@pytest.mark.parametrize("method", methods(), ids=lambda method: method.name)
def test_method_records_agree_with_their_schedulers(method):
    knob_names = [knob.name for knob in method.knobs]
    assert set(method.neutral) <= set(knob_names)
    if method.comparison:
        assert list(method.start) == knob_names  # the search starts from a value of every knob
    for knob in method.knobs:
        assert knob.kind in ("scale", "choice") and (knob.kind == "scale") == (not knob.choices)
        assert not knob.choices or set(knob.choices) == set(ROUTINGS)
    for family in family_names():
        if family not in untied_families():  # no comparison sampler: the method refuses the family, naming it
            with pytest.raises(ValueError, match=f"No {method.name!r} sampler for family {family!r}"):
                method.scheduler_class(family)
            continue
        cls = method.scheduler_class(family)
        assert cls.family == family and cls.__name__ == method.schedulers[family]
        keys = set(cls._get_init_keys(cls))
        assert set(knob_names) <= keys, f"{cls.__name__} lacks knobs {set(knob_names) - keys}"
        assert issubclass(cls, ACEStatisticsMixin) == method.uses_ace
        if method.comparison:
            official = get_family(family).official_scheduler.load()
            assert cls.__name__ in official._compatibles
            scheduler = cls(**method.start)
            assert {name: scheduler.config[name] for name in knob_names} == dict(method.start)


def test_a_method_without_a_scheduler_for_a_family_is_refused_for_it():
    partial = dataclasses.replace(get_method("momentum"), schedulers={"elf": "MomentumELFScheduler"})
    assert partial.scheduler_class("elf").__name__ == "MomentumELFScheduler"
    with pytest.raises(ValueError, match="No 'momentum' sampler for family 'langflow'"):
        partial.scheduler_class("langflow")


def test_ace_methods_are_the_ones_that_need_ace_statistics():
    needing = {method.name for method in comparison_methods() if method.uses_ace}
    assert needing == {"ace", "higs_ace"}


def test_an_untied_variant_may_not_take_another_variants_switch_and_names_its_schedulers_families():
    import untied_sc_lab  # noqa: F401  (registers the lab's ablation schedulers)
    from untied_sc.families import ClassRef
    from untied_sc.untied_variants import UntiedVariant, register_untied_variant, untied_variant_class

    rival = UntiedVariant("rival", ("correction_routing",), {"elf": ClassRef("untied_sc.schedulers", "ELFScheduler")})
    with pytest.raises(
        ValueError, match=r"'rival' takes switches registered already: \{'correction_routing': 'ablations'\}"
    ):
        register_untied_variant(rival)
    assert untied_variant_class("elf", ["correction_routing"]).__name__ == "AblationUntiedELFScheduler"
    with pytest.raises(ValueError, match="'rival' has no scheduler for family 'langflow': it has schedulers for elf"):
        rival.scheduler_class("langflow")
