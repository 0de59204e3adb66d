"""The untied flow-map sampler's statistics as the `flowmap_statistics` component of `FlowMapPipeline`, on the
recorded tiny FMLM* model: saved and loaded with the folder (or from a folder or Hub repo of their own, which
`save_flowmap_statistics` / `push_flowmap_statistics` write), checked against the network (at float32 or bf16),
and handed to the scheduler in the run's context, giving the direct scheduler run token for token.
"""

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from untied_sc.models.flowmap_transformer import FlowMapTransformerModel
from untied_sc.pipelines import load_pipeline
from untied_sc.pipelines.pipeline_flowmap import FlowMapPipeline
from untied_sc.pipelines.statistics_repo import BASE_CHECKPOINT_FILE, BaseCheckpoint
from untied_sc.schedulers.flowmap_statistics import FORMAT_VERSION, FlowMapStatistics
from untied_sc.schedulers.run_context import RunContext
from untied_sc.schedulers.sampler_statistics import model_fingerprint
from untied_sc.schedulers.scheduling_flowmap import UntiedFlowMapLMScheduler

from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_flowmap_untied import model, statistics  # noqa: F401  (fixtures: the recorded model, its statistics)
from .test_hub_http import hub, loopback_guard  # noqa: F401  (fixtures)


STEPS, SCALE, ETA_R = 4, 5.0, 3.0


def untied(eta_r=ETA_R):
    return UntiedFlowMapLMScheduler(gamma=0.75, self_conditioning="chained", eta_r=eta_r)


def sample(pipe, seed=42):
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    return pipe(batch_size=2, num_inference_steps=STEPS, generator=generator, sc_cfg_scale=SCALE, output_type="seq")


def other_weights(network) -> FlowMapTransformerModel:
    """The same network with another self-conditioning projection: same width, another fingerprint."""
    other = FlowMapTransformerModel(**{k: v for k, v in network.config.items() if not k.startswith("_")}).eval()
    other.load_state_dict(network.state_dict())
    with torch.no_grad():
        other.self_cond_proj.weight.mul_(1.5)
    return other


@pytest.fixture
def saved(tmp_path, model, statistics):  # noqa: F811
    """A pipeline folder saved with the component."""
    folder = tmp_path / "pipe"
    FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE, flowmap_statistics=statistics).save_pretrained(folder)
    return folder


def test_the_pipeline_run_is_the_direct_scheduler_run_token_for_token(model, statistics, one_thread):  # noqa: F811
    """The component in the run's context gives what `set_timesteps(N, generator=, flowmap_statistics=)` and the
    flow-map loop give by hand (the official loop: z_0 from the generator, then ctm's draws)."""
    out = sample(FlowMapPipeline(model, untied(), flowmap_statistics=statistics))

    scheduler, generator = untied(), torch.Generator().manual_seed(42)
    scheduler.set_timesteps(STEPS, generator=generator, flowmap_statistics=statistics)
    z = torch.randn((2, model.config.max_length, model.config.latent_dim), generator=generator) * 2.0
    with torch.no_grad():
        for k, t in enumerate(scheduler.timesteps.tolist()):
            if scheduler.needs_prepass:
                scheduler.set_prepass(model(z, t, source_timestep=t, sc_cfg_scale=SCALE).sample)
            sc = scheduler.self_conditioning_input(z)
            target = scheduler.prediction_timesteps[k]
            prediction = model(z, target, source_timestep=t, self_conditioning=sc, sc_cfg_scale=SCALE).sample
            z = scheduler.step(prediction, t, z).prev_sample
        logits = model(z, 1.0, source_timestep=1.0, sc_cfg_scale=SCALE, decoder_step_active=True).logits
    assert torch.equal(out.latents, z)
    assert torch.equal(out.sequences, logits.argmax(dim=-1))
    official = sample(FlowMapPipeline(model, untied(eta_r=0.0), flowmap_statistics=statistics))
    assert (official.latents - out.latents).abs().max() > 1e-4  # the statistics were used


