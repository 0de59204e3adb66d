"""Pipelines: save/load, Hub loading, push_to_hub, outputs, callbacks, official conversion, and input errors."""

import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from huggingface_hub import ModelCard
from safetensors.torch import save_file

from untied_sc import ELFPipeline, ELFScheduler, ELFText2TextPipeline, LangFlowPipeline, LangFlowScheduler
from untied_sc.pipelines import load_pipeline, mask_after_eos

from .conftest import elf_from_golden, langflow_from_golden
from .hub_cache import populate_hub_cache
from .tiny import tiny_tokenizer


@pytest.fixture
def pipes(elf_golden, langflow_golden):
    elf = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    langflow = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    for pipe in (elf, langflow):
        pipe.set_progress_bar_config(disable=True)
    return {"elf": elf, "langflow": langflow}


def _sample(pipe, seed=0, **kwargs):
    kwargs = {"batch_size": 2, "num_inference_steps": 8, **kwargs}
    return pipe(generator=torch.Generator().manual_seed(seed), **kwargs)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_save_and_reload_gives_identical_texts(tmp_path, pipes, family):
    pipe = pipes[family]
    pipe.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "model_index.json").read_text())["sampler_statistics"] == [None, None]
    reloaded = type(pipe).from_pretrained(tmp_path)
    reloaded.set_progress_bar_config(disable=True)
    first, second = _sample(pipe, seed=3), _sample(reloaded, seed=3)
    assert first.texts == second.texts and len(first.texts) == 2 and all(first.texts)
    assert torch.equal(first.latents, second.latents)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_load_by_repo_id_from_the_hub_cache_offline(tmp_path, monkeypatch, pipes, family):
    pipe = pipes[family]
    pipe.save_pretrained(tmp_path / "saved")
    files = {str(p.relative_to(tmp_path / "saved")): p for p in (tmp_path / "saved").rglob("*") if p.is_file()}
    populate_hub_cache(tmp_path / "cache", f"someone/{family}-tiny", files)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reloaded = type(pipe).from_pretrained(f"someone/{family}-tiny", cache_dir=tmp_path / "cache")
    reloaded.set_progress_bar_config(disable=True)
    assert _sample(reloaded, seed=4).texts == _sample(pipe, seed=4).texts


def test_push_to_hub_uploads_a_folder_that_loads(tmp_path, monkeypatch, pipes):
    """The Hub is unreachable here: the upload call is redirected to a local folder, everything else is real."""
    import diffusers.utils.hub_utils as hub_utils

    uploaded = tmp_path / "uploaded"

    def fake_upload_folder(repo_id, folder_path, **kwargs):
        shutil.copytree(folder_path, uploaded)

    monkeypatch.setattr(hub_utils, "create_repo", lambda repo_id, **kwargs: type("R", (), {"repo_id": repo_id})())
    monkeypatch.setattr(hub_utils, "upload_folder", fake_upload_folder)
    monkeypatch.setattr(hub_utils, "load_or_create_model_card", lambda *a, **k: ModelCard("---\nlicense: mit\n---\n"))
    pipes["elf"].push_to_hub("someone/elf-tiny")
    reloaded = ELFPipeline.from_pretrained(uploaded)
    reloaded.set_progress_bar_config(disable=True)
    assert _sample(reloaded).texts == _sample(pipes["elf"]).texts


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_output_types_and_return_dict(pipes, family):
    pipe = pipes[family]
    full = _sample(pipe, seed=2)
    assert full.sequences.shape == (2, 12) and full.latents.shape == (2, *pipe.latent_shape)
    as_tuple = _sample(pipe, seed=2, return_dict=False)
    assert as_tuple[0] == full.texts and torch.equal(as_tuple[1], full.sequences)
    seq = _sample(pipe, seed=2, output_type="seq")
    assert seq.texts is None and torch.equal(seq.sequences, full.sequences)
    latent = _sample(pipe, seed=2, output_type="latent")
    assert latent.sequences is None and torch.equal(latent.latents, full.latents)


def test_elf_texts_are_cut_at_the_first_eos(pipes):
    output = _sample(pipes["elf"], seed=0, batch_size=3)
    for text, ids in zip(output.texts, output.sequences, strict=True):
        kept = [i for i in ids.tolist() if i not in (0, 1)]
        assert text.split() == [f"w{i}" if i > 2 else "<unk>" for i in kept]


