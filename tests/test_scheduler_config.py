"""Scheduler configs, diffusers-style: round trips, compatibles and swaps, the untied factory, and where a coefficient
comes from (docs/algorithm.md §4.5). The step contract (`scale_model_input`, `step`) is in test_step_contract.py.
"""

import json
import logging
import warnings
from contextlib import contextmanager

import pytest
import torch

from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    LangFlowPipeline,
    LangFlowScheduler,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    UntiedSelfConditioningMixin,
    UntiedSelfConditioningScheduler,
)
from untied_sc.schedulers import paper_coefficients
from untied_sc_lab.ablations import AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler

from .tiny import random_statistics, tiny_tokenizer


FAMILIES = {
    "elf": (ELFScheduler, UntiedELFScheduler),
    "langflow": (LangFlowScheduler, UntiedLangFlowScheduler),
}
SCHEDULERS = [cls for pair in FAMILIES.values() for cls in pair]
ABLATION_SCHEDULERS = [AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler]
COEFFICIENTS = {"eta_r": 1.5, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.8}
STEPS = 8


def _public(config) -> dict:
    return {key: value for key, value in config.items() if not key.startswith("_")}


@contextmanager
def diffusers_warnings():
    """The warnings diffusers logs meanwhile (its logger does not propagate to the root logger)."""
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger("diffusers")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.fixture
def make_pipe(tiny_elf, tiny_langflow):
    """A tiny pipeline of `family` with statistics for STEPS, running `scheduler` (default: the official one)."""

    def make(family: str, scheduler=None):
        if family == "elf":
            pipe = ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer())
        else:
            pipe = LangFlowPipeline(tiny_langflow, LangFlowScheduler(), tiny_tokenizer())
        pipe.register_modules(sampler_statistics=random_statistics(pipe.transformer, family, steps=(STEPS,)))
        if scheduler is not None:
            pipe.scheduler = scheduler
        pipe.set_progress_bar_config(disable=True)
        return pipe

    return make


