"""`untied-sc convert` writes a complete pipeline folder that samples the official tokens at once.

The official samplers' recordings on tiny random weights (`tests/fixtures/{elf,langflow}_sample_nfe*.safetensors`,
see test_pipelines_official.py) are put in each official on-disk format: ELF's trainer output folder
(`checkpoint_<step>`, a `torch.save` of params / ema_params1 / optimizer state, beside the `config.yml` the trainer
writes, whose `sampling_configs` name the fixture's γ and SC-CFG scale), LangFlow's `config.json` +
`model.safetensors`. Each is converted by the command line, loaded with `from_pretrained`, and sampled with the
fixture's seed: the official sampler must give the recorded tokens, and the untied sampler at η = 0 the same bit
for bit. `elf_pd_sample_nfe{8,16}` record the official sampler of ELF's distillation branch at ELF-B-PD's settings
(`tests/fixtures/make_pd_sampler_fixtures.py`), which a copy converted as ELF-B-PD-owt-torch must reproduce.
"""

import ast
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    ELFTransformerModel,
    LangFlowPipeline,
    LangFlowScheduler,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    UntiedSelfConditioningScheduler,
)
from untied_sc.cli import main
from untied_sc.models import official_checkpoints
from untied_sc.models.official_checkpoints import OFFICIAL_CHECKPOINTS, Sourced, cache_snapshot, official_checkpoint

from .conftest import Golden, golden_call, replay_official_draws, replay_official_network
from .hub_cache import populate_hub_cache
from .hub_server import local_hub  # noqa: F401  (the session's server fixture)
from .test_hub_http import hub, loopback_guard  # noqa: F401  (fixtures)
from .tiny import random_statistics, tiny_tokenizer_folder


ROOT = Path(__file__).resolve().parents[1]
FIXTURES = {("elf", 8), ("elf", 32), ("langflow", 8), ("langflow", 64)}
ZERO = {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 1.5, "alpha": 0.7}  # untied at zero strength: the official sampler
PIPELINES = {"elf": ELFPipeline, "langflow": LangFlowPipeline}


def official_elf_checkpoint(path: Path, weights: dict, step: int = 7) -> Path:
    """A `checkpoint_<step>` file as the official PyTorch trainer saves it (`save_checkpoint`)."""
    payload = {
        "params": {k: v + 1 for k, v in weights.items()},  # the raw weights differ from the EMA ones on purpose
        "ema_params1": weights,
        "opt_state": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "lr_scheduler": None,
        "step": step,
        "epoch": 1,
        "dropout_rng": None,
        "grad_accum_buffers": {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)
    return path


def elf_trainer_config(golden: Golden, sampling: list[dict], **overrides) -> dict:
    """The `config.yml` the official trainer writes (`yaml.dump` of its Config, `sampling_configs` as dicts)."""
    sampler = json.loads(golden.metadata["sampler"])
    return {
        "data_path": "embedded-language-flows/openwebtext-t5",
        "max_length": golden.config["max_length"],
        "encoder_model_name": "t5-small",
        "latent_mean": 0.0,
        "latent_std": 0.2,
        "model": "ELF-B",
        "bottleneck_dim": golden.config["bottleneck_dim"],
        "denoiser_p_mean": sampler["P_mean"],
        "denoiser_p_std": sampler["P_std"],
        "denoiser_noise_scale": sampler["latent_noise_scale"],
        "t_eps": sampler["t_eps"],
        "time_schedule": "logit_normal",
        "self_cond_prob": sampler["self_cond_prob"],
        "sampling_configs_path": "src/configs/sampling_configs/uncond_sampling_configs.yml",
        "sampling_configs": sampling,
        "output_dir": "outputs/elf",
        "seed": 42,
        **overrides,
    }


def sampling_entry(steps: list[int], sde_gamma: float, sc_cfg_scale: float) -> dict:
    return {
        "sampling_method": "sde",
        "num_sampling_steps": steps,
        "cfgs": [1],
        "sde_gamma": sde_gamma,
        "self_cond_cfg_scales": [sc_cfg_scale],
        "time_schedule": "logit_normal",
    }


def official_elf_folder(folder: Path) -> Path:
    """The trainer's output folder of the ELF fixtures' weights: checkpoint_7 and a config.yml that lists each
    fixture's settings (its NFE, γ and w)."""
    goldens = [Golden(f"elf_sample_nfe{nfe}.safetensors") for nfe in (8, 32)]
    official_elf_checkpoint(folder / "checkpoint_7", goldens[0].weights)
    entries = []
    for golden in goldens:
        sampler = json.loads(golden.metadata["sampler"])
        entries.append(sampling_entry([sampler["num_steps"]], sampler["sde_gamma"], sampler["sc_cfg_scale"]))
    (folder / "config.yml").write_text(yaml.dump(elf_trainer_config(goldens[0], entries), sort_keys=False))
    return folder


def official_langflow_folder(folder: Path, golden: Golden) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "LangFlow", **golden.config}))
    save_file(golden.weights, folder / "model.safetensors")
    return folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    """Both families converted once by the command line (in process), with the tiny tokenizer."""
    root = tmp_path_factory.mktemp("converted")
    tokenizer = tiny_tokenizer_folder(root / "tokenizer")
    sources = {
        "elf": official_elf_folder(root / "elf-official"),
        "langflow": official_langflow_folder(root / "langflow-official", Golden("langflow_sample_nfe8.safetensors")),
    }
    for family, source in sources.items():
        assert main(["convert", family, str(source), str(root / family), "--tokenizer", tokenizer]) == 0
    return {family: root / family for family in sources}