def test_given_latents_and_callbacks(pipes):
    pipe = pipes["langflow"]
    latents = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(9))
    seen = []

    def callback(pipe, step, timestep, tensors):
        seen.append((step, tuple(tensors)))
        return {"latents": tensors["latents"] * 0} if step == pipe.num_timesteps - 2 else {}

    output = pipe(
        batch_size=2,
        num_inference_steps=4,
        latents=latents,
        callback_on_step_end=callback,
        callback_on_step_end_tensor_inputs=["latents", "prediction"],
        output_type="seq",
    )
    assert [s for s, _ in seen] == [0, 1, 2, 3] and seen[0][1] == ("latents", "prediction")
    assert (
        torch.count_nonzero(output.latents) == 0
    )  # the callback's zeroed latent was used (the last step is no update)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_no_generator_draws_from_torchs_global_one_as_diffusers(pipes, family):
    pipe, call = pipes[family], {"batch_size": 2, "num_inference_steps": 8}
    torch.manual_seed(0)
    first = pipe(**call)
    again = pipe(**call)
    assert not torch.equal(first.latents, again.latents)  # the global generator moved on
    torch.manual_seed(0)
    reseeded = pipe(**call)
    assert reseeded.texts == first.texts
    assert torch.equal(reseeded.sequences, first.sequences) and torch.equal(reseeded.latents, first.latents)
    # The global generator is the stream a generator seeded alike gives: the same draws, in the same order.
    assert torch.equal(_sample(pipe, seed=0, **call).latents, first.latents)
    # A given generator is untouched by the global seed and leaves the global generator alone.
    torch.manual_seed(1)
    state = torch.get_rng_state()
    assert torch.equal(_sample(pipe, seed=5, **call).latents, _sample(pipe, seed=5, **call).latents)
    assert torch.equal(torch.get_rng_state(), state)


def test_from_official_builds_working_pipelines(tmp_path, elf_golden, langflow_golden):
    payload = {"params": elf_golden.weights, "ema_params1": elf_golden.weights, "step": 1}
    torch.save(payload, tmp_path / "checkpoint_1")
    elf = ELFPipeline.from_official(tmp_path, tokenizer=tiny_tokenizer(), max_length=12, sde_gamma=1.5, sc_cfg_scale=3)
    folder = tmp_path / "langflow"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(langflow_golden.config))
    save_file(langflow_golden.weights, folder / "model.safetensors")
    langflow = LangFlowPipeline.from_official(folder, tokenizer=tiny_tokenizer())
    for pipe in (elf, langflow):
        pipe.set_progress_bar_config(disable=True)
        assert len(_sample(pipe).texts) == 2


def test_bad_inputs_give_clear_errors(pipes, elf_golden):
    pipe = pipes["elf"]
    with pytest.raises(ValueError, match="num_inference_steps must be an integer ≥ 2"):
        _sample(pipe, num_inference_steps=1)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        _sample(pipe, batch_size=0)
    with pytest.raises(ValueError, match=r"latents have shape \(2, 12, 15\), expected \(2, 12, 16\)"):
        _sample(pipe, latents=torch.zeros(2, 12, 15))
    with pytest.raises(ValueError, match="output_type must be one of"):
        _sample(pipe, output_type="pil")
    with pytest.raises(ValueError, match="Unknown callback tensor inputs"):
        _sample(pipe, callback_on_step_end=lambda *a: {}, callback_on_step_end_tensor_inputs=["noise"])
    with pytest.raises(ValueError, match="tokenizer has 41 tokens but the transformer predicts 40"):
        ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer(41))


@pytest.mark.parametrize("cls", [ELFPipeline, LangFlowPipeline, ELFText2TextPipeline])
def test_the_declared_network_knobs_are_the_keyword_arguments_of_predict(cls):
    assert list(cls.network_knobs) == list(inspect.signature(cls._predict).parameters)[4:]  # past self, z, t, m


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_a_call_checks_its_inputs_once(pipes, monkeypatch, family):
    pipe, calls = pipes[family], []
    check = type(pipe).check_inputs
    monkeypatch.setattr(type(pipe), "check_inputs", lambda self, *args: calls.append(args) or check(self, *args))
    _sample(pipe)
    assert calls == [(2, 8, None)]