def _latents(pipe, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return pipe(batch_size=2, num_inference_steps=STEPS, generator=generator, output_type="latent").latents


def _configured(scheduler_cls):
    """A scheduler of `scheduler_cls` with every config key away from its default where it has one."""
    if scheduler_cls is ELFScheduler:
        return ELFScheduler(p_mean=-1.0, p_std=0.9, sde_gamma_by_steps={"8": 1.5})
    if scheduler_cls is LangFlowScheduler:
        return LangFlowScheduler(quantile_eps=2e-5)
    switches = {}
    if scheduler_cls in ABLATION_SCHEDULERS:
        switches = {
            "correction_routing": "both",
            "cosine_distance": "online",
            "correction_direction": "random",
            "direction_seed": 7,
        }
    return scheduler_cls(
        eta_r=0.3,
        coefficients_by_steps={str(STEPS): {"eta_r": 1.2, "eta_t": 0.7, "eta_o": 1.3, "alpha": 0.6}},
        tuning_by_steps={str(STEPS): {"seed": 10000, "chosen": {"eta_t": 0.7}}},
        **switches,
    )


# ---------------------------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("scheduler_cls", SCHEDULERS + ABLATION_SCHEDULERS, ids=lambda cls: cls.__name__)
def test_save_and_reload_gives_the_same_config_and_the_same_samples(tmp_path, make_pipe, scheduler_cls):
    scheduler = _configured(scheduler_cls)
    pipe = make_pipe(scheduler_cls.family, scheduler)
    first, again = _latents(pipe, seed=5), _latents(pipe, seed=5)  # set_timesteps resets everything
    assert torch.equal(first, again)
    scheduler.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["_class_name"] == scheduler_cls.__name__
    loaders = [scheduler_cls.from_pretrained, lambda path: scheduler_cls.from_config(scheduler_cls.load_config(path))]
    if issubclass(scheduler_cls, UntiedSelfConditioningMixin) and scheduler_cls not in ABLATION_SCHEDULERS:
        loaders.append(UntiedSelfConditioningScheduler.from_pretrained)
    for load in loaders:
        with diffusers_warnings() as logged:
            reloaded = load(tmp_path)
        assert not logged
        assert type(reloaded) is scheduler_cls
        assert _public(reloaded.config) == _public(scheduler.config)
        assert torch.equal(_latents(make_pipe(scheduler_cls.family, reloaded), seed=5), first)


@pytest.mark.parametrize("scheduler_cls", [UntiedELFScheduler, UntiedLangFlowScheduler])
def test_a_tuned_coefficient_reloads_as_the_same_json_number(tmp_path, scheduler_cls):
    tuned = {"eta_r": 0.3, "eta_t": 0.1 + 0.2, "eta_o": 1.0, "alpha": 0.7}
    scheduler = scheduler_cls(coefficients_by_steps={8: tuned})  # an int NFE is stored as the string JSON gives back
    scheduler.save_pretrained(tmp_path)
    text = (tmp_path / "scheduler_config.json").read_text()
    assert '"eta_r": 0.3,' in text
    reloaded = scheduler_cls.from_pretrained(tmp_path)
    assert reloaded.config.coefficients_by_steps == {"8": tuned}
    assert reloaded.resolve_coefficients(8)["eta_r"] == 0.3


# ---------------------------------------------------------------------------------------------------------------
# Compatibles and swaps
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_compatibles_are_the_family_and_never_the_other_family(family):
    other = next(name for name in FAMILIES if name != family)
    for scheduler_cls in FAMILIES[family]:
        compatibles = scheduler_cls().compatibles
        assert set(FAMILIES[family]) <= set(compatibles)
        assert not set(FAMILIES[other]) & set(compatibles)
        assert all(cls.family == family for cls in compatibles)


@pytest.mark.parametrize("family", FAMILIES)
def test_official_untied_official_swaps_keep_the_untied_keys_without_warnings(family):
    official_cls, untied_cls = FAMILIES[family]
    official = official_cls()
    preset = {"elf": "elf-b", "langflow": "langflow-owt"}[family]  # a preset of the scheduler's own family
    with diffusers_warnings() as logged:
        untied = UntiedSelfConditioningScheduler.from_config(official.config, coefficients=preset, eta_t=0.25)
        back = official_cls.from_config(untied.config)
        again = UntiedSelfConditioningScheduler.from_config(back.config)
        direct = untied_cls.from_config(back.config)
    assert not logged, [record.getMessage() for record in logged]
    assert type(untied) is untied_cls and type(back) is official_cls and type(again) is untied_cls
    # The official keys are the official config's; the untied ones ride along as hidden config and come back.
    assert {key: back.config[key] for key in _public(official.config)} == _public(official.config)
    assert back.config["coefficients"] == preset and back.config["eta_t"] == 0.25
    assert _public(again.config) == _public(untied.config) == _public(direct.config)


@pytest.mark.parametrize("family", FAMILIES)
def test_untied_config_holds_its_family_keys_only(family):
    official_cls, untied_cls = FAMILIES[family]
    other_official, other_untied = FAMILIES["langflow" if family == "elf" else "elf"]
    untied_keys = set(_public(untied_cls().config))
    assert set(_public(official_cls().config)) <= untied_keys
    assert not set(_public(other_official().config)) & untied_keys
    assert "solver" not in untied_keys and "sc_cfg_scale" not in untied_keys
    assert untied_keys - set(_public(official_cls().config)) == set(_public(other_untied().config)) - set(
        _public(other_official().config)
    )


def test_a_coefficient_table_written_after_init_survives_an_in_memory_swap():
    # `untied-sc tune` and calibration write coefficients_by_steps into the scheduler config of a live pipeline.
    official = ELFScheduler()
    table = {"8": dict(COEFFICIENTS)}
    official.register_to_config(coefficients_by_steps=table)
    untied = UntiedSelfConditioningScheduler.from_config(official.config)
    assert untied.config.coefficients_by_steps == table
    untied.register_to_config(coefficients_by_steps={"16": dict(COEFFICIENTS)})
    assert UntiedELFScheduler.from_config(untied.config).config.coefficients_by_steps == {"16": COEFFICIENTS}


def test_a_scheduler_config_holding_sc_cfg_scale_is_refused_naming_the_file_and_the_fix(tmp_path, make_pipe):
    make_pipe("elf").save_pretrained(tmp_path)
    path = tmp_path / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "sc_cfg_scale": 2.5}))
    with pytest.raises(ValueError) as error:
        ELFPipeline.from_pretrained(tmp_path)
    message = str(error.value)
    for part in (str(path), "`sc_cfg_scale: 2.5`", "model_index.json", "untied-sc convert"):
        assert part in message, part
    with pytest.warns(UserWarning, match="ELFScheduler has no config key 'sc_cfg_scale'; it is ignored"):
        ELFScheduler.from_pretrained(tmp_path / "scheduler")  # the scheduler alone: an unknown key
    with pytest.raises(TypeError, match="sc_cfg_scale"):
        ELFScheduler(sc_cfg_scale=3.0)  # the pipeline's setting, not the scheduler's