def _load(folder: Path, family: str):
    pipe = PIPELINES[family].from_pretrained(folder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _golden(family: str, nfe: int) -> Golden:
    return Golden(f"{family}_sample_nfe{nfe}.safetensors")


def _expected(golden: Golden) -> tuple[torch.Tensor, torch.Tensor]:
    rows = golden.outputs["trajectory_rows"]
    return golden.outputs["latents"][rows], golden.outputs["tokens"][rows]


# --- the folder ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_convert_writes_the_bundled_folders_layout(converted, family):
    bundled = ROOT / "hub_artifacts" / f"{family}-small"
    # what a trained or calibrated folder adds: statistics, training records, the loss curve
    extras = ("sampler_statistics", "ace_statistics", "training_info.json", "latent_normalization.json", "loss")
    expected = {
        p.relative_to(bundled).as_posix()
        for p in bundled.rglob("*")
        if p.is_file() and not p.relative_to(bundled).as_posix().startswith(extras)
    }
    written = {p.relative_to(converted[family]).as_posix() for p in converted[family].rglob("*") if p.is_file()}
    assert expected <= written, sorted(expected - written)
    index = json.loads((converted[family] / "model_index.json").read_text())
    assert index["_class_name"][-1] == PIPELINES[family].__name__
    assert not [p for p in converted[family].parent.iterdir() if p.name.endswith(".partial")]  # no staging left


def test_the_scheduler_config_holds_the_checkpoints_official_settings(converted):
    elf = json.loads((converted["elf"] / "scheduler" / "scheduler_config.json").read_text())
    assert elf["_class_name"] == "ELFScheduler"
    assert elf["sde_gamma_by_steps"] == {"8": 2.0, "32": 1.5} and elf["sde_gamma"] is None
    assert (elf["noise_scale"], elf["p_mean"], elf["p_std"], elf["t_eps"]) == (2.0, -1.5, 0.8, 0.05)
    assert json.loads((converted["elf"] / "model_index.json").read_text())["sc_cfg_scale"] == 3.0
    langflow = json.loads((converted["langflow"] / "scheduler" / "scheduler_config.json").read_text())
    weights = Golden("langflow_sample_nfe8.safetensors").weights
    loc, scale = weights["proposal.loc"].item(), weights["proposal.scale"].item()
    assert langflow["proposal"] == [loc, scale, 1e-5] and langflow["quantile_eps"] == 1e-5


def test_the_model_card_names_the_source_and_every_settings_origin(converted):
    card = (converted["elf"] / "README.md").read_text()
    assert "elf-official" in card and "checkpoint_7" in card and "ema_params1" in card
    assert "config.yml, sampling_configs[1]" in card  # the 32-step γ, read from the trainer's config
    assert "untied-sc calibrate" in card
    assert "langflow/model.py line 520" in (converted["langflow"] / "README.md").read_text()


# --- the official tokens -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family,nfe", sorted(FIXTURES))
def test_the_converted_folder_reproduces_the_official_sampler_bit_for_bit(converted, family, nfe, monkeypatch):
    pipe, golden = _load(converted[family], family), _golden(family, nfe)
    assert type(pipe.scheduler) is (ELFScheduler if family == "elf" else LangFlowScheduler)
    if family == "elf":  # the settings come from the folder: nothing passed at the call
        sampler = json.loads(golden.metadata["sampler"])
        assert pipe.scheduler.sde_gamma_for(nfe) == sampler["sde_gamma"]
        assert pipe.sc_cfg_scale_for(nfe) == sampler["sc_cfg_scale"]
    calls = replay_official_network(pipe, golden, monkeypatch)  # the sampler alone, bit for bit on any CPU
    output = pipe(**golden_call(golden), output_type="seq")
    latents, tokens = _expected(golden)
    assert len(calls) == nfe
    assert torch.equal(output.latents, latents) and torch.equal(output.sequences, tokens)


@pytest.mark.parametrize("family,nfe", sorted(FIXTURES))
def test_the_converted_folder_free_running_gives_the_official_tokens(converted, family, nfe, monkeypatch):
    pipe, golden = _load(converted[family], family), _golden(family, nfe)
    replay_official_draws(golden, monkeypatch)  # our network, the official draws
    output = pipe(**golden_call(golden), output_type="seq")
    assert torch.equal(output.sequences, _expected(golden)[1])


@pytest.mark.parametrize("family,nfe", sorted(FIXTURES))
def test_untied_at_zero_strength_on_the_converted_folder_is_the_official_sampler(converted, family, nfe, monkeypatch):
    pipe, golden = _load(converted[family], family), _golden(family, nfe)
    pipe.register_modules(sampler_statistics=random_statistics(pipe.transformer, family, steps=(8, 32, 64)))
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, **ZERO)
    assert type(pipe.scheduler) is (UntiedELFScheduler if family == "elf" else UntiedLangFlowScheduler)
    replay_official_network(pipe, golden, monkeypatch)
    output = pipe(**golden_call(golden), output_type="seq")
    latents, tokens = _expected(golden)
    assert torch.equal(output.latents, latents) and torch.equal(output.sequences, tokens)


