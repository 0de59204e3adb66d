"""diffusers' scheduler conformance (its `SchedulerCommonTest`), adapted to (batch, length, dim) latents, run on every
scheduler of the package: the two official samplers, the two untied ones and the ten comparison samplers.

What diffusers checks, and where it is here:

- `check_over_configs`, `test_from_save_pretrained`, `test_from_pretrained`: `test_save_pretrained_round_trip`
  (config equal, whole runs equal bit for bit); `from_config`: `test_from_config_round_trip`.
- `test_compatibles`: `test_compatibles_are_stable_and_mutually_loadable` (every compatible, not only the last).
- `test_step_shape`: `test_step_outputs_keep_shape_and_dtype`; `test_scheduler_outputs_equivalence`:
  `test_tuple_and_dict_outputs_are_equal`; `test_scheduler_public_api`: `test_public_api`;
  `test_add_noise_device`: `test_add_noise_*`; `test_getattr_is_correct`, `test_deprecated_kwargs`: same names.
- Ours in addition: `set_timesteps(N)` bare, `scale_model_input` before `set_timesteps`, the `timestep` check of
  `step`, `set_begin_index`, `init_noise_sigma`, `order`; the run context (`RunContext`), of the flow-map
  schedulers too (`FLOWMAP_CASES`).

Not applicable (no case here): `test_trained_betas` (no β schedule: the samplers run on a time or γ grid drawn per
call), diffusers' VQ-diffusion and consistency-model special cases (classes of theirs), and stepping at arbitrary
timesteps 0 and 1 (diffusers' DDPM-style schedulers accept any training timestep; ours take the steps of their own
grid in order, checked by `test_step_checks_its_timestep`).
"""

import inspect
import json
import math
import warnings
from dataclasses import dataclass, field, replace

import pytest
import torch

from untied_sc.calibration.ace import ACEStatistics
from untied_sc.schedulers import (
    ACEELFScheduler,
    ACELangFlowScheduler,
    CDEQScheduler,
    ELFScheduler,
    FlowMapLMScheduler,
    HiGSACEELFScheduler,
    HiGSACELangFlowScheduler,
    HiGSELFScheduler,
    HiGSLangFlowScheduler,
    LangFlowScheduler,
    MomentumELFScheduler,
    MomentumLangFlowScheduler,
    MultistepELFScheduler,
    MultistepLangFlowScheduler,
    RunContext,
    SamplerStatistics,
    TakesRunContext,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
)
from untied_sc.schedulers.flowmap_statistics import FlowMapStatistics
from untied_sc.schedulers.scheduling_flowmap import UntiedFlowMapLMScheduler

from .test_scheduler_config import diffusers_warnings


BATCH, LENGTH, WIDTH, RANK = 2, 5, 6, 3
STEPS = 6
PROPOSAL = [4.5, 0.9, 1e-5]  # (loc, scale, cutoff) of a LangFlow model's Gumbel proposal
UNTIED = {"eta_r": 1.5, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.8}


@dataclass(frozen=True)
class Case:
    """A scheduler under test: its class, a config with every method switched on, and the inputs it needs."""

    cls: type
    config: dict = field(default_factory=dict)

    @property
    def family(self) -> str:
        return self.cls.family

    @property
    def untied(self) -> bool:
        return issubclass(self.cls, UntiedELFScheduler | UntiedLangFlowScheduler)

    @property
    def ace(self) -> bool:
        return "ace_strength" in inspect.signature(self.cls.__init__).parameters

    def build(self, **overrides):
        family = {"proposal": PROPOSAL} if self.family == "langflow" else {}
        return self.cls(**{**family, **self.config, **overrides})

    def inputs(self, seed: int = 0) -> dict:
        """What a pipeline hands `set_timesteps` besides N (LangFlow's proposal comes from the config)."""
        kwargs = {}
        if self.family == "elf":
            kwargs["generator"] = torch.Generator().manual_seed(seed)
        if self.untied:
            kwargs["statistics"] = STATISTICS[self.family]
        if self.ace:
            kwargs["ace_statistics"] = ACE[self.family]
        return kwargs