def test_save_and_load_the_pipeline_with_its_statistics(saved, model, statistics, one_thread):  # noqa: F811
    index = json.loads((saved / "model_index.json").read_text())
    assert index["flowmap_statistics"] == ["untied_sc.schedulers.flowmap_statistics", "FlowMapStatistics"]
    config = json.loads((saved / "flowmap_statistics" / "config.json").read_text())
    assert (config["format_version"], config["latent_dim"], config["calibrated_steps"]) == (
        FORMAT_VERSION,
        16,
        [2, 4, 8],
    )
    assert config["sc_cfg_scale"] == SCALE and config["solver_config"]["self_conditioning"] == "chained"
    reference = sample(FlowMapPipeline(model, untied(), flowmap_statistics=statistics))
    for load in (FlowMapPipeline.from_pretrained, load_pipeline):
        pipe = load(saved)
        loaded = pipe.flowmap_statistics
        assert isinstance(loaded, FlowMapStatistics) and isinstance(pipe.scheduler, UntiedFlowMapLMScheduler)
        assert torch.equal(loaded.basis, statistics.basis) and torch.equal(loaded.rho_sq, statistics.rho_sq)
        assert torch.equal(loaded.cosine_distance[STEPS], statistics.cosine_distance[STEPS])
        assert torch.equal(sample(pipe).sequences, reference.sequences)
    without = saved.parent / "without"
    FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE).save_pretrained(without)
    assert not (without / "flowmap_statistics").exists()
    bare = FlowMapPipeline.from_pretrained(without)
    assert bare.flowmap_statistics is None
    given = FlowMapPipeline.from_pretrained(without, flowmap_statistics=saved)  # a pipeline folder's statistics
    assert torch.equal(sample(given).sequences, reference.sequences)
    statistics.save_pretrained(saved.parent / "own")  # or their own folder
    given = FlowMapPipeline.from_pretrained(without, flowmap_statistics=saved.parent / "own")
    assert torch.equal(sample(given).sequences, reference.sequences)


def test_statistics_of_another_model_are_refused_naming_the_file_and_field(
    saved,
    model,  # noqa: F811
    statistics,  # noqa: F811
    one_thread,
):
    narrow = FlowMapTransformerModel(
        **{**{k: v for k, v in model.config.items() if not k.startswith("_")}, "latent_dim": 12}
    )
    foreign = FlowMapStatistics.build(narrow, torch.eye(12)[:, :8], torch.full((8,), 0.5), {STEPS: torch.zeros(4)})
    foreign.save_pretrained(saved.parent / "narrow")
    config = saved.parent / "narrow" / "config.json"
    with pytest.raises(ValueError, match=r"latent width 12 \(`latent_dim`\), the model has 16") as error:
        FlowMapPipeline.from_pretrained(saved, flowmap_statistics=saved.parent / "narrow")
    assert str(config) in str(error.value) and "flowmap_statistics(pipe.transformer" in str(error.value)

    # The folder's own statistics, its transformer retrained since: refused at loading, naming the folder's file.
    other = other_weights(model)
    other.save_pretrained(saved / "transformer")
    with pytest.raises(ValueError, match="belong to another model") as error:
        FlowMapPipeline.from_pretrained(saved)
    assert str(saved / "flowmap_statistics" / "config.json") in str(error.value)

    # Built in memory, refused by the run (the run's context checks them against its network).
    pipe = FlowMapPipeline(other, untied(), flowmap_statistics=statistics)
    with pytest.raises(ValueError, match="fingerprint .* belong to another model"):
        sample(pipe)
    with pytest.raises(ValueError, match="belong to another model"):
        untied().set_timesteps(STEPS, context=RunContext(flowmap_statistics=statistics, model=other))
    with pytest.raises(TypeError, match="FlowMapStatistics"):
        FlowMapPipeline(model, untied(), flowmap_statistics={"basis": statistics.basis})