def test_diffusers_generic_loader_takes_the_converted_folder(converted):
    from diffusers import DiffusionPipeline

    for family, folder in converted.items():
        pipe = DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)
        assert type(pipe) is PIPELINES[family]
        assert pipe.scheduler.config == _load(folder, family).scheduler.config


def test_convert_in_a_subprocess_writes_a_folder_that_samples_the_official_tokens(tmp_path, monkeypatch):
    source = official_elf_folder(tmp_path / "elf-official")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    argv = [sys.executable, "-m", "untied_sc.cli", "convert", "elf", str(source), str(tmp_path / "out")]
    done = subprocess.run([*argv, "--tokenizer", tokenizer], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Wrote ELFPipeline" in done.stdout
    pipe, golden = _load(tmp_path / "out", "elf"), _golden("elf", 8)
    replay_official_draws(golden, monkeypatch)
    assert torch.equal(pipe(**golden_call(golden), output_type="seq").sequences, _expected(golden)[1])


# --- the table of released checkpoints -----------------------------------------------------------------------------


def test_every_released_checkpoint_has_a_record_with_the_source_of_every_value():
    ids = {c.repo_id for c in OFFICIAL_CHECKPOINTS}
    assert ids == {
        "embedded-language-flows/ELF-B-owt-torch",
        "embedded-language-flows/ELF-M-owt-torch",
        "embedded-language-flows/ELF-L-owt-torch",
        "embedded-language-flows/ELF-B-PD-owt-torch",
        "embedded-language-flows/ELF-B-xsum-torch",
        "embedded-language-flows/ELF-B-de-en-torch",
        "Continuous-Rivals-Discrete/langflow-owt",
        "Continuous-Rivals-Discrete/langflow-lm1b",
    }
    for checkpoint in OFFICIAL_CHECKPOINTS:
        sourced = [checkpoint.tokenizer, checkpoint.max_length]
        if checkpoint.sampling is not None:
            for f in dataclasses.fields(checkpoint.sampling):
                value = getattr(checkpoint.sampling, f.name)
                sourced += [value] if isinstance(value, Sourced) else []
                sourced += list(value) if isinstance(value, tuple) else []
        assert all(item.source for item in sourced), checkpoint.repo_id
    assert official_checkpoint("EMBEDDED-LANGUAGE-FLOWS/elf-b-owt-torch").repo_id.endswith("ELF-B-owt-torch")
    assert official_checkpoint("gpt2") is None
    tokenizers = {c.repo_id.split("/")[1]: c.tokenizer.value for c in OFFICIAL_CHECKPOINTS}
    assert tokenizers["ELF-B-owt-torch"] == "t5-small" and tokenizers["langflow-owt"] == "gpt2"
    assert tokenizers["langflow-lm1b"] == "bert-base-uncased"


def test_progressive_distillation_settings_depend_on_the_number_of_steps():
    pd = official_checkpoint("embedded-language-flows/ELF-B-PD-owt-torch").sampling
    gamma = {v.steps: v.value for v in pd.sde_gamma_by_steps}
    scale = {v.steps: v.value for v in pd.sc_cfg_scale_by_steps}
    assert gamma == {2: 1.5, 4: 1.5, 8: 1.5, 16: 2.0, 32: 2.0}
    assert scale == {2: 2.5, 4: 2.5, 8: 2.5, 16: 2.0, 32: 2.0}
    assert all("uncond_fewstep_sampling_configs.yml" in v.source for v in pd.sde_gamma_by_steps)
    base = official_checkpoint("embedded-language-flows/ELF-B-owt-torch").sampling
    assert {v.steps: v.value for v in base.sde_gamma_by_steps} == {8: 2.0, 16: 2.0, 32: 1.5, 64: 1.0}
    assert base.sc_cfg_scale.value == 3.0 and not base.sc_cfg_scale_by_steps


@pytest.fixture
def tiny_released(monkeypatch):
    """The released ELF records at the fixtures' sequence length (12), so that tiny weights stand in for them."""
    table = {
        key: dataclasses.replace(record, max_length=Sourced(12, record.max_length.source))
        for key, record in official_checkpoints._BY_ID.items()
    }
    monkeypatch.setattr(official_checkpoints, "_BY_ID", table)


def _pd_folder(tmp_path: Path) -> Path:
    """The ELF-B-PD repo's layout on tiny weights: a checkpoint, no config.yml."""
    return official_elf_checkpoint(tmp_path / "pd" / "checkpoint_5", _golden("elf", 8).weights).parent


def test_a_local_copy_named_by_official_id_takes_the_tables_per_step_settings(tmp_path, tiny_released, monkeypatch):
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    pd_id = "embedded-language-flows/ELF-B-PD-owt-torch"
    args = ["convert", "elf", str(_pd_folder(tmp_path)), str(tmp_path / "out"), "--official-id", pd_id]
    assert main([*args, "--tokenizer", tokenizer]) == 0
    scheduler = json.loads((tmp_path / "out" / "scheduler" / "scheduler_config.json").read_text())
    index = json.loads((tmp_path / "out" / "model_index.json").read_text())
    assert scheduler["sde_gamma_by_steps"] == {"2": 1.5, "4": 1.5, "8": 1.5, "16": 2.0, "32": 2.0}
    assert index["sc_cfg_scale_by_steps"] == {"2": 2.5, "4": 2.5, "8": 2.5, "16": 2.0, "32": 2.0}
    assert index["sc_cfg_scale"] == 2.5
    assert pd_id in (tmp_path / "out" / "README.md").read_text()
    pipe = _load(tmp_path / "out", "elf")
    assert [pipe.scheduler.sde_gamma_for(n) for n in (8, 16)] == [1.5, 2.0]
    assert [pipe.sc_cfg_scale_for(n) for n in (8, 16, 12)] == [2.5, 2.0, 2.5]
    # A call runs at the folder's w for its NFE, the network getting it at every step and in the decode.
    seen = []
    network = pipe.transformer.forward
    pipe.transformer.forward = lambda *a, **k: (
        seen.append(a[3] if len(a) > 3 else k.get("sc_cfg_scale")) or network(*a, **k)
    )
    for nfe in (8, 16):
        seen.clear()
        pipe(batch_size=1, num_inference_steps=nfe, generator=torch.Generator().manual_seed(0))
        assert set(seen) == {2.5 if nfe == 8 else 2.0} and len(seen) == nfe + 1


@pytest.fixture
def converted_pd(tmp_path, tiny_released) -> Path:
    """The recordings' weights as the ELF-B-PD repo lays them out (a checkpoint, no config.yml), converted as a copy
    of ELF-B-PD-owt-torch: the table's per-NFE settings apply."""
    source = official_elf_checkpoint(tmp_path / "pd" / "checkpoint_5", _golden("elf_pd", 8).weights).parent
    args = ["--official-id", "embedded-language-flows/ELF-B-PD-owt-torch"]
    assert (
        main(["convert", "elf", str(source), str(tmp_path / "out"), *args, "--tokenizer", _tokenizer(tmp_path)]) == 0
    )
    return tmp_path / "out"


def _tokenizer(tmp_path: Path) -> str:
    return tiny_tokenizer_folder(tmp_path / "tokenizer")


@pytest.mark.parametrize("nfe", [8, 16])
def test_the_pd_folder_reproduces_the_official_distillation_sampler(converted_pd, nfe, monkeypatch):
    """
    `elf_pd_sample_nfe{8,16}` are the official sampler of ELF's distillation branch at ELF-B-PD's official settings
    (γ 1.5, w 2.5 at 8 steps; γ 2.0, w 2.0 at 16; `make_pd_sampler_fixtures.py`): the converted folder gives them
    with nothing passed at the call, the sampler alone bit for bit, free running the recorded tokens, and untied at
    zero strength the same bit for bit.
    """
    golden = _golden("elf_pd", nfe)
    sampler = json.loads(golden.metadata["sampler"])
    pipe = _load(converted_pd, "elf")
    assert (pipe.scheduler.sde_gamma_for(nfe), pipe.sc_cfg_scale_for(nfe)) == (
        sampler["sde_gamma"],
        sampler["sc_cfg_scale"],
    )
    latents, tokens = _expected(golden)
    with monkeypatch.context() as patch:  # a fresh load each time: the replay replaces the network's forward
        replay_official_network(pipe, golden, patch)
        output = pipe(**golden_call(golden), output_type="seq")
    assert torch.equal(output.latents, latents) and torch.equal(output.sequences, tokens)
    with monkeypatch.context() as patch:
        replay_official_draws(golden, patch)
        assert torch.equal(_load(converted_pd, "elf")(**golden_call(golden), output_type="seq").sequences, tokens)
    pipe = _load(converted_pd, "elf")
    pipe.register_modules(sampler_statistics=random_statistics(pipe.transformer, "elf", steps=(8, 16)))
    pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, **ZERO)
    with monkeypatch.context() as patch:
        replay_official_network(pipe, golden, patch)
        output = pipe(**golden_call(golden), output_type="seq")
    assert torch.equal(output.latents, latents) and torch.equal(output.sequences, tokens)