def _statistics(solver: str) -> SamplerStatistics:
    """Q (WIDTH × RANK), ρ², random μ, σ (σ_0 = 0), δ̄ for STEPS."""
    g = torch.Generator().manual_seed(1)
    updates = STEPS if solver == "elf" else STEPS - 1
    rms = 0.1 + torch.rand(updates, generator=g)
    rms[0] = 0.0
    statistics = SamplerStatistics(
        solver=solver, latent_dim=WIDTH, rank=RANK, calibrated_steps=[STEPS], model_fingerprint="toy"
    )
    statistics.basis = torch.linalg.qr(torch.randn(WIDTH, RANK, generator=g)).Q
    statistics.rho_sq = torch.sort(torch.rand(RANK, generator=g, dtype=torch.float64) * 0.9, descending=True).values
    statistics.base_scales = torch.tensor((0.8, 0.9), dtype=torch.float64)
    setattr(statistics, f"mean_nfe{STEPS}", 0.05 * torch.randn(updates, WIDTH, generator=g))
    setattr(statistics, f"rms_nfe{STEPS}", rms)
    setattr(statistics, f"cosine_distance_nfe{STEPS}", 0.1 + 0.8 * torch.rand(updates, generator=g))
    return statistics


def _ace(family: str) -> ACEStatistics:
    statistics = ACEStatistics(solver=family, latent_dim=WIDTH)
    statistics.direction.copy_(torch.nn.functional.normalize(torch.arange(1.0, WIDTH + 1), dim=0))
    return statistics


STATISTICS = {family: _statistics(family) for family in ("elf", "langflow")}
ACE = {family: _ace(family) for family in ("elf", "langflow")}
CASES = {
    case.cls.__name__: case
    for case in (
        Case(ELFScheduler, {"p_mean": -1.0, "sde_gamma_by_steps": {"6": 1.5}}),
        Case(LangFlowScheduler, {"quantile_eps": 1e-4}),
        Case(UntiedELFScheduler, UNTIED),
        Case(UntiedLangFlowScheduler, UNTIED),
        Case(MomentumELFScheduler, {"momentum_beta": 0.7}),
        Case(MomentumLangFlowScheduler, {"momentum_beta": 0.7}),
        Case(HiGSELFScheduler, {"higs_t_min": 0.05}),
        Case(HiGSLangFlowScheduler, {"higs_t_min": 0.05}),
        Case(ACEELFScheduler, {"ace_strength": 1.0}),
        Case(ACELangFlowScheduler, {"ace_strength": 1.0}),
        Case(HiGSACEELFScheduler, {"higs_t_min": 0.05, "ace_strength": 1.0}),
        Case(HiGSACELangFlowScheduler, {"higs_t_min": 0.05, "ace_strength": 1.0}),
        Case(MultistepELFScheduler),
        Case(MultistepLangFlowScheduler),
    )
}
OFFICIAL = ("ELFScheduler", "LangFlowScheduler")
every_scheduler = pytest.mark.parametrize("name", list(CASES))


def _latents(dtype=torch.float32) -> torch.Tensor:
    return torch.randn(BATCH, LENGTH, WIDTH, generator=torch.Generator().manual_seed(7)).to(dtype)


def _model(z: torch.Tensor, t: torch.Tensor, self_conditioning: torch.Tensor | None) -> torch.Tensor:
    """A deterministic stand-in network whose prediction depends on the time and the self-conditioning input."""
    m = torch.zeros_like(z) if self_conditioning is None else self_conditioning
    return torch.tanh(z + 0.5 * m) + 0.1 * t.to(z.dtype) * torch.cos(z)


def _sample(scheduler, case: Case, latents: torch.Tensor, seed: int = 0, begin: int = 0, model=_model):
    """The diffusers loop: set_timesteps, then per step scale_model_input → network → step; the final latents."""
    scheduler.set_timesteps(STEPS, **case.inputs(seed))
    if begin:
        scheduler.set_begin_index(begin)
    for t in scheduler.timesteps[begin:]:
        prediction = model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
    return latents


def _public(config) -> dict:
    return {key: value for key, value in config.items() if not key.startswith("_")}


# ---- configuration: save/load, from_config, compatibles -----------------------------------------------------------


@every_scheduler
def test_save_pretrained_round_trip(name, tmp_path):
    case = CASES[name]
    scheduler = case.build()
    scheduler.save_pretrained(tmp_path)
    with diffusers_warnings() as logged:
        loaded = case.cls.from_pretrained(tmp_path)
    assert not logged, [record.getMessage() for record in logged]
    expected = dict(scheduler.config)
    expected.pop("_use_default_values", None)  # not saved, as in diffusers
    assert dict(loaded.config) == expected
    assert all(loaded.config[key] == value for key, value in case.config.items())
    saved = json.loads((tmp_path / "scheduler_config.json").read_text())
    assert saved["_class_name"] == name
    assert torch.equal(_sample(loaded, case, _latents()), _sample(scheduler, case, _latents()))


