"""The untied schedulers (ELF, LangFlow): the official invariant, Algorithm 1's routing, statistics and errors.

Their config (round trips, swaps, the factory, where a coefficient comes from) is tested in test_scheduler_config.py.
"""

import pytest
import torch

from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    LangFlowPipeline,
    LangFlowScheduler,
    SamplerStatistics,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    UntiedSelfConditioningScheduler,
)
from untied_sc.schedulers import (
    history_direction,
    masked_token_mean,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)
from untied_sc_lab.ablations import (
    AblationUntiedELFScheduler,
    AblationUntiedLangFlowScheduler,
    ablation_scheduler_class,
    needs_ablation_scheduler,
)

from .conftest import Golden, elf_from_golden, golden_call, langflow_from_golden, replay_official_network
from .tiny import random_statistics, tiny_tokenizer


def _pipeline(family: str, nfe_file: int, statistics: bool = True, **untied):
    golden = Golden(f"{family}_sample_nfe{nfe_file}.safetensors")
    if family == "elf":
        model = elf_from_golden(golden)
        pipe = ELFPipeline(model, ELFScheduler(), tiny_tokenizer())
    else:
        model = langflow_from_golden(golden)
        pipe = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer())
    if statistics:
        pipe.register_modules(sampler_statistics=random_statistics(model, family, steps=(8, 32, 64)))
    if untied:  # an ablation switch: the lab's scheduler
        cls = ablation_scheduler_class(family) if needs_ablation_scheduler(untied) else UntiedSelfConditioningScheduler
        pipe.scheduler = cls.from_config(pipe.scheduler.config, **untied)
    pipe.set_progress_bar_config(disable=True)
    return pipe, golden


def _run(pipe, nfe, seed=42, batch_size=3):
    trajectory = []

    def record(pipe, step, timestep, tensors):
        trajectory.append(tensors["latents"].clone())
        return {}

    output = pipe(
        batch_size=batch_size,
        num_inference_steps=nfe,
        generator=torch.Generator().manual_seed(seed),
        output_type="seq",
        callback_on_step_end=record,
    )
    return output, torch.stack(trajectory)


ZERO = {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 1.5, "alpha": 0.7}


@pytest.mark.parametrize("family", ["elf", "langflow"])
@pytest.mark.parametrize("nfe", [8, 32])
def test_zero_strength_reproduces_the_official_trajectory_bit_for_bit(family, nfe):
    official, _ = _pipeline(family, 8, statistics=False)
    untied, _ = _pipeline(family, 8, **ZERO)  # statistics present: only the strengths are zero
    expected, expected_trajectory = _run(official, nfe)
    got, trajectory = _run(untied, nfe)
    assert torch.equal(trajectory, expected_trajectory)
    assert torch.equal(got.latents, expected.latents) and torch.equal(got.sequences, expected.sequences)