def test_a_run_at_positive_strength_without_statistics_says_how_to_give_them(model, one_thread):  # noqa: F811
    with pytest.raises(ValueError, match=r"`flowmap_statistics` component .*`set_timesteps\(N, flowmap_statistics="):
        sample(FlowMapPipeline(model, untied()))
    assert sample(FlowMapPipeline(model, untied(eta_r=0.0))).sequences.shape == (2, 8)  # η_R = 0 needs none


def test_the_run_context_hands_the_statistics_and_a_keyword_wins(model, statistics):  # noqa: F811
    """`set_timesteps(N, context=RunContext(flowmap_statistics=...))` is the keyword's run; the keyword wins."""
    z, prediction = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(3)), torch.randn(2, 8, 16)

    def second_input(**inputs):
        scheduler = untied()
        scheduler.set_timesteps(STEPS, **inputs)
        scheduler.set_prepass(torch.zeros_like(z))
        scheduler.step(prediction, scheduler.timesteps[0], z, generator=torch.Generator().manual_seed(5))
        return scheduler.self_conditioning_input(z)

    by_keyword = second_input(flowmap_statistics=statistics)
    assert torch.equal(second_input(context=RunContext(flowmap_statistics=statistics, model=model)), by_keyword)
    assert not torch.equal(by_keyword, prediction)  # transformed
    foreign = FlowMapStatistics.build(model, statistics.basis, statistics.rho_sq, {STEPS: torch.ones(STEPS)})
    context = RunContext(flowmap_statistics=foreign)
    assert torch.equal(second_input(flowmap_statistics=statistics, context=context), by_keyword)
    assert not torch.equal(second_input(context=context), by_keyword)


def test_a_damaged_statistics_folder_names_the_file_and_the_fix(saved):
    component = saved / "flowmap_statistics"
    config_path = component / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "format_version": 7}))
    with pytest.raises(ValueError, match=r"config.json has `format_version: 7`.*flowmap_statistics\("):
        FlowMapPipeline.from_pretrained(saved)
    config_path.write_text(json.dumps(config))
    weights = next(component.glob("*.safetensors"))
    tensors = load_file(weights)
    save_file({k: v for k, v in tensors.items() if k != f"cosine_distance_nfe{STEPS}"}, weights)
    with pytest.raises(ValueError, match=r"lack tensors \['cosine_distance_nfe4'\].*calibrated_steps \[2, 4, 8\]"):
        FlowMapPipeline.from_pretrained(saved)


def test_statistics_from_a_hub_repo_of_their_own(
    hub,  # noqa: F811
    loopback_guard,  # noqa: F811
    saved,
    model,  # noqa: F811
    statistics,  # noqa: F811
    one_thread,
):
    """`from_pretrained(BASE, flowmap_statistics="owner/name")` downloads the statistics' folder only, at their
    own revision, and samples as the folder saved with them."""
    reference = sample(FlowMapPipeline.from_pretrained(saved))
    own = saved.parent / "statistics-repo"
    (own / "flowmap_statistics").mkdir(parents=True)
    statistics.save_pretrained(own / "flowmap_statistics")
    commit = hub.commit("someone/fmlm-flowmap-statistics", own, "flow-map statistics")
    base = saved.parent / "base"
    FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE).save_pretrained(base)
    pipe = FlowMapPipeline.from_pretrained(
        base, flowmap_statistics="someone/fmlm-flowmap-statistics", flowmap_statistics_revision=commit
    )
    assert torch.equal(sample(pipe).sequences, reference.sequences)
    with pytest.raises(FileNotFoundError, match="could not be read"):
        FlowMapPipeline.from_pretrained(base, flowmap_statistics="someone/no-such-statistics")
    with pytest.raises(TypeError, match="flowmap_statistics_revision"):
        FlowMapPipeline.from_pretrained(base, flowmap_statistics_revision=commit)