@pytest.mark.parametrize(
    ("family", "knob"),
    [("elf", "sc_cfg_scale"), ("elf", "decode_temperature"), ("langflow", "temperature")],
)
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_knobs_are_refused_before_sampling(pipes, monkeypatch, family, knob, value):
    pipe = pipes[family]
    calls = []
    monkeypatch.setattr(pipe, "_predict", lambda *args, **kwargs: calls.append(1))
    with pytest.raises(ValueError, match=f"{knob}"):
        _sample(pipe, **{knob: value})
    assert calls == []  # refused before the first network call


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_non_finite_latents_are_refused_before_sampling(pipes, monkeypatch, family):
    pipe = pipes[family]
    latents = torch.zeros(2, *pipe.latent_shape)
    latents[1, 3, 0] = float("nan")
    latents[0, 0, 0] = float("inf")
    calls = []
    monkeypatch.setattr(pipe, "_predict", lambda *args, **kwargs: calls.append(1))
    with pytest.raises(ValueError, match=r"latents hold 2 non-finite value\(s\) \(NaN or ±inf\)"):
        _sample(pipe, latents=latents)
    with pytest.raises(ValueError, match="non-finite"):
        pipe.denoise(2, 8, latents=latents, progress=False)
    with pytest.raises(ValueError, match="must be a finite number"):
        ELFPipeline(pipes["elf"].transformer, ELFScheduler(), tiny_tokenizer(), sc_cfg_scale=float("nan"))
    assert calls == []


def test_a_coefficient_preset_of_the_other_family_is_refused_with_this_familys_presets(pipes):
    from untied_sc import UntiedSelfConditioningScheduler
    from untied_sc.calibration.calibrate import resolve_preset_coefficients

    for family, other, listed in (
        ("langflow", "elf-b", "langflow-lm1b, langflow-owt"),
        ("elf", "langflow-owt", "elf-b"),
    ):
        config = pipes[family].scheduler.config
        with pytest.raises(ValueError, match=f"preset '{other}'.*Choose one of the .* presets: {listed}"):
            UntiedSelfConditioningScheduler.from_config(config, coefficients=other)
        with pytest.raises(ValueError, match=f"preset '{other}'"):
            resolve_preset_coefficients(family, [8], other)
    UntiedSelfConditioningScheduler.from_config(pipes["langflow"].scheduler.config, coefficients="langflow-owt")
    with pytest.raises(ValueError, match="eta_t must be a finite number"):
        UntiedSelfConditioningScheduler.from_config(pipes["elf"].scheduler.config, eta_t=float("inf"))


# ---- family, signatures, per-call knobs and the SC-CFG default ---------------------------------------------------


def test_pipelines_and_models_name_their_family(pipes):
    assert (ELFPipeline.family, LangFlowPipeline.family) == ("elf", "langflow")
    for family, pipe in pipes.items():
        assert pipe.family == pipe.transformer.family == family
    with pytest.raises(ValueError, match="LangFlowPipeline samples 'langflow' models, but the transformer is a"):
        LangFlowPipeline(pipes["elf"].transformer, LangFlowScheduler(), tiny_tokenizer())


SHARED_ARGUMENTS = [
    "batch_size",
    "num_inference_steps",
    "generator",
    "latents",
    "output_type",
    "return_dict",
    "callback_on_step_end",
    "callback_on_step_end_tensor_inputs",
]


@pytest.mark.parametrize(
    ("cls", "knobs"), [(ELFPipeline, ["sc_cfg_scale", "decode_temperature"]), (LangFlowPipeline, ["temperature"])]
)
def test_call_signature_lists_every_argument_with_its_docstring(cls, knobs):
    parameters = inspect.signature(cls.__call__).parameters
    assert list(parameters) == ["self", *SHARED_ARGUMENTS, *knobs]  # no *args / **kwargs hide anything
    for name in [*SHARED_ARGUMENTS, *knobs]:
        assert f"            {name} (`" in cls.__call__.__doc__, f"{name} is not documented"


def _spy_network_scales(pipe):
    """Records the SC-CFG scale of every ELF network call (the steps' and the decode pass's)."""
    scales, forward = [], pipe.transformer.forward

    def spy(*args, **kwargs):
        scales.append(args[3] if len(args) > 3 else kwargs.get("sc_cfg_scale"))
        return forward(*args, **kwargs)

    pipe.transformer.forward = spy
    return scales


def test_a_call_with_knobs_leaves_no_state_on_the_pipeline(pipes):
    knobs_of = {"elf": {"sc_cfg_scale": 7.0, "decode_temperature": 5.0}, "langflow": {"temperature": 0.5}}
    for family, knobs in knobs_of.items():
        pipe = pipes[family]
        _sample(pipe)
        before = {key: value for key, value in vars(pipe).items() if key != "_num_timesteps"}
        config = dict(pipe.config)
        _sample(pipe, **knobs)
        after = {key: value for key, value in vars(pipe).items() if key != "_num_timesteps"}
        assert after.keys() == before.keys() and all(after[key] is before[key] for key in before)
        assert dict(pipe.config) == config
    scales = _spy_network_scales(pipes["elf"])
    _sample(pipes["elf"], sc_cfg_scale=7.0)
    _sample(pipes["elf"])
    assert scales == [7.0] * 9 + [3.0] * 9  # 8 steps and the decode pass, then the pipeline default again