# ---------------------------------------------------------------------------------------------------------------
# The factory
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_factory_picks_the_family_from_the_class_name(family):
    for source_cls in FAMILIES[family]:
        config = source_cls().config
        assert config["_class_name"] == source_cls.__name__  # in memory too, not only once saved
        built = UntiedSelfConditioningScheduler.from_config(config)
        assert type(built) is FAMILIES[family][1]
        assert isinstance(built, UntiedSelfConditioningScheduler) and isinstance(built, UntiedSelfConditioningMixin)
    assert not isinstance(FAMILIES[family][0](), UntiedSelfConditioningScheduler)


def test_factory_direct_construction_and_its_errors():
    scheduler = UntiedSelfConditioningScheduler(solver="langflow", coefficients="langflow-owt")
    assert type(scheduler) is UntiedLangFlowScheduler and scheduler.config.coefficients == "langflow-owt"
    with pytest.raises(ValueError, match="Give the solver family"):
        UntiedSelfConditioningScheduler()
    with pytest.raises(ValueError, match="must be one of \\['elf', 'langflow'\\], got 'mdlm'"):
        UntiedSelfConditioningScheduler(solver="mdlm")
    with pytest.raises(ValueError, match="two solver families"):
        UntiedSelfConditioningScheduler.from_config(ELFScheduler().config, solver="langflow")
    with pytest.raises(ValueError, match="Cannot tell the solver family of a FlowMatchEulerDiscreteScheduler"):
        UntiedSelfConditioningScheduler.from_config({"_class_name": "FlowMatchEulerDiscreteScheduler"})
    with pytest.raises(ValueError, match="Cannot tell the solver family of a UntiedSelfConditioningScheduler"):
        UntiedSelfConditioningScheduler.from_config(
            {"_class_name": "UntiedSelfConditioningScheduler", "solver": "elf"}
        )

    class Subclass(UntiedSelfConditioningScheduler):
        pass

    with pytest.raises(TypeError, match="Subclass UntiedELFScheduler or UntiedLangFlowScheduler"):
        Subclass(solver="elf")


# ---------------------------------------------------------------------------------------------------------------
# Where a coefficient comes from
# ---------------------------------------------------------------------------------------------------------------


TUNED = {"eta_r": 0.3, "eta_t": 0.6, "eta_o": 0.9, "alpha": 0.5}


def _resolve(steps: int, **config):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # resolving warns of nothing
        return UntiedELFScheduler(**config).resolve_coefficients(steps)


def test_an_explicit_value_wins_over_preset_and_table():
    everything = {"coefficients": "elf-b", "coefficients_by_steps": {"8": TUNED}}
    assert _resolve(8, eta_t=0.25, **everything) == {
        **paper_coefficients()["elf-b"][8],
        "eta_t": 0.25,
    }
    assert _resolve(12, eta_r=1.0, eta_t=1.0, eta_o=1.0, alpha=1.0) == dict.fromkeys(TUNED, 1.0)


def test_the_preset_comes_before_the_table_where_it_covers_the_nfe():
    assert _resolve(8, coefficients="elf-b", coefficients_by_steps={"8": TUNED}) == paper_coefficients()["elf-b"][8]
    assert _resolve(12, coefficients="elf-b", coefficients_by_steps={"12": TUNED}) == TUNED


def test_no_coefficients_is_an_error_naming_every_option_and_the_nfes_that_have_some():
    scheduler = UntiedELFScheduler(eta_r=1.0, coefficients_by_steps={"12": TUNED})
    with pytest.raises(ValueError) as error:
        scheduler.resolve_coefficients(24)
    message = str(error.value)
    for part in (
        "No coefficients for 24 steps (eta_t, eta_o, alpha unset)",
        "`eta_r=`, `eta_t=`, `eta_o=`, `alpha=`",
        "`coefficients=` (one of ['elf-b', 'elf-l', 'elf-m', 'langflow-lm1b', 'langflow-owt'])",
        "`untied-sc calibrate PIPELINE_DIR --nfe 24`",
        "`coefficients_by_steps` (this config has NFEs [12]; `untied-sc tune` writes them)",
    ):
        assert part in message
    with pytest.raises(ValueError, match=r"No coefficients for 8 steps .*this config has NFEs \[\]"):
        UntiedELFScheduler().resolve_coefficients(8)


def test_coefficients_from_the_config_drive_the_pipeline_as_explicit_values_do(make_pipe):
    explicit = make_pipe("langflow", UntiedLangFlowScheduler(**COEFFICIENTS))
    tabled = make_pipe("langflow", UntiedLangFlowScheduler(coefficients_by_steps={str(STEPS): COEFFICIENTS}))
    official = make_pipe("langflow")
    assert torch.equal(_latents(explicit), _latents(tabled))
    assert not torch.equal(_latents(explicit), _latents(official))