PUBLISHED = {"flowmap_statistics/config.json", "flowmap_statistics/diffusion_pytorch_model.safetensors"}
PUBLISHED |= {BASE_CHECKPOINT_FILE, "README.md"}


def files(folder) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def base(tmp_path, model):  # noqa: F811
    """A pipeline folder without statistics."""
    folder = tmp_path / "base"
    FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE).save_pretrained(folder)
    return folder


def test_saved_statistics_load_back_with_the_base(tmp_path, base, model, statistics, one_thread):  # noqa: F811
    pipe = FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE, flowmap_statistics=statistics)
    written = pipe.save_flowmap_statistics(tmp_path / "stats", repo_id="someone/fmlm-stats")
    assert written == tmp_path / "stats" and files(written) == PUBLISHED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "stats"]  # no staging folder left behind
    record = BaseCheckpoint.from_json((written / BASE_CHECKPOINT_FILE).read_text())
    assert (record.family, record.pipeline_class) == ("flowmap", "FlowMapPipeline")
    assert record.model_fingerprint == statistics.config.model_fingerprint == model_fingerprint(model)
    card = (written / "README.md").read_text()
    assert 'FlowMapPipeline.from_pretrained("BASE_DIR", flowmap_statistics="someone/fmlm-stats")' in card
    assert "UntiedFlowMapLMScheduler.from_config" in card and "coefficients" not in card
    reference = sample(pipe)
    for load in (FlowMapPipeline.from_pretrained, load_pipeline):
        loaded = load(base, flowmap_statistics=written)
        assert torch.equal(loaded.flowmap_statistics.basis, statistics.basis)
        assert torch.equal(sample(loaded).sequences, reference.sequences)
    with pytest.raises(ValueError, match=r"no flow-map statistics to save: compute them first .*flowmap_statistics\("):
        FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE).save_flowmap_statistics(tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_a_statistics_folder_whose_record_names_other_weights_is_refused(tmp_path, base, model, statistics):  # noqa: F811
    pipe = FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE, flowmap_statistics=statistics)
    written = pipe.save_flowmap_statistics(tmp_path / "stats")
    path = written / BASE_CHECKPOINT_FILE
    path.write_text(path.read_text().replace(statistics.config.model_fingerprint, "0" * 16))
    with pytest.raises(ValueError, match=r"base_checkpoint\.json records fingerprint '0+'.*save_flowmap_statistics"):
        FlowMapPipeline.from_pretrained(base, flowmap_statistics=written)


def test_a_statistics_folder_is_replaced_only_with_consent_and_whole(
    tmp_path,
    base,
    model,  # noqa: F811
    statistics,  # noqa: F811
    monkeypatch,
    one_thread,
):
    folder = tmp_path / "stats"
    FlowMapPipeline(model, untied(), flowmap_statistics=statistics).save_flowmap_statistics(folder)
    before = {name: (folder / name).read_bytes() for name in PUBLISHED}
    other = FlowMapStatistics.build(
        model, statistics.basis, statistics.rho_sq, {STEPS: torch.full((STEPS,), 0.25)}, sc_cfg_scale=SCALE
    )
    pipe = FlowMapPipeline(model, untied(), flowmap_statistics=other)
    with pytest.raises(FileExistsError) as refused:
        pipe.save_flowmap_statistics(folder)
    assert str(folder) in str(refused.value) and "overwrite=True" in str(refused.value)
    assert {name: (folder / name).read_bytes() for name in PUBLISHED} == before

    # An error while writing leaves the folder as it was, and no half-written folder beside it.
    def fail(self, *args, **kwargs):
        raise RuntimeError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(FlowMapStatistics, "save_pretrained", fail)
        with pytest.raises(RuntimeError, match="disk full"):
            pipe.save_flowmap_statistics(folder, overwrite=True)
    assert {name: (folder / name).read_bytes() for name in PUBLISHED} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "stats"]

    pipe.save_flowmap_statistics(folder, overwrite=True)
    assert files(folder) == PUBLISHED
    loaded = FlowMapPipeline.from_pretrained(base, flowmap_statistics=folder)
    assert torch.equal(loaded.flowmap_statistics.for_steps(STEPS), torch.full((STEPS,), 0.25))