def test_the_pd_recordings_differ_from_the_base_settings_recording():
    """The PD settings change the official run: the same weights and seed give other tokens at 8 steps."""
    base, pd = _golden("elf", 8), _golden("elf_pd", 8)
    assert all(torch.equal(base.weights[k], pd.weights[k]) for k in base.weights)
    assert torch.equal(base.outputs["grid"], pd.outputs["grid"])
    assert not torch.equal(base.outputs["tokens"], pd.outputs["tokens"])


def test_a_hugging_face_cache_path_is_recognised_with_its_commit(tmp_path, tiny_released):
    checkpoint = official_elf_checkpoint(tmp_path / "src" / "checkpoint_5", _golden("elf", 8).weights)
    commit = "1234567890abcdef" * 2 + "12345678"
    repo = "embedded-language-flows/ELF-B-owt-torch"
    populate_hub_cache(tmp_path / "cache", repo, {"checkpoint_5": checkpoint}, revision=commit)
    snapshot = tmp_path / "cache" / f"models--{repo.replace('/', '--')}" / "snapshots" / commit
    assert cache_snapshot(snapshot / "checkpoint_5") == (repo, commit)
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    assert main(["convert", "elf", str(snapshot), str(tmp_path / "out"), "--tokenizer", tokenizer]) == 0
    card = (tmp_path / "out" / "README.md").read_text()
    assert repo in card and commit in card and "train_owt_ELF-B.yml" in card