@pytest.mark.parametrize("family,nfe", [("elf", 8), ("elf", 32), ("langflow", 8), ("langflow", 64)])
def test_zero_strength_matches_the_official_golden_generation(family, nfe, monkeypatch):
    pipe, golden = _pipeline(family, nfe, **ZERO)
    replay_official_network(pipe, golden, monkeypatch)  # the sampler alone, bit for bit on any CPU (see conftest)
    output = pipe(**golden_call(golden), output_type="seq")
    rows = golden.outputs["trajectory_rows"]
    assert torch.equal(output.latents, golden.outputs["latents"][rows])
    assert torch.equal(output.sequences, golden.outputs["tokens"][rows])


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_untied_sampling_changes_the_trajectory_and_stays_finite(family):
    official, _ = _pipeline(family, 8, statistics=False)
    untied, _ = _pipeline(family, 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    expected, expected_trajectory = _run(official, 8)
    got, trajectory = _run(untied, 8)
    assert torch.isfinite(trajectory).all()
    # Step 0 has no history (E = O = 0 and σ_0 = 0 in these statistics): it matches; later steps differ.
    assert torch.equal(trajectory[0], expected_trajectory[0])
    assert not torch.allclose(trajectory[-1], expected_trajectory[-1])


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_one_network_evaluation_per_step(family):
    pipe, _ = _pipeline(family, 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    calls = []
    pipe.transformer.register_forward_hook(lambda *args: calls.append(1))
    _run(pipe, 8)
    assert len(calls) == 8 + (1 if family == "elf" else 0)  # ELF's decode pass is not an NFE


def _step_by_step(scheduler, model_fn, steps, latents, **set_kwargs):
    scheduler.set_timesteps(steps, **set_kwargs)
    records = []
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        sc = scheduler.self_conditioning
        prediction = model_fn(model_input, t, sc)
        out = scheduler.step(prediction, t, latents)
        records.append((prediction, sc, out))
        latents = out.prev_sample
    return records


@pytest.mark.parametrize("routing", ["solver", "self_conditioning", "both"])
def test_correction_routing(routing):
    pipe, _ = _pipeline("langflow", 8)
    model, statistics = pipe.transformer, pipe.sampler_statistics
    scheduler = AblationUntiedLangFlowScheduler(eta_r=0.0, eta_t=1.5, eta_o=1.0, alpha=0.8, correction_routing=routing)

    def model_fn(z, t, sc):
        return model.clean_prediction(model(z, t, sc).logits)

    latents = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(0))
    records = _step_by_step(scheduler, model_fn, 8, latents, proposal=model.gumbel_parameters(), statistics=statistics)
    corrected_steps = 0
    for k, (prediction, _, out) in enumerate(records[:-2]):
        next_sc = records[k + 1][1]
        solver_got_correction = not torch.equal(out.pred_original_sample, prediction)
        sc_got_correction = not torch.equal(next_sc, prediction)
        corrected_steps += solver_got_correction or sc_got_correction
        assert solver_got_correction == (routing != "self_conditioning") or statistics.rms_nfe8[k] == 0
        assert sc_got_correction == (routing != "solver") or statistics.rms_nfe8[k] == 0
    assert corrected_steps >= 4


def test_state_is_reset_by_set_timesteps():
    pipe, _ = _pipeline("elf", 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    first, _ = _run(pipe, 8, seed=1)
    second, _ = _run(pipe, 8, seed=1)
    assert torch.equal(first.latents, second.latents)
    assert pipe.scheduler.step_index == 8
    pipe.scheduler.set_timesteps(8, generator=torch.Generator(), statistics=pipe.sampler_statistics)
    assert pipe.scheduler.step_index == 0 and pipe.scheduler.ema is None and pipe.scheduler.self_conditioning is None


def test_save_and_reload_pipeline_with_statistics_gives_identical_untied_samples(tmp_path):
    pipe, _ = _pipeline("elf", 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    pipe.save_pretrained(tmp_path)
    assert (tmp_path / "sampler_statistics" / "diffusion_pytorch_model.safetensors").is_file()
    assert not any(p.suffix == ".safetensors" for p in (tmp_path / "scheduler").iterdir())
    reloaded = ELFPipeline.from_pretrained(tmp_path)
    reloaded.set_progress_bar_config(disable=True)
    assert isinstance(reloaded.sampler_statistics, SamplerStatistics)
    assert type(reloaded.scheduler) is UntiedELFScheduler
    assert torch.equal(_run(reloaded, 8)[0].latents, _run(pipe, 8)[0].latents)


def test_uncalibrated_nfe_names_the_calibrated_ones_and_the_command():
    pipe, _ = _pipeline("elf", 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    with pytest.raises(
        ValueError, match=r"No sampler statistics for 16 steps \(calibrated: \[8, 32, 64\]\).*untied-sc calibrate"
    ):
        _run(pipe, 16)


def test_statistics_of_another_model_are_refused():
    pipe, _ = _pipeline("elf", 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8)
    with torch.no_grad():
        pipe.transformer.self_cond_proj.weight.mul_(1.01)
    with pytest.raises(ValueError, match="belong to another model"):
        _run(pipe, 8)
    langflow, _ = _pipeline("langflow", 8)
    with pytest.raises(ValueError, match="latent width 32, the model has 16"):
        langflow.sampler_statistics.check_model(pipe.transformer)
    untied = UntiedELFScheduler(coefficients="elf-b")
    with pytest.raises(ValueError, match="'langflow' solver"):
        untied.set_timesteps(8, generator=torch.Generator(), statistics=langflow.sampler_statistics)


@pytest.mark.parametrize("scheduler_cls", [UntiedELFScheduler, UntiedLangFlowScheduler])
def test_invalid_coefficients_and_options_are_refused(scheduler_cls):
    with pytest.raises(ValueError, match="eta_r must be ≥ 0"):
        scheduler_cls(eta_r=-1.0)
    with pytest.raises(ValueError, match="eta_o must be ≥ 0"):
        scheduler_cls(eta_o=-0.1)
    for alpha in (0.0, 1.5):
        with pytest.raises(ValueError, match=r"alpha must lie in \(0, 1\]"):
            scheduler_cls(alpha=alpha)
    with pytest.raises(ValueError, match=r"eta_t at 8 steps must be ≥ 0"):
        scheduler_cls(coefficients_by_steps={"8": {"eta_r": 1.0, "eta_t": -1.0, "eta_o": 1.0, "alpha": 0.5}})
    with pytest.raises(ValueError, match=r"coefficients_by_steps\['8'\] must give exactly"):
        scheduler_cls(coefficients_by_steps={8: {"eta_r": 1.0}})
    with pytest.raises(ValueError, match="Unknown coefficient preset"):
        scheduler_cls(coefficients="elf-xl")
    set_timesteps_kwargs = (
        {"generator": torch.Generator()} if scheduler_cls.family == "elf" else {"proposal": (4.7, 0.85, 1e-5)}
    )
    with pytest.raises(ValueError, match="needs the model's SamplerStatistics"):
        scheduler_cls(eta_r=1.0, eta_t=1.0, eta_o=1.0, alpha=0.5).set_timesteps(8, **set_timesteps_kwargs)


@pytest.mark.parametrize("scheduler_cls", [AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler])
def test_invalid_ablation_switches_are_refused(scheduler_cls):
    with pytest.raises(ValueError, match="correction_routing must be one of"):
        scheduler_cls(correction_routing="latent")
    with pytest.raises(ValueError, match="correction_direction must be one of"):
        scheduler_cls(correction_direction="orthogonal")
    with pytest.raises(ValueError, match="correction_direction must be one of"):
        scheduler_cls.from_config(scheduler_cls().config, correction_direction="History")
    for seed in (-1, 1.5, True):
        with pytest.raises(ValueError, match="direction_seed must be an integer ≥ 0"):
            scheduler_cls(direction_seed=seed)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_the_untied_scheduler_takes_no_ablation_switch_but_loads_them_at_the_paper_values(tmp_path, family):
    """A config saved with the switches at the paper's values loads (they stay in the config); others are refused."""
    untied = type(UntiedSelfConditioningScheduler(solver=family))
    ablation = ablation_scheduler_class(family)
    assert not {"correction_routing", "cosine_distance", "correction_direction"} & set(untied().config)
    ablation(eta_t=1.0).save_pretrained(tmp_path)  # all seven switches, at the paper's values
    saved = untied.load_config(tmp_path)
    assert saved["correction_direction"] == "history"
    loaded = untied.from_pretrained(tmp_path)
    assert type(loaded) is untied and loaded.config.eta_t == 1.0
    assert loaded.config.correction_routing == "solver"  # kept in the config, as a swap back needs it
    assert type(ablation.from_config(loaded.config)) is ablation
    with pytest.raises(ValueError, match=r"AblationUntied\w+Scheduler \(untied_sc_lab\.ablations.*correction_routing"):
        untied.from_config({**saved, "correction_routing": "both"})
    with pytest.raises(ValueError, match="cosine_distance"):
        untied.from_config(saved, cosine_distance="online")
    with pytest.raises(TypeError):
        untied(correction_routing="both")


@pytest.mark.parametrize(
    "options",
    [
        {"transform_assignment": "reversed"},
        {"transform_assignment": "random", "transform_seed": 3},
        {"global_scaling": False},
        {"cosine_distance": "online"},
    ],
)
def test_ablation_switches_do_to_the_self_conditioning_input_what_they_name(options):
    """
    With η_T = 0 the next self-conditioning input is m̃_{k+1} = F m_{k+1}, m_{k+1} = p_k, F = I − Q(I − diag ℓ)Qᵀ
    with ℓ = retention(ρ², â, λ_R, ε_fp, g), â = κ_k(1 − δ̄_k). Each switch changes one input of it, by its
    definition: `reversed` pairs the directions with ρ² reversed, `random` with ρ² permuted by `transform_seed`,
    `global_scaling=False` drops g_k, `online` uses this trajectory's δ̄_k (per sample) for the statistics' one.
    """
    pipe, _ = _pipeline("elf", 8)
    statistics = pipe.sampler_statistics
    base = {"eta_r": 3.0, "eta_t": 0.0, "eta_o": 1.0, "alpha": 0.8}
    schedulers = {"ablated": AblationUntiedELFScheduler(**base, **options), "default": UntiedELFScheduler(**base)}
    for scheduler in schedulers.values():
        scheduler.set_timesteps(8, generator=torch.Generator().manual_seed(0), statistics=statistics)
    rho_sq = statistics.rho_sq.double()
    if options.get("transform_assignment") == "reversed":
        rho_sq = rho_sq.flip(0)
    elif options.get("transform_assignment") == "random":
        permutation = torch.randperm(len(rho_sq), generator=torch.Generator().manual_seed(options["transform_seed"]))
        assert not torch.equal(permutation, torch.arange(len(rho_sq)))
        rho_sq = rho_sq[permutation]
    strength = statistics.base_transform_exponent * base["eta_r"]
    step_statistics = statistics.for_steps(8)
    scheduler, generator = schedulers["ablated"], torch.Generator().manual_seed(1)
    latents = torch.randn((3, *pipe.latent_shape), generator=generator)
    differs = []
    for k, t in enumerate(scheduler.timesteps):
        prediction = torch.randn(latents.shape, generator=generator)
        ema = torch.zeros_like(prediction) if scheduler.ema is None else scheduler.ema  # E_k, O_k before the step
        average = torch.zeros_like(prediction) if scheduler.solver_average is None else scheduler.solver_average
        outputs = {}
        for name, each in schedulers.items():
            each.scale_model_input(latents, t)
            outputs[name] = each.step(prediction, t, latents)
        distance = step_statistics.cosine_distance[k].item()
        if options.get("cosine_distance") == "online":  # mean over positions of min(1, 1 − cos(H_k, G_k)), per sample
            history = history_direction(prediction, ema, active=step_statistics.rms[k].item() > 0)
            solver_direction = solver_history_direction(prediction, history, average, None, 1e-12)
            distance = masked_token_mean(token_cosine_distance(history, solver_direction, None), None)
            assert distance.shape == (3,)
        a_hat = scheduler.solver.kappa(k) * (1 - distance)
        ell = retention(rho_sq, a_hat, strength, 0.01, options.get("global_scaling", True))
        expected = overlap_transform(prediction, statistics.basis, ell.to(prediction.dtype))
        torch.testing.assert_close(outputs["ablated"].self_conditioning, expected, rtol=1e-5, atol=1e-6)
        differs.append(not torch.allclose(outputs["default"].self_conditioning, expected, rtol=1e-5, atol=1e-6))
        latents = outputs["ablated"].prev_sample
    assert any(differs)  # the switch matters (on the steps whose retention it changes)


@pytest.mark.parametrize("family", ["elf", "langflow"])
@pytest.mark.parametrize("control", ["history", "permuted", "random"])
def test_no_attribute_first_appears_in_set_timesteps_or_step(family, control):
    pipe, _ = _pipeline(
        family, 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8, cosine_distance="online", correction_direction=control
    )
    scheduler = type(pipe.scheduler).from_config(pipe.scheduler.config)
    created = set(vars(scheduler))
    pipe.scheduler = scheduler
    _run(pipe, 8)
    assert set(vars(scheduler)) == created


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_online_cosine_distance_reads_nothing_back_per_sample(family, monkeypatch):
    """The online δ̄ gives each sample its own retention, computed for the batch at once (no `.item()` per sample)."""
    pipe, _ = _pipeline(family, 8, eta_r=2.0, eta_t=1.5, eta_o=1.0, alpha=0.8, cosine_distance="online")
    reads = []
    item = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda self: reads.append(1) or item(self))
    counts = []
    for batch_size in (1, 4):
        reads.clear()
        _run(pipe, 8, batch_size=batch_size)
        counts.append(len(reads))
    assert counts[0] == counts[1]


# ---- the direction controls of the solver correction (paper Table 12; `correction_direction`) ----------------------


CONTROLS = ("common", "permuted", "random")
STRONG = {"eta_r": 2.0, "eta_t": 1.5, "eta_o": 1.0, "alpha": 0.8}


def _latents_and_state(pipe, seed=42, batch_size=3, latents=None):
    """The final latents of a run, and its generator's state afterwards (what the official stream consumed)."""
    generator = torch.Generator().manual_seed(seed)
    output = pipe(
        batch_size=batch_size,
        num_inference_steps=8,
        generator=generator,
        latents=latents,
        output_type="latent",
    )
    return output.latents, generator.get_state()


def _history_reference(family, batch_size=3, **untied):
    """The history direction on the chained functions, which the controls run (they agree with the step to rounding)."""
    pipe, _ = _pipeline(family, 8, **untied, correction_direction="history")
    pipe.scheduler.reference_chain = True
    return pipe


@pytest.mark.parametrize("family", ["elf", "langflow"])
@pytest.mark.parametrize("control", CONTROLS)
def test_a_direction_control_at_zero_strength_is_the_official_sampler_bit_for_bit(family, control):
    official, _ = _pipeline(family, 8, statistics=False)
    untied, _ = _pipeline(family, 8, **ZERO, correction_direction=control)
    expected, expected_trajectory = _run(official, 8)
    got, trajectory = _run(untied, 8)
    assert torch.equal(trajectory, expected_trajectory)
    assert torch.equal(got.latents, expected.latents) and torch.equal(got.sequences, expected.sequences)


@pytest.mark.parametrize("control", CONTROLS)
def test_without_the_correction_a_direction_control_changes_nothing(control):
    # η_T = 0 with the SC transform on: A_k is never formed, so the direction is never read.
    no_correction = {**STRONG, "eta_t": 0.0}
    expected = _run(_history_reference("elf", **no_correction), 8)[1]
    controlled, _ = _pipeline("elf", 8, **no_correction, correction_direction=control)
    assert torch.equal(_run(controlled, 8)[1], expected)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_direction_controls_reproduce_for_a_seed_and_leave_the_sampling_stream_alone(family):
    history, _ = _pipeline(family, 8, **STRONG)
    expected, expected_state = _latents_and_state(history)
    for control in CONTROLS:
        pipe, _ = _pipeline(family, 8, **STRONG, correction_direction=control)
        latents, state = _latents_and_state(pipe)
        assert torch.isfinite(latents).all() and not torch.allclose(latents, expected), control
        assert torch.equal(_latents_and_state(pipe)[0], latents), control  # same seed, same samples
        assert torch.equal(state, expected_state), control  # the official draws, and only they, were taken


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_with_one_sample_the_permuted_and_common_controls_are_the_history_direction(family):
    expected, _ = _latents_and_state(_history_reference(family, **STRONG), batch_size=1)
    permuted, _ = _pipeline(family, 8, **STRONG, correction_direction="permuted")
    assert torch.equal(_latents_and_state(permuted, batch_size=1)[0], expected)  # no other sample: π = identity
    common, _ = _pipeline(family, 8, **STRONG, correction_direction="common")
    got, _ = _latents_and_state(common, batch_size=1)
    assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5)  # Π_k of U's unit direction: equal up to rounding


def test_with_identical_samples_the_common_and_permuted_controls_are_the_history_direction():
    # LangFlow is deterministic given z_0: three copies of one z_0 are three identical trajectories.
    z0 = torch.randn(1, 12, 32, generator=torch.Generator().manual_seed(5)).expand(3, -1, -1).contiguous()
    expected, _ = _latents_and_state(_history_reference("langflow", **STRONG), latents=z0)
    assert torch.equal(expected[0], expected[1])
    for control in ("common", "permuted"):
        pipe, _ = _pipeline("langflow", 8, **STRONG, correction_direction=control)
        got, _ = _latents_and_state(pipe, latents=z0)
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-5), control
    random, _ = _pipeline("langflow", 8, **STRONG, correction_direction="random")
    assert not torch.allclose(_latents_and_state(random, latents=z0)[0], expected, rtol=1e-4, atol=1e-5)


def test_the_direction_seed_and_the_sampling_seed_pick_the_controls_draws():
    pipe, _ = _pipeline("langflow", 8, **STRONG, correction_direction="random")
    other, _ = _pipeline("langflow", 8, **STRONG, correction_direction="random", direction_seed=1)
    assert not torch.allclose(_latents_and_state(pipe)[0], _latents_and_state(other)[0])
    permuted, _ = _pipeline("langflow", 8, **STRONG, correction_direction="permuted")
    permutations = set()
    for seed in range(6):
        _latents_and_state(permuted, seed=seed, batch_size=4)
        pi = permuted.scheduler._direction_permutation.tolist()
        assert all(pi[b] != b for b in range(4))
        permutations.add(tuple(pi))
    assert len(permutations) > 1  # each sampling seed draws its own derangement


@pytest.mark.parametrize("control", CONTROLS)
def test_direction_controls_run_the_chained_functions(control, monkeypatch):
    pipe, _ = _pipeline("elf", 8, **STRONG, correction_direction=control)
    history, _ = _pipeline("elf", 8, **STRONG, correction_direction="history")

    def refuse(*args, **kwargs):
        raise AssertionError("the untied step forms only the history direction")

    monkeypatch.setattr(history.scheduler, "_chained_update", refuse)
    _run(history, 8)  # the history direction runs the untied step
    monkeypatch.setattr(pipe.scheduler, "_chained_update", refuse)
    with pytest.raises(AssertionError, match="history direction"):
        _run(pipe, 8)