@pytest.mark.parametrize(
    ("family", "outer", "inner"),
    [
        ("elf", {"sc_cfg_scale": 7.0, "decode_temperature": 5.0}, {"sc_cfg_scale": 1.5, "decode_temperature": 0.5}),
        ("langflow", {"temperature": 0.5}, {"temperature": 2.0}),
    ],
)
def test_interleaved_calls_with_different_knobs_equal_separate_calls(pipes, family, outer, inner):
    """A call made from another call's callback (on its own scheduler) changes neither call: re-entrancy."""
    pipe = pipes[family]
    alone_outer, alone_inner = _sample(pipe, seed=1, **outer), _sample(pipe, seed=2, **inner)
    inner_outputs = []

    def run_inner(pipe, step, timestep, tensors):
        if step == 3:
            own = pipe.scheduler
            pipe.scheduler = type(own).from_config(own.config)  # a scheduler holds its trajectory: one per call
            inner_outputs.append(_sample(pipe, seed=2, **inner))
            pipe.scheduler = own
        return {}

    interleaved = _sample(pipe, seed=1, callback_on_step_end=run_inner, **outer)
    for together, alone in ((interleaved, alone_outer), (inner_outputs[0], alone_inner)):
        assert torch.equal(together.latents, alone.latents) and torch.equal(together.sequences, alone.sequences)
    assert not torch.equal(alone_outer.latents, alone_inner.latents)


def test_sc_cfg_scale_resolution_call_then_pipeline_then_default(pipes):
    transformer = pipes["elf"].transformer
    assert ELFPipeline(transformer, FlowMatchEulerDiscreteScheduler(), tiny_tokenizer()).sc_cfg_scale == 3.0
    owned = ELFPipeline(transformer, ELFScheduler(), tiny_tokenizer(), sc_cfg_scale=4.0)
    assert owned.config.sc_cfg_scale == owned.sc_cfg_scale == 4.0
    owned.set_progress_bar_config(disable=True)
    scales = _spy_network_scales(owned)
    _sample(owned)
    _sample(owned, sc_cfg_scale=6.0)
    assert scales == [4.0] * 9 + [6.0] * 9
    with pytest.raises(ValueError, match="sc_cfg_scale must be a number or None"):
        _sample(owned, sc_cfg_scale="3")


def test_sc_cfg_scale_is_saved_in_model_index_and_a_folder_without_one_runs_the_default(tmp_path, pipes):
    transformer = pipes["elf"].transformer
    ELFPipeline(transformer, ELFScheduler(), tiny_tokenizer(), sc_cfg_scale=4.0).save_pretrained(tmp_path / "new")
    assert json.loads((tmp_path / "new" / "model_index.json").read_text())["sc_cfg_scale"] == 4.0
    assert ELFPipeline.from_pretrained(tmp_path / "new").sc_cfg_scale == 4.0
    assert ELFPipeline.from_pretrained(tmp_path / "new", sc_cfg_scale=6.0).sc_cfg_scale == 6.0

    # a model_index.json without the value (hand-made): the released models' 3.0, written on the next save
    bare = tmp_path / "bare"
    ELFPipeline(transformer, ELFScheduler(), tiny_tokenizer(), sc_cfg_scale=5.0).save_pretrained(bare)
    index = json.loads((bare / "model_index.json").read_text())
    del index["sc_cfg_scale"]
    (bare / "model_index.json").write_text(json.dumps(index))
    loaded = ELFPipeline.from_pretrained(bare)
    assert loaded.sc_cfg_scale == 3.0
    loaded.save_pretrained(tmp_path / "resaved")
    assert json.loads((tmp_path / "resaved" / "model_index.json").read_text())["sc_cfg_scale"] == 3.0