def test_a_hub_id_is_read_through_the_cache_and_names_its_commit(tmp_path, tiny_released, monkeypatch):
    checkpoint = official_elf_checkpoint(tmp_path / "src" / "checkpoint_5", _golden("elf", 8).weights)
    commit = "ab" * 20
    populate_hub_cache(
        tmp_path / "cache", "embedded-language-flows/ELF-M-owt-torch", {"checkpoint_5": checkpoint}, revision=commit
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "cache"))
    pipe = ELFPipeline.from_official(
        "embedded-language-flows/ELF-M-owt-torch", tokenizer=tiny_tokenizer_folder(tmp_path / "tok")
    )
    assert pipe.conversion.settings.origin.commit == commit
    assert pipe.scheduler.config.sde_gamma_by_steps == {"8": 2.0, "16": 2.0, "32": 1.5, "64": 1.0}


# --- refusals ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ELF-B-xsum-torch", "ELF-B-de-en-torch"])
def test_conditional_checkpoints_are_refused_before_any_download(tmp_path, capsys, monkeypatch, name):
    # ELFPipeline takes no prompt: it names the conditional pipeline (`convert` builds that one: test_conditional_convert)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there: a download would fail
    with pytest.raises(ValueError, match="conditional ELF checkpoint") as refused:
        ELFPipeline.from_official(f"embedded-language-flows/{name}")
    assert "ELFText2TextPipeline.from_official" in str(refused.value) and "ELF-B-owt-torch" in str(refused.value)