@every_scheduler
def test_from_config_round_trip(name):
    case = CASES[name]
    scheduler = case.build()
    rebuilt = case.cls.from_config(scheduler.config)
    assert dict(rebuilt.config) == dict(scheduler.config)
    assert torch.equal(_sample(rebuilt, case, _latents()), _sample(scheduler, case, _latents()))
    override = {"p_std": 0.5} if case.family == "elf" else {"quantile_eps": 1e-3}
    overridden = case.cls.from_config(scheduler.config, **override)
    assert all(overridden.config[key] == value for key, value in override.items())
    assert _public(overridden.config) == {**_public(scheduler.config), **override}


@every_scheduler
def test_compatibles_are_stable_and_mutually_loadable(name):
    case = CASES[name]
    scheduler = case.build()
    compatibles = scheduler.compatibles
    assert compatibles == scheduler.compatibles == case.build().compatibles  # one order, every call
    assert all(c is not None for c in compatibles) and case.cls in compatibles
    assert {c.family for c in compatibles} == {case.family} and len(compatibles) == 7
    init_keys = set(inspect.signature(case.cls.__init__).parameters)
    for compatible_cls in compatibles:
        with diffusers_warnings() as logged:
            compatible = compatible_cls.from_config(scheduler.config)
            back = case.cls.from_config(compatible.config)
        assert not logged, (compatible_cls.__name__, [record.getMessage() for record in logged])
        assert type(compatible) is compatible_cls and type(back) is case.cls
        # diffusers' rule: the round trip keeps every key, and adds only keys its class does not take
        assert {k: v for k, v in back.config.items() if k in scheduler.config} == dict(scheduler.config)
        assert not (set(back.config) - set(scheduler.config)) & init_keys


# ---- the step -------------------------------------------------------------------------------------------------------


@every_scheduler
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_step_outputs_keep_shape_and_dtype(name, dtype):
    case = CASES[name]
    scheduler = case.build()
    scheduler.set_timesteps(STEPS, **case.inputs())
    latents = _latents(dtype)
    for t in scheduler.timesteps:
        prediction = _model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
        out = scheduler.step(prediction, t, latents)
        for value in (out.prev_sample, out.pred_original_sample, out.self_conditioning):
            assert value.shape == latents.shape and value.dtype == dtype
        latents = out.prev_sample
    assert torch.isfinite(latents).all()


@every_scheduler
def test_tuple_and_dict_outputs_are_equal(name):
    case = CASES[name]
    outputs = []
    for return_dict in (True, False):
        scheduler = case.build()
        scheduler.set_timesteps(STEPS, **case.inputs())
        latents = _latents()
        for t in scheduler.timesteps[:3]:  # past the first step, so that the history methods act
            prediction = _model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
            out = scheduler.step(prediction, t, latents, return_dict=return_dict)
            latents = out[0]
        outputs.append(out)
    as_dict, as_tuple = outputs
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 3
    for value, named in zip(as_tuple, as_dict.values(), strict=True):
        assert torch.equal(value, named)


@every_scheduler
def test_step_checks_its_timestep(name):
    case = CASES[name]
    scheduler = case.build()
    scheduler.set_timesteps(STEPS, **case.inputs())
    latents = _latents()
    t0, t1 = scheduler.timesteps[0], scheduler.timesteps[1]
    prediction = _model(scheduler.scale_model_input(latents, t0), t0, None)
    with pytest.raises(ValueError, match=r"current step \(0\) is at timesteps\[0\].*set_begin_index"):
        scheduler.step(prediction, t1, latents)
    with pytest.raises(ValueError, match=r"got timestep 0.5"):
        scheduler.step(prediction, 0.5, latents)
    assert scheduler.step_index == 0  # a refused step changes nothing
    expected = case.build()
    expected.set_timesteps(STEPS, **case.inputs())
    expected.scale_model_input(latents, t0)
    reference = expected.step(prediction, t0, latents).prev_sample
    # the schedule's value as a number, or as a tensor of its own, is the same timestep
    assert torch.equal(scheduler.step(prediction, float(t0), latents).prev_sample, reference)
    scheduler.scale_model_input(latents, t1)
    scheduler.step(_model(latents, t1, scheduler.self_conditioning), t1.clone(), latents)
    for t in scheduler.timesteps[2:]:
        scheduler.scale_model_input(latents, t)
        scheduler.step(_model(latents, t, scheduler.self_conditioning), t, latents)
    with pytest.raises(RuntimeError, match="set_timesteps"):
        scheduler.step(prediction, scheduler.timesteps[-1], latents)


# ---- the diffusers interface --------------------------------------------------------------------------------------