def test_statistics_pushed_to_the_hub_load_back_by_repo_id(
    hub,  # noqa: F811
    loopback_guard,  # noqa: F811
    base,
    model,  # noqa: F811
    statistics,  # noqa: F811
    one_thread,
):
    pipe = FlowMapPipeline(model, untied(), sc_cfg_scale=SCALE, flowmap_statistics=statistics)
    commit = pipe.push_flowmap_statistics("someone/fmlm-pushed-statistics")
    loaded = FlowMapPipeline.from_pretrained(
        base, flowmap_statistics="someone/fmlm-pushed-statistics", flowmap_statistics_revision=commit
    )
    assert torch.equal(sample(loaded).sequences, sample(pipe).sequences)
    assert set(hub.files("someone/fmlm-pushed-statistics")) == PUBLISHED | {".gitattributes"}  # no weights
    assert torch.equal(
        sample(load_pipeline(base, flowmap_statistics="someone/fmlm-pushed-statistics")).sequences,
        sample(pipe).sequences,
    )


def test_a_bf16_pipeline_takes_statistics_of_its_network_and_refuses_another(
    tmp_path,
    base,
    model,  # noqa: F811
    statistics,  # noqa: F811
    one_thread,
):
    FlowMapPipeline(model, untied(), flowmap_statistics=statistics).save_flowmap_statistics(tmp_path / "stats")
    pipe = FlowMapPipeline.from_pretrained(base, flowmap_statistics=tmp_path / "stats", dtype=torch.bfloat16)
    assert pipe.transformer.dtype == torch.bfloat16
    assert model_fingerprint(pipe.transformer) != statistics.config.model_fingerprint  # rounding changed the hash
    assert sample(pipe).sequences.shape == (2, 8)  # the run's own check accepts it too
    again = pipe.save_flowmap_statistics(tmp_path / "again")  # and publishes them under the float32 fingerprint
    record = BaseCheckpoint.from_json((again / BASE_CHECKPOINT_FILE).read_text())
    assert record.model_fingerprint == statistics.config.model_fingerprint
    rounded = tmp_path / "rounded"  # weights stored in bf16, loaded as they are
    FlowMapPipeline(copy.deepcopy(model).to(torch.bfloat16), untied(), sc_cfg_scale=SCALE).save_pretrained(rounded)
    assert (
        FlowMapPipeline.from_pretrained(
            rounded, flowmap_statistics=tmp_path / "stats", dtype=torch.bfloat16
        ).flowmap_statistics.config.model_fingerprint
        == statistics.config.model_fingerprint
    )

    other = tmp_path / "other"
    FlowMapPipeline(other_weights(model), untied(), sc_cfg_scale=SCALE).save_pretrained(other)
    config = tmp_path / "stats" / "flowmap_statistics" / "config.json"
    for dtype in (torch.bfloat16, torch.float32):
        with pytest.raises(ValueError, match="belong to another model") as refused:
            FlowMapPipeline.from_pretrained(other, flowmap_statistics=tmp_path / "stats", dtype=dtype)
        assert str(config) in str(refused.value)

    # Statistics that record no rounded fingerprint are matched to float32 weights only, saying why.
    recorded = json.loads(config.read_text())
    config.write_text(json.dumps({**recorded, "rounded_fingerprints": None}))
    with pytest.raises(ValueError, match="holds them in torch.bfloat16: rounding changes the hash"):
        FlowMapPipeline.from_pretrained(base, flowmap_statistics=tmp_path / "stats", dtype=torch.bfloat16)
    assert FlowMapPipeline.from_pretrained(base, flowmap_statistics=tmp_path / "stats").flowmap_statistics is not None