def test_a_trainer_config_of_a_conditional_run_is_refused(tmp_path, capsys):
    golden = _golden("elf", 8)
    official_elf_checkpoint(tmp_path / "src" / "checkpoint_7", golden.weights)
    config = elf_trainer_config(golden, [], eval_data_path="embedded-language-flows/xsum_validation_t5")
    (tmp_path / "src" / "config.yml").write_text(yaml.dump(config))
    with pytest.raises(ValueError, match="conditional ELF checkpoint") as refused:
        ELFPipeline.from_official(tmp_path / "src")
    assert "eval_data_path" in str(refused.value) and "config.yml" in str(refused.value)


def test_a_checkpoint_without_recorded_settings_names_the_flags_that_give_them(tmp_path, capsys):
    official_elf_checkpoint(tmp_path / "src" / "checkpoint_7", _golden("elf", 8).weights)
    assert main(["convert", "elf", str(tmp_path / "src"), str(tmp_path / "out"), "--max-length", "12"]) == 2
    error = capsys.readouterr().err
    assert "checkpoint_7" in error and "--sde-gamma G and --sc-cfg-scale W" in error and "--official-id" in error
    golden = _golden("langflow", 8)
    official_langflow_folder(tmp_path / "lf", golden)
    assert main(["convert", "langflow", str(tmp_path / "lf"), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "names no tokenizer" in error and "--tokenizer NAME_OR_PATH" in error
    config = elf_trainer_config(_golden("elf", 8), [])
    del config["sampling_configs"]
    (tmp_path / "src" / "config.yml").write_text(yaml.dump(config))
    assert main(["convert", "elf", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert "config.yml has no sampling_configs" in capsys.readouterr().err


def test_an_unknown_layout_is_refused_with_the_files_it_needs(tmp_path, capsys):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "weights.pt").write_bytes(b"")
    assert main(["convert", "elf", str(tmp_path / "src"), str(tmp_path / "out")]) == 2
    assert "No `checkpoint_<step>` file in" in capsys.readouterr().err
    (tmp_path / "lf").mkdir()
    (tmp_path / "lf" / "config.json").write_text("{}")
    tokenizer = ["--tokenizer", "no-such-tokenizer"]  # never fetched: the layout is checked first
    assert main(["convert", "langflow", str(tmp_path / "lf"), str(tmp_path / "out"), *tokenizer]) == 2
    assert "has no model.safetensors" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_of_another_vocabulary_is_refused(tmp_path, capsys):
    source = official_elf_folder(tmp_path / "src")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer", vocab_size=41)
    assert main(["convert", "elf", str(source), str(tmp_path / "out"), "--tokenizer", tokenizer]) == 2
    error = capsys.readouterr().err
    assert "has 41 tokens" in error and "predicts 40 (vocab_size)" in error and "--tokenizer" in error
    assert not (tmp_path / "out").exists()


def test_an_unreachable_hub_names_the_repo_or_the_tokenizer(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    tokenizer = ["--tokenizer", "no-such-tokenizer"]  # never fetched: the checkpoint comes first
    assert main(["convert", "langflow", "someone/langflow-x", str(tmp_path / "out"), *tokenizer]) == 2
    assert "Could not fetch 'someone/langflow-x'" in capsys.readouterr().err
    source = official_elf_folder(tmp_path / "src")  # its config.yml names t5-small, not in this cache
    assert main(["convert", "elf", str(source), str(tmp_path / "out")]) == 2
    error = capsys.readouterr().err
    assert "tokenizer 't5-small'" in error and "HF_HUB_OFFLINE is set" in error and "--tokenizer" in error


def test_nothing_is_half_written(tmp_path, monkeypatch, capsys):
    source = official_elf_folder(tmp_path / "src")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    assert main(["convert", "elf", str(source), str(tmp_path / "out"), "--tokenizer", tokenizer]) == 2
    assert "already exists and is not empty" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]

    def fail_midway(self, save_directory, *args, **kwargs):
        self.transformer.save_pretrained(Path(save_directory) / "transformer")
        raise KeyboardInterrupt

    monkeypatch.setattr(ELFPipeline, "save_pretrained", fail_midway)
    with pytest.raises(KeyboardInterrupt):
        main(["convert", "elf", str(source), str(tmp_path / "out"), "--tokenizer", tokenizer, "--overwrite"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "src", "tokenizer"]  # no staging folder left
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["keep.txt"]  # the old folder untouched
    monkeypatch.undo()
    assert main(["convert", "elf", str(source), str(tmp_path / "out"), "--tokenizer", tokenizer, "--overwrite"]) == 0
    assert (tmp_path / "out" / "model_index.json").is_file() and not (tmp_path / "out" / "keep.txt").exists()


# --- the README's workflow, over HTTP ------------------------------------------------------------------------------

ELF_B = "embedded-language-flows/ELF-B-owt-torch"


def readme_workflow() -> tuple[list[str], str]:
    """The README's workflow as written: the lines of its shell block and its Python block."""
    section = (ROOT / "README.md").read_text().split("\n## Workflow", 1)[1].split("\n## ", 1)[0]
    shell = section.split("```bash\n", 1)[1].split("```", 1)[0]
    python = section.split("```python\n", 1)[1].split("```", 1)[0]
    return [line for line in shell.splitlines() if line.strip()], python


def tiny_elf_b_repo(folder: Path) -> Path:
    """ELF-B-owt-torch's repo layout (one `checkpoint_<step>` of the trainer, no config.yml, a model card) on a tiny
    random network at ELF-B's real length, 1,024 positions: the table's length applies to it as to the real one."""
    torch.manual_seed(0)
    model = ELFTransformerModel(
        latent_dim=8,
        max_length=1024,
        hidden_size=8,
        num_layers=1,
        num_attention_heads=1,
        intermediate_size=16,
        bottleneck_dim=4,
        vocab_size=40,
    )
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # the official initialisation, but a flow head (zero there) and a decoder that vary tokens
        for parameter in (model.final_layer.linear.weight, model.unembed_kernel):
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    official_elf_checkpoint(folder / "checkpoint_5", model.state_dict())
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# ELF-B (OpenWebText), a tiny random stand-in\n")
    return folder


def t5_small_repo(folder: Path) -> Path:
    """t5-small's tokenizer files as its repo holds them (a tokenizer and the model's config.json), for the tiny
    vocabulary of 40 tokens."""
    tiny_tokenizer_folder(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "vocab_size": 40}))
    return folder


@dataclasses.dataclass
class Transcript:
    """What a run printed, step by step, to quote and to show when a step fails."""

    entries: list[str] = dataclasses.field(default_factory=list)

    def add(self, where: str, command: str, done: subprocess.CompletedProcess, seconds: float) -> None:
        # progress bars (carriage returns) left out of stderr: the messages stay
        errors = [line.rsplit("\r", 1)[-1] for line in done.stderr.splitlines()]
        errors = [line for line in errors if line.strip() and "it/s]" not in line and "s/it]" not in line]
        shown = [
            line if len(line) <= 300 else f"{line[:300]} … ({len(line):,} characters)"
            for line in done.stdout.splitlines()
        ]
        text = [f"{where}$ {command}", *shown, *errors]
        self.entries.append("\n".join([*text, f"# exit {done.returncode}, {seconds:.1f} s"]))

    def __str__(self) -> str:
        return "\n\n".join(self.entries)


def run_as_written(
    transcript: Transcript, argv: list[str], shown: str, cwd: Path, env: dict
) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    transcript.add(cwd.name, shown, done, time.monotonic() - started)
    assert done.returncode == 0, f"`{shown}` failed:\n{transcript}\n{done.stderr[-3000:]}"
    return done


def test_the_readmes_workflow_runs_as_written_over_http(hub, loopback_guard, tmp_path, one_thread):  # noqa: F811
    """
    The README's workflow, every line as written, against a local Hub on 127.0.0.1 that serves ELF-B-owt-torch and
    t5-small laid out as the real repos are (tiny stand-ins, at ELF-B's length of 1,024): the first user converts by
    repo id, calibrates and pushes the statistics only, each command a fresh process; the second user, with an empty
    cache and another folder, runs the README's Python in a fresh process: the official weights with the published
    statistics, untied at 8 steps, give the first user's calibrated folder's texts. `pytest -rP` prints the run.
    """
    shell, python = readme_workflow()
    argvs = [shlex.split(line, comments=True) for line in shell]
    assert [argv[:2] for argv in argvs] == [
        ["untied-sc", "convert"],
        ["untied-sc", "calibrate"],
        ["untied-sc", "push-statistics"],
    ]
    convert, calibrate, push = argvs
    assert convert[2:4] == ["elf", ELF_B] and len(convert) == 5
    folder_name, statistics_repo = convert[4], push[3]
    assert calibrate[2] == folder_name and push[2] == folder_name and f'"{statistics_repo}"' in python
    official_commit = hub.commit(ELF_B, tiny_elf_b_repo(tmp_path / "elf-b-repo"), "ELF-B-owt-torch")
    hub.commit("t5-small", t5_small_repo(tmp_path / "t5-small-repo"), "t5-small")

    entry_point = Path(sys.executable).with_name("untied-sc")  # the command the README names, of this environment
    launcher = [str(entry_point)] if entry_point.is_file() else [sys.executable, "-m", "untied_sc.cli"]
    closed = "http://127.0.0.1:9"  # a proxy nobody answers at: any host but the local Hub is unreachable
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")},
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": "hf_local_test_token",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "NO_PROXY": "127.0.0.1,localhost",
        **dict.fromkeys(("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"), closed),
        "OMP_NUM_THREADS": "1",  # torch on one thread: on a machine whose cores are busy a second one only waits
    }
    transcript = Transcript()
    users = {}
    for user in ("first-user", "second-user"):
        users[user] = tmp_path / user
        users[user].mkdir()
    first = {**env, "HF_HOME": str(tmp_path / "hf-home-1"), "HF_HUB_CACHE": str(tmp_path / "cache-1")}
    for line, argv in zip(shell, argvs, strict=True):
        run_as_written(transcript, [*launcher, *argv[1:]], line.split("#", 1)[0].strip(), users["first-user"], first)

    converted = users["first-user"] / folder_name
    record = json.loads((converted / "converted_from.json").read_text())
    assert (record["repo_id"], record["commit"], record["max_length"]) == (ELF_B, official_commit, 1024)
    assert json.loads((converted / "transformer" / "config.json").read_text())["max_length"] == 1024
    statistics = json.loads((converted / "sampler_statistics" / "config.json").read_text())
    assert statistics["calibrated_steps"] == [int(n) for n in calibrate[calibrate.index("--nfe") + 1 :]]
    published = set(hub.files(statistics_repo)) - {".gitattributes"}
    assert published == {
        "sampler_statistics/config.json",
        "sampler_statistics/diffusion_pytorch_model.safetensors",
        "coefficients.json",
        "base_checkpoint.json",
        "README.md",
    }

    script = users["second-user"] / "workflow.py"
    script.write_text(python)
    second = {**env, "HF_HOME": str(tmp_path / "hf-home-2"), "HF_HUB_CACHE": str(tmp_path / "cache-2")}
    shown = "python workflow.py   # the README's Python block"
    done = run_as_written(transcript, [sys.executable, script.name], shown, users["second-user"], second)
    texts = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert sorted(p.name for p in users["second-user"].iterdir()) == ["workflow.py"]  # the official weights, in memory
    cached = {p.name for p in (tmp_path / "cache-2").iterdir() if p.name.startswith("models--")}
    assert cached == {f"models--{repo.replace('/', '--')}" for repo in (ELF_B, "t5-small", statistics_repo)}

    reference = ELFPipeline.from_pretrained(converted)  # the first user's calibrated folder, untied, same call
    reference.set_progress_bar_config(disable=True)
    reference.scheduler = UntiedSelfConditioningScheduler.from_config(reference.scheduler.config)
    expected = reference(batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
    assert texts == expected and len(texts) == 4
    print(transcript)


def test_the_usage_guide_says_the_readmes_workflow_verbatim():
    usage = (ROOT / "docs" / "usage.md").read_text()
    shell, python = readme_workflow()
    assert "```bash\n" + "\n".join(shell) + "\n```" in usage
    assert "```python\n" + python + "```" in usage