@every_scheduler
def test_public_api(name):
    case = CASES[name]
    scheduler = case.build()
    for attribute in (
        "init_noise_sigma",
        "scale_model_input",
        "step",
        "set_timesteps",
        "add_noise",
        "set_begin_index",
    ):
        assert hasattr(scheduler, attribute), attribute
    assert scheduler.order == 1
    assert scheduler.timesteps is None and len(scheduler) == 0
    assert scheduler.step_index == 0 and scheduler.begin_index == 0
    scheduler.set_timesteps(STEPS, **case.inputs())
    assert len(scheduler) == STEPS and scheduler.timesteps.shape == (STEPS * scheduler.order,)


@every_scheduler
def test_scale_model_input_before_set_timesteps_is_the_identity(name):
    scheduler = CASES[name].build()
    sample = _latents()
    for timestep in (0, 0.0, torch.tensor(0.5)):
        assert torch.equal(scheduler.scale_model_input(sample, timestep), sample)


@every_scheduler
def test_init_noise_sigma_is_the_family_noise_scale(name):
    case = CASES[name]
    if case.family == "elf":
        assert case.build().init_noise_sigma == 2.0
        assert case.build(noise_scale=1.5).init_noise_sigma == 1.5
    else:
        assert case.build().init_noise_sigma == 1.0  # variance preserving: z_0 ~ N(0, I)


@every_scheduler
def test_getattr_is_correct(name):
    scheduler = CASES[name].build()
    scheduler.dummy_attribute = 5
    scheduler.register_to_config(test_attribute=5)
    with diffusers_warnings() as logged, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert scheduler.dummy_attribute == 5 and vars(scheduler)["dummy_attribute"] == 5
        assert callable(scheduler.save_pretrained)
    assert not logged
    with pytest.warns(FutureWarning):
        assert scheduler.test_attribute == 5
    with pytest.raises(AttributeError) as error:
        scheduler.does_not_exist  # noqa: B018
    assert str(error.value) == f"'{name}' object has no attribute 'does_not_exist'"


@every_scheduler
def test_deprecated_kwargs(name):
    cls = CASES[name].cls
    assert "kwargs" not in inspect.signature(cls.__init__).parameters
    assert not cls._deprecated_kwargs


# ---- set_timesteps ----------------------------------------------------------------------------------------------------


@every_scheduler
def test_bare_set_timesteps(name):
    """`set_timesteps(N)` alone; what is not config (statistics, ACE's direction) is asked for by name."""
    case = CASES[name]
    scheduler = case.build(**({"eta_t": 0.0, "eta_r": 0.0} if case.untied else {}))
    if case.ace:
        with pytest.raises(ValueError, match="ace_statistics"):
            scheduler.set_timesteps(STEPS)
        scheduler.ace_statistics = ACE[case.family]  # held for later runs
    scheduler.set_timesteps(STEPS)
    assert scheduler.timesteps.shape == (STEPS,) and torch.isfinite(scheduler.timesteps).all()
    latents = _latents()
    for t in scheduler.timesteps:
        prediction = _model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
    assert torch.isfinite(latents).all() and scheduler.step_index == STEPS
    if case.untied:
        with pytest.raises(ValueError, match="SamplerStatistics"):
            case.build().set_timesteps(STEPS)


@every_scheduler
def test_the_run_context_stands_for_the_keyword_arguments(name):
    """A pipeline hands `set_timesteps(N, device=..., context=RunContext(...))`: the same run as the keywords."""
    case = CASES[name]
    scheduler = case.build()
    assert isinstance(scheduler, TakesRunContext)
    assert inspect.signature(scheduler.set_timesteps).parameters["context"].kind is inspect.Parameter.KEYWORD_ONLY
    by_keywords = _sample(case.build(), case, _latents(), seed=3)
    scheduler.set_timesteps(STEPS, context=RunContext(**case.inputs(3)))
    latents = _latents()
    for t in scheduler.timesteps:
        prediction = _model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
    assert torch.equal(latents, by_keywords)


@every_scheduler
def test_a_keyword_wins_over_the_run_context(name):
    case = CASES[name]
    inputs = case.inputs(3)
    if case.family == "elf":
        context = RunContext(**{**inputs, "generator": torch.Generator().manual_seed(99)})
    else:
        context = RunContext(**inputs, proposal=(5.0, 1.0, 1e-5))
        inputs["proposal"] = tuple(PROPOSAL)
    reference, scheduler = case.build(), case.build()
    reference.set_timesteps(STEPS, **inputs)
    scheduler.set_timesteps(STEPS, context=context, **inputs)
    assert torch.equal(scheduler.timesteps, reference.timesteps)