# ---- the public denoising loop -----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_call_is_denoise_then_decode(pipes, family):
    pipe = pipes[family]
    knobs = {"sc_cfg_scale": 7.0} if family == "elf" else {"temperature": 0.5}
    called = _sample(pipe, seed=4, output_type="latent", **knobs)
    denoised = pipe.denoise(2, 8, torch.Generator().manual_seed(4), **knobs)
    assert torch.equal(called.latents, denoised.latents)
    assert (denoised.logits is None) == (family == "elf")
    with pytest.raises(TypeError, match=r"unknown network arguments \['decode_temperature'\]"):
        pipe.denoise(2, 8, decode_temperature=1.0)


def test_denoise_step_callback_sees_each_step_and_can_replace_the_latents(pipes):
    pipe = pipes["langflow"]
    steps = []

    def record(step):
        steps.append(step)
        return {"latents": step.latents * 0} if step.index == 1 else None

    output = pipe.denoise(2, 4, torch.Generator().manual_seed(0), step_callback=record)
    assert [s.index for s in steps] == [0, 1, 2, 3] and torch.equal(steps[0].timestep, pipe.scheduler.timesteps[0])
    assert steps[0].self_conditioning is None and torch.equal(steps[1].self_conditioning, steps[0].prediction)
    assert torch.count_nonzero(steps[2].sample) == 0  # the replaced latent is what step 2 started from
    assert torch.equal(steps[1].sample, steps[0].latents) and steps[3].logits is not None
    assert torch.equal(output.latents, steps[3].latents) and torch.equal(output.logits, steps[3].logits)

    partial = pipe.denoise(2, 4, torch.Generator().manual_seed(0), max_steps=3, step_callback=record)
    assert [s.index for s in steps[4:]] == [0, 1, 2] and torch.equal(partial.latents, steps[-1].latents)
    with pytest.raises(ValueError, match=r"max_steps must be an integer in \[1, 4\]"):
        pipe.denoise(2, 4, max_steps=5)


def test_denoise_runs_a_given_scheduler_and_leaves_the_pipelines_own_alone(pipes):
    pipe = pipes["elf"]
    _sample(pipe, seed=0)
    own_grid = pipe.scheduler.solver.grid
    other = ELFScheduler.from_config(pipe.scheduler.config)
    by_other = pipe.denoise(2, 8, torch.Generator().manual_seed(1), scheduler=other)
    assert pipe.scheduler.solver.grid == own_grid and other.solver.grid != own_grid
    assert torch.equal(by_other.latents, _sample(pipe, seed=1, output_type="latent").latents)


ARTIFACTS = Path(__file__).resolve().parents[1] / "hub_artifacts"


@torch.no_grad()
def _official_loop_by_hand(pipe, num_inference_steps: int, seed: int, batch_size: int, sc_cfg_scale: float):
    """The official sampler written out with the scheduler and the network: (final latents, token ids)."""
    scheduler, transformer, generator = pipe.scheduler, pipe.transformer, torch.Generator().manual_seed(seed)
    if pipe.family == "elf":
        scheduler.set_timesteps(num_inference_steps, generator=generator)
    else:
        scheduler.set_timesteps(num_inference_steps, proposal=transformer.gumbel_parameters())
    latents = torch.randn((batch_size, *pipe.latent_shape), generator=generator) * scheduler.init_noise_sigma
    for t in scheduler.timesteps:
        model_input = scheduler.scale_model_input(latents, t)
        if pipe.family == "elf":
            prediction = transformer(model_input, t, scheduler.self_conditioning, sc_cfg_scale).sample.float()
        else:
            logits = transformer(model_input, t, scheduler.self_conditioning).logits
            prediction = transformer.clean_prediction(logits)
        latents = scheduler.step(prediction, t, latents).prev_sample
    if pipe.family == "langflow":
        return latents, logits.argmax(dim=-1)
    ids = transformer(latents, 1.0, None, sc_cfg_scale, decoder_step_active=True).logits.argmax(dim=-1)
    return latents, mask_after_eos(ids, pipe.tokenizer.eos_token_id, pipe.tokenizer.pad_token_id)


@pytest.mark.parametrize("name", ["elf-small", "langflow-small"])
def test_bundled_folders_sample_as_the_official_loop_written_out(name):
    """The bundled folders (saved before the pipeline owned the SC-CFG scale) keep the released w = 3.0."""
    pipe = load_pipeline(ARTIFACTS / name)
    pipe.set_progress_bar_config(disable=True)
    if pipe.family == "elf":
        assert pipe.sc_cfg_scale == 3.0
    output = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0), output_type="seq")
    latents, tokens = _official_loop_by_hand(pipe, 8, seed=0, batch_size=2, sc_cfg_scale=3.0)
    assert torch.equal(output.latents, latents) and torch.equal(output.sequences, tokens)
