"""Pipelines: save/load, Hub loading, push_to_hub, outputs, callbacks, official conversion, and input errors."""

import json
import shutil

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import save_file

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler

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


def test_random_generator_when_none_is_given(pipes):
    a = pipes["elf"](batch_size=1, num_inference_steps=8, output_type="latent").latents
    b = pipes["elf"](batch_size=1, num_inference_steps=8, output_type="latent").latents
    assert not torch.equal(a, b)


def test_from_official_builds_working_pipelines(tmp_path, elf_golden, langflow_golden):
    payload = {"params": elf_golden.weights, "ema_params1": elf_golden.weights, "step": 1}
    torch.save(payload, tmp_path / "checkpoint_1")
    elf = ELFPipeline.from_official(tmp_path, tokenizer=tiny_tokenizer(), max_length=12)
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