@every_scheduler
def test_statistics_in_a_run_context_are_checked_against_its_model(name, tiny_langflow):
    """The statistics of a context are checked against its `model` by the schedulers that take them; the others
    ignore them (a pipeline may hold statistics that its official scheduler does not use)."""
    case = CASES[name]
    context = RunContext(**case.inputs(), model=tiny_langflow)  # the toy statistics belong to no real model
    if case.untied or case.ace:
        with pytest.raises(ValueError, match="belong"):
            case.build().set_timesteps(STEPS, context=context)
    else:
        case.build().set_timesteps(STEPS, context=replace(context, statistics=STATISTICS[case.family]))


@pytest.mark.parametrize("name", [name for name, case in CASES.items() if case.family == "langflow"])
def test_langflow_proposal_comes_from_the_config_unless_given(name):
    case = CASES[name]
    kwargs = case.inputs()  # statistics, ACE's direction: no proposal
    scheduler = case.build()
    scheduler.set_timesteps(STEPS, **kwargs)
    from_config = scheduler.timesteps
    scheduler.set_timesteps(STEPS, proposal=tuple(PROPOSAL), **kwargs)
    assert torch.equal(scheduler.timesteps, from_config)
    scheduler.set_timesteps(STEPS, proposal=(5.0, 1.0, 1e-5), **kwargs)
    assert not torch.equal(scheduler.timesteps, from_config)
    with pytest.raises(ValueError, match=r"config \(`proposal`: \[loc, scale, cutoff\]"):
        case.cls(**case.config).set_timesteps(STEPS, **kwargs)
    for bad in ([4.5, 0.9], [4.5, -1.0, 1e-5], [4.5, 0.9, 1.0], "4.5"):
        with pytest.raises(ValueError, match="Gumbel proposal"):
            case.build(proposal=bad)


def test_a_scheduler_declares_whether_its_step_takes_guidance():
    """`takes_guidance`, which the conditional pipeline reads, is what each scheduler's `step` takes."""
    import untied_sc.schedulers as package

    classes = [
        cls
        for name in dir(package)
        if isinstance(cls := getattr(package, name), type) and name.endswith("Scheduler") and hasattr(cls, "step")
    ]
    classes.append(UntiedFlowMapLMScheduler)
    assert {ELFScheduler, UntiedELFScheduler, MomentumELFScheduler, CDEQScheduler} <= set(classes)
    for cls in classes:
        assert getattr(cls, "takes_guidance", False) is ("guidance" in inspect.signature(cls.step).parameters), cls


def _flowmap_statistics() -> FlowMapStatistics:
    """Toy statistics of the untied flow-map sampler (Q, ρ², δ̄ for STEPS), for no model in particular."""
    g = torch.Generator().manual_seed(2)
    statistics = FlowMapStatistics(latent_dim=WIDTH, rank=RANK, calibrated_steps=[STEPS])
    with torch.no_grad():
        statistics.basis.copy_(torch.linalg.qr(torch.randn(WIDTH, RANK, generator=g)).Q)
        rho_sq = torch.sort(torch.rand(RANK, generator=g, dtype=torch.float64) * 0.9, descending=True).values
        statistics.rho_sq.copy_(rho_sq)
        getattr(statistics, f"cosine_distance_nfe{STEPS}").copy_(0.1 + 0.8 * torch.rand(STEPS, generator=g))
    return statistics


FLOWMAP_STATISTICS = _flowmap_statistics()

# The flow-map schedulers (their own loop: the network's times are `prediction_timesteps`, cdeq's `model_timestep`),
# whether a run draws from its generator, and the run's other inputs (the untied sampler's statistics at η_R > 0).
FLOWMAP_CASES = {
    "ctm": (lambda: FlowMapLMScheduler(gamma=0.75, self_conditioning="chained"), True, {}),
    "flow_map": (lambda: FlowMapLMScheduler(sampler="flow_map"), False, {}),
    "cdeq": (CDEQScheduler, True, {}),
    "untied-ctm": (
        lambda: UntiedFlowMapLMScheduler(gamma=0.75, self_conditioning="chained", eta_r=1.5),
        True,
        {"flowmap_statistics": FLOWMAP_STATISTICS},
    ),
}


def _flowmap_sample(scheduler, step_generator=None, **inputs) -> torch.Tensor:
    """The flow-map pipeline's loop on `_model`: `set_timesteps(STEPS, **inputs)`, then per step its network call(s)
    and `step` (given `step_generator`, ctm's own keyword, where there is one); the final latents."""
    scheduler.set_timesteps(STEPS, **inputs)
    latents = _latents()
    for k, t in enumerate(scheduler.timesteps):
        if isinstance(scheduler, CDEQScheduler):
            model_input = scheduler.scale_model_input(latents, t)
            prediction = _model(model_input, torch.tensor(scheduler.model_timestep()), None)
            latents = scheduler.step(prediction, t, latents).prev_sample
            continue
        if scheduler.needs_prepass:
            scheduler.set_prepass(_model(latents, t, None))
        target = torch.tensor(scheduler.prediction_timesteps[k])
        prediction = _model(latents, target, scheduler.self_conditioning_input(latents))
        kwargs = {} if step_generator is None else {"generator": step_generator}
        latents = scheduler.step(prediction, t, latents, **kwargs).prev_sample
    return latents


@pytest.mark.parametrize("name", list(FLOWMAP_CASES))
def test_the_run_context_stands_for_the_keyword_arguments_of_a_flowmap_scheduler(name):
    """The flow-map pipeline hands `set_timesteps(N, device=..., context=RunContext(...))`: the same run as the
    generator given as a keyword (to `set_timesteps`, or to ctm's `step`)."""
    build, draws, inputs = FLOWMAP_CASES[name]
    scheduler = build()
    assert isinstance(scheduler, TakesRunContext)
    assert inspect.signature(scheduler.set_timesteps).parameters["context"].kind is inspect.Parameter.KEYWORD_ONLY
    by_keywords = _flowmap_sample(build(), generator=torch.Generator().manual_seed(3), **inputs)
    by_context = _flowmap_sample(scheduler, context=RunContext(generator=torch.Generator().manual_seed(3), **inputs))
    assert torch.equal(by_context, by_keywords)
    if not isinstance(scheduler, CDEQScheduler):
        by_step = _flowmap_sample(build(), step_generator=torch.Generator().manual_seed(3), **inputs)
        assert torch.equal(by_step, by_keywords)
    other_seed = _flowmap_sample(build(), context=RunContext(generator=torch.Generator().manual_seed(4), **inputs))
    assert torch.equal(other_seed, by_keywords) is not draws  # the generator is the one the run draws from


@pytest.mark.parametrize("name", [name for name, (_, draws, _) in FLOWMAP_CASES.items() if draws])
def test_a_keyword_wins_over_the_run_context_of_a_flowmap_scheduler(name):
    build, _, inputs = FLOWMAP_CASES[name]
    reference = _flowmap_sample(build(), generator=torch.Generator().manual_seed(3), **inputs)
    context = RunContext(generator=torch.Generator().manual_seed(99), **inputs)
    assert torch.equal(
        _flowmap_sample(build(), generator=torch.Generator().manual_seed(3), context=context), reference
    )


def test_bare_elf_set_timesteps_draws_from_torchs_global_generator():
    # As diffusers' `generator=None`: torch's global generator, so the global seed fixes the grid. The grid is drawn
    # from a copy of it (the official CPU stream), exactly as from a generator in the same state.
    torch.manual_seed(0)
    scheduler = ELFScheduler()
    scheduler.set_timesteps(STEPS)
    first = scheduler.timesteps
    explicit = ELFScheduler()
    explicit.set_timesteps(STEPS, generator=torch.Generator().manual_seed(0))
    assert torch.equal(first, explicit.timesteps)
    torch.manual_seed(1)
    scheduler.set_timesteps(STEPS)
    assert not torch.equal(first, scheduler.timesteps)
    torch.manual_seed(0)
    fresh = ELFScheduler()
    fresh.set_timesteps(STEPS)
    assert torch.equal(first, fresh.timesteps)
    torch.manual_seed(0)
    before = torch.get_rng_state()
    seeded = [ELFScheduler() for _ in range(2)]
    for s in seeded:
        s.set_timesteps(STEPS, generator=torch.Generator().manual_seed(3))
    assert torch.equal(seeded[0].timesteps, seeded[1].timesteps)
    assert torch.equal(torch.get_rng_state(), before)  # a given generator leaves the global one alone
    torch.manual_seed(1)
    seeded[1].set_timesteps(STEPS, generator=torch.Generator().manual_seed(3))
    assert torch.equal(seeded[0].timesteps, seeded[1].timesteps)


# ---- set_begin_index ----------------------------------------------------------------------------------------------


@every_scheduler
def test_set_begin_index_runs_the_tail_of_the_schedule(name):
    case = CASES[name]
    scheduler = case.build()
    with pytest.raises(RuntimeError, match="set_timesteps"):
        scheduler.set_begin_index(2)
    scheduler.set_timesteps(STEPS, **case.inputs())
    for bad in (-1, STEPS, 1.0):
        with pytest.raises(ValueError, match="begin_index"):
            scheduler.set_begin_index(bad)
    scheduler.set_begin_index(3)
    scheduler.set_begin_index(2)  # may change its mind before the first step
    assert scheduler.begin_index == scheduler.step_index == 2
    latents = _latents()
    with pytest.raises(ValueError, match=r"timesteps\[2\]"):
        scheduler.scale_model_input(latents, scheduler.timesteps[0])
        scheduler.step(latents, scheduler.timesteps[0], latents)
    for t in scheduler.timesteps[2:]:
        prediction = _model(scheduler.scale_model_input(latents, t), t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
        with pytest.raises(RuntimeError, match="before the run's first"):
            scheduler.set_begin_index(0)
    assert scheduler.step_index == STEPS and torch.isfinite(latents).all()
    scheduler.set_timesteps(STEPS, **case.inputs())
    assert scheduler.begin_index == scheduler.step_index == 0  # set_timesteps starts a run from the beginning


def _ignores_self_conditioning(z, t, self_conditioning):
    return _model(z, t, None)


@pytest.mark.parametrize("begin", [1, 3])
def test_langflow_begun_run_is_the_tail_of_the_full_run(begin):
    """LangFlow is deterministic: from the full run's z_i, the run begun at i ends where the full run ends."""
    case = CASES["LangFlowScheduler"]
    full, latents, trajectory = case.build(), _latents(), []
    full.set_timesteps(STEPS)
    for t in full.timesteps:
        trajectory.append(latents)
        latents = full.step(_ignores_self_conditioning(latents, t, None), t, latents).prev_sample
    tail = _sample(case.build(), case, trajectory[begin], begin=begin, model=_ignores_self_conditioning)
    assert torch.equal(tail, latents)


@pytest.mark.parametrize("begin", [1, 3])
def test_elf_begun_run_takes_the_stream_from_where_it_stands(begin):
    """
    ELF's run begun at i draws its SDE noise from the generator as it stands: given the generator the full run had
    at step i (past z_0 and ε_0..ε_{i−1}) and its z_i, it ends where the full run ends.
    """
    case, shape = CASES["ELFScheduler"], (BATCH, LENGTH, WIDTH)
    full, generator, trajectory = case.build(), torch.Generator().manual_seed(5), []
    full.set_timesteps(STEPS, generator=generator)
    latents = torch.randn(shape, generator=generator) * full.init_noise_sigma
    for t in full.timesteps:
        trajectory.append(latents)
        prediction = _ignores_self_conditioning(full.scale_model_input(latents, t), t, None)
        latents = full.step(prediction, t, latents).prev_sample
    begun, generator = case.build(), torch.Generator().manual_seed(5)
    begun.set_timesteps(STEPS, generator=generator)  # the same grid (drawn from a copy of the generator)
    begun.set_begin_index(begin)
    for _ in range(1 + begin):  # z_0 and ε_0..ε_{begin−1}, as the full run drew them
        torch.randn(shape, generator=generator)
    tail = trajectory[begin]
    for t in begun.timesteps[begin:]:
        prediction = _ignores_self_conditioning(begun.scale_model_input(tail, t), t, None)
        tail = begun.step(prediction, t, tail).prev_sample
    assert torch.equal(tail, latents)


@pytest.mark.parametrize("name", [name for name in CASES if name not in OFFICIAL])
def test_a_wrapping_scheduler_begins_where_its_official_base_begins(name):
    """At zero strength a wrapping scheduler is its official sampler: begun at i too, bit for bit."""
    case = CASES[name]
    zero = {"eta_r": 0.0, "eta_t": 0.0, "momentum_beta": 1.0, "higs_weight": 0.0, "ace_strength": 0.0}
    zero["multistep_strength"] = 0.0
    accepted = inspect.signature(case.cls.__init__).parameters
    wrapped = case.build(**{key: value for key, value in zero.items() if key in accepted})
    official = CASES[OFFICIAL[case.family == "langflow"]]
    expected = _sample(official.cls.from_config(wrapped.config), official, _latents(), seed=2, begin=2)
    assert torch.equal(_sample(wrapped, case, _latents(), seed=2, begin=2), expected)


# ---- add_noise --------------------------------------------------------------------------------------------------------


def _reference_noising(family: str, x: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """The families' noising written out per sample: ELF z = t·x + 2(1 − t)·ε; LangFlow z = α x + σ ε, α² + σ² = 1."""
    rows = []
    for b in range(x.shape[0]):
        time = float(t[b]) if t.ndim else float(t)
        if family == "elf":
            rows.append(time * x[b] + 2.0 * (1.0 - time) * noise[b])
        else:
            alpha_sq = 1.0 / (1.0 + math.exp(time))  # sigmoid(−γ)
            rows.append(math.sqrt(alpha_sq) * x[b] + math.sqrt(1.0 - alpha_sq) * noise[b])
    return torch.stack(rows)


@every_scheduler
def test_add_noise_is_the_family_noising(name):
    case = CASES[name]
    scheduler = case.build(**({"noise_scale": 2.0} if case.family == "elf" else {}))
    scheduler.set_timesteps(STEPS, **case.inputs())
    x, noise = _latents(), torch.randn(BATCH, LENGTH, WIDTH, generator=torch.Generator().manual_seed(2))
    times = scheduler.timesteps[[1, 4]]
    for t in (times, scheduler.timesteps[3], scheduler.timesteps[3][None]):  # per sample, one, one as (1,)
        noised = scheduler.add_noise(x, noise, t)
        assert noised.shape == x.shape and noised.device == x.device
        expected = _reference_noising(case.family, x, noise, t.expand(BATCH) if t.numel() == 1 else t)
        torch.testing.assert_close(noised, expected, rtol=1e-6, atol=1e-6)
    by_number, by_tensor = scheduler.add_noise(x, noise, float(times[0])), scheduler.add_noise(x, noise, times[0])
    torch.testing.assert_close(by_number, by_tensor, rtol=1e-6, atol=1e-6)


def test_add_noise_ends_on_the_data_and_the_noise():
    elf, langflow = ELFScheduler(noise_scale=1.5), LangFlowScheduler()
    x, noise = _latents(), torch.randn(BATCH, LENGTH, WIDTH, generator=torch.Generator().manual_seed(2))
    assert torch.equal(elf.add_noise(x, noise, 1.0), x)  # t = 1: data
    assert torch.equal(elf.add_noise(x, noise, torch.zeros(BATCH)), 1.5 * noise)  # t = 0: noise_scale·ε
    assert (langflow.add_noise(x, noise, 40.0) - noise).abs().max() < 1e-8  # γ → ∞: the noise
    assert (langflow.add_noise(x, noise, -40.0) - x).abs().max() < 1e-8  # γ → −∞: the data


def test_training_noises_with_add_noise(monkeypatch):
    """The objectives form their noisy latents with the schedulers' `add_noise` (one copy of each formula)."""
    from untied_sc_lab.training import elf as elf_training
    from untied_sc_lab.training import langflow as langflow_training

    calls = []
    for cls in (ELFScheduler, LangFlowScheduler):
        add_noise = cls.add_noise

        def recording(self, *args, add_noise=add_noise):
            calls.append(type(self).__name__)
            return add_noise(self, *args)

        monkeypatch.setattr(cls, "add_noise", recording)
    x, noise = _latents(), torch.randn(BATCH, LENGTH, WIDTH, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([0.3, 0.8])
    got = elf_training.noisy_latents(x, t, noise, 1.5)
    assert calls == ["ELFScheduler"]
    assert torch.equal(got, t[:, None, None] * x + (1 - t[:, None, None]) * 1.5 * noise)  # the objective's formula

    class Embedding:
        def embed(self, ids):
            return x[ids]

    ids, gamma = torch.tensor([1, 0]), torch.tensor([2.0, 6.0])
    got = langflow_training.noisy_latents(Embedding(), ids, gamma, noise)
    assert calls == ["ELFScheduler", "LangFlowScheduler"]
    alpha, sigma = torch.sigmoid(-gamma).sqrt()[:, None, None], torch.sigmoid(gamma).sqrt()[:, None, None]
    assert torch.equal(got, alpha * x[ids] + sigma * noise)


def test_bundled_langflow_scheduler_holds_its_model_proposal():
    """The bundled LangFlow folder's scheduler config carries its model's proposal: a bare `set_timesteps(N)` samples
    on the grid the pipeline uses (which passes the model's own proposal)."""
    from pathlib import Path

    from untied_sc.models import LangFlowTransformerModel

    folder = Path(__file__).resolve().parents[1] / "hub_artifacts" / "langflow-small"
    scheduler = LangFlowScheduler.from_pretrained(folder / "scheduler")
    transformer = LangFlowTransformerModel.from_pretrained(folder / "transformer")
    assert tuple(scheduler.config.proposal) == transformer.gumbel_parameters()
    scheduler.set_timesteps(8)
    bare = scheduler.timesteps
    scheduler.set_timesteps(8, proposal=transformer.gumbel_parameters())
    assert torch.equal(bare, scheduler.timesteps)
