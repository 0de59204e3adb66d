"""The flow-map family's converter, pipeline folder and command line, on checkpoints in the official Lightning format.

A checkpoint is built here as the official trainer writes one (`lightning_module.py` `on_save_checkpoint`: the
LightningModule's `state_dict` with `model.*` and the frozen `encoder.*` weights, `ema = {"decay", "shadow"}`), from
the recorded official weights as the EMA and other, raw, weights: the conversion must take the EMA, as the official
evaluation does (`eval_lightning.py` lines 146-152).
"""

import argparse
import json

import pytest
import torch
import yaml

from untied_sc.cli import main
from untied_sc.models.convert import UnsafeCheckpointError
from untied_sc.models.flowmap_transformer import load_official_flowmap
from untied_sc.pipelines.pipeline_flowmap import FlowMapPipeline, convert_flowmap_pipeline
from untied_sc.schedulers.scheduling_elf import ELFScheduler
from untied_sc.schedulers.scheduling_flowmap import CDEQScheduler, FlowMapLMScheduler

from .test_flowmap_official import RECORDINGS


def official_weights(name: str) -> dict[str, torch.Tensor]:
    return {k.removeprefix("weight."): v for k, v in RECORDINGS[name].tensors.items() if k.startswith("weight.")}


# The trainer's config.yml (`train_lightning.py` writes it beside last.ckpt): the stage flags of each variant.
STAGE_FLAGS = {
    "fmlm_star": {"elfmap_enabled": True, "double_time_emb": True, "elfmap_teacher_is_cdeq": True},
    "elf_star": {"cdeq_enabled": True, "double_time_emb": True},
    "elf_teacher": {},
}


def lightning_checkpoint(path, name="fmlm_star", ema=True, pickled=False, config=True, sc_free=True):
    ema_weights = official_weights(name)
    raw = {f"model.{k}": v + 0.5 for k, v in ema_weights.items()}
    payload = {
        "state_dict": {**raw, "encoder.model.wte.weight": torch.ones(3, 4)},
        "_my_opt_step": 7,
        "epoch": 1,
    }
    if ema:
        payload["ema"] = {"decay": 0.9999, "shadow": dict(ema_weights)}
    if pickled:
        payload["hyper_parameters"] = argparse.Namespace(max_length=8)  # not a plain tensor/container: a pickle
    torch.save(payload, path)
    if config:
        flags = {"max_length": 8, **STAGE_FLAGS[name], "elfmap_student_sc_free": sc_free}
        (path.parent / "config.yml").write_text(yaml.safe_dump(flags))
    return path


def test_converter_swaps_in_the_ema_weights(tmp_path):
    path = lightning_checkpoint(tmp_path / "fmlm_star.ckpt")
    model = load_official_flowmap(path, "fmlm-star")
    ours = model.state_dict()
    for key, value in official_weights("fmlm_star").items():
        key = "final_layer.norm_final.weight" if key == "final_layer.norm.weight" else key
        assert torch.equal(ours[key], value), key
    raw = load_official_flowmap(path, "fmlm-star", weights="raw").state_dict()
    assert torch.equal(raw["t_emb_tokens"], official_weights("fmlm_star")["t_emb_tokens"] + 0.5)
    assert model.config.const_phase == 0.002 and model.config.two_time
    (tmp_path / "star").mkdir()
    star = lightning_checkpoint(tmp_path / "star" / "elf_star.ckpt", name="elf_star")
    assert load_official_flowmap(star, "elf-star").config.const_phase is None


def test_converter_refuses_pickles_unless_allowed(tmp_path):
    path = lightning_checkpoint(tmp_path / "fmlm_star.ckpt", pickled=True)
    with pytest.raises(UnsafeCheckpointError, match="allow_pickle"):
        load_official_flowmap(path, "fmlm-star")
    model = load_official_flowmap(path, "fmlm-star", allow_pickle=True)
    assert torch.equal(model.state_dict()["unembed_bias"], official_weights("fmlm_star")["unembed_bias"])


def test_settings_come_from_the_trainer_config_or_are_required(tmp_path):
    path = lightning_checkpoint(tmp_path / "fmlm_star.ckpt", config=False)
    with pytest.raises(ValueError, match="--max-length N.*--self-conditioning free"):
        load_official_flowmap(path, "fmlm-star")
    assert load_official_flowmap(path, "fmlm-star", max_length=8, self_conditioning="free").config.max_length == 8
    lightning_checkpoint(path)  # now with config.yml (max_length 8, FMLM*)
    with pytest.raises(ValueError, match="training config of fmlm-star.*--variant fmlm-star"):
        load_official_flowmap(path, "elf-star")
    with pytest.raises(ValueError, match="max_length=16 disagrees with 8"):
        load_official_flowmap(path, "fmlm-star", max_length=16)


def test_a_chained_checkpoint_converts_to_the_chained_sampler(tmp_path, one_thread):
    lightning_checkpoint(tmp_path / "fmlm_star.ckpt", sc_free=False)
    pipe = convert_flowmap_pipeline(tmp_path / "fmlm_star.ckpt", tmp_path / "pipe", "fmlm-star")
    assert FlowMapPipeline.from_pretrained(tmp_path / "pipe").scheduler.config.self_conditioning == "chained"
    pipe.set_progress_bar_config(disable=True)
    out = pipe(batch_size=2, num_inference_steps=2, generator=torch.Generator().manual_seed(42), output_type="seq")
    assert torch.equal(out.sequences, RECORDINGS["fmlm_star"].run("ctm_hybrid_g0.75_n2")["ids"])  # γ(2) = 0.75


def test_converter_errors_name_the_fix(tmp_path):
    path = lightning_checkpoint(tmp_path / "fmlm_star.ckpt", ema=False)
    with pytest.raises(ValueError, match="no EMA weights.*weights='raw'"):
        load_official_flowmap(path, "fmlm-star")
    with pytest.raises(ValueError, match="Unknown variant"):
        load_official_flowmap(path, "fmlm")
    with pytest.raises(FileNotFoundError, match="elf_star.ckpt"):
        load_official_flowmap(tmp_path, "elf-star")
    torch.save({"params": {}}, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="no 'state_dict'"):
        load_official_flowmap(tmp_path / "other.ckpt", "fmlm-star")


def test_cli_convert_then_pipeline_gives_the_official_tokens(tmp_path, one_thread):
    source = lightning_checkpoint(tmp_path / "fmlm_star.ckpt")
    out = tmp_path / "pipe"
    assert main(["convert", "flowmap", str(source), str(out), "--variant", "fmlm-star"]) == 0
    pipe = FlowMapPipeline.from_pretrained(out)
    assert isinstance(pipe.scheduler, FlowMapLMScheduler) and pipe.config.sc_cfg_scale == 5.0
    pipe.set_progress_bar_config(disable=True)
    run = RECORDINGS["fmlm_star"].run("ctm_g1.0_n4")  # the official config at 4 steps: ctm, γ = 1.0, w = 5.0
    ids = pipe(batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(42), output_type="seq")
    assert torch.equal(ids.sequences, run["ids"])
    # an existing folder is kept unless --overwrite; nothing half-written is left beside it
    assert main(["convert", "flowmap", str(source), str(out), "--variant", "fmlm-star"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.yml", "fmlm_star.ckpt", "pipe"]


def test_elf_star_pipeline_folder_round_trip(tmp_path, one_thread):
    source = lightning_checkpoint(tmp_path / "elf_star.ckpt", name="elf_star")
    pipe = convert_flowmap_pipeline(tmp_path, tmp_path / "pipe", "elf-star")
    loaded = FlowMapPipeline.from_pretrained(tmp_path / "pipe")
    assert isinstance(loaded.scheduler, CDEQScheduler) and loaded.scheduler.config.gamma == 1.5
    assert source.is_file()
    run = RECORDINGS["elf_star"].run("cdeq_g1.5_n8")
    for p in (pipe, loaded):
        p.set_progress_bar_config(disable=True)
        out = p(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(42), output_type="seq")
        assert torch.equal(out.sequences, run["ids"])


def test_teacher_pipeline_folder_gives_the_official_sde_tokens(tmp_path, one_thread):
    lightning_checkpoint(tmp_path / "elf.ckpt", name="elf_teacher")
    convert_flowmap_pipeline(tmp_path / "elf.ckpt", tmp_path / "pipe", "elf")
    pipe = FlowMapPipeline.from_pretrained(tmp_path / "pipe")
    assert isinstance(pipe.scheduler, ELFScheduler) and not pipe.transformer.config.two_time
    assert pipe.scheduler.sde_gamma_for(32) == 1.5 and pipe.transformer.config.num_phase_tokens == 0
    pipe.scheduler = ELFScheduler.from_config(pipe.scheduler.config, sde_gamma=1.5)  # the recorded run's γ
    pipe.set_progress_bar_config(disable=True)
    out = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(42), output_type="seq")
    assert torch.equal(out.sequences, RECORDINGS["elf_teacher"].run("sde_g1.5_n8")["ids"])


def test_convert_takes_the_flow_map_options_only_for_flow_maps(tmp_path, capsys):
    source = lightning_checkpoint(tmp_path / "fmlm_star.ckpt")
    out = str(tmp_path / "pipe")
    assert main(["convert", "flowmap", str(source), out]) == 2  # which stage the weights are: they cannot say
    assert "needs --variant" in capsys.readouterr().err
    assert main(["convert", "flowmap", str(source), out, "--variant", "fmlm-star", "--sde-gamma", "1"]) == 2
    assert "--sde-gamma: not options of a flow-map (FMLM*, ELF*) checkpoint" in capsys.readouterr().err
    assert main(["convert", "flowmap", str(source), out, "--variant", "fmlm-star", "--weights", "ema_params1"]) == 2
    assert "weights must be 'ema' or 'raw'" in capsys.readouterr().err
    assert main(["convert", "langflow", str(source), out, "--variant", "fmlm-star"]) == 2
    assert "--variant: not options of a LangFlow checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "pipe").exists()


def test_a_saved_config_that_does_not_fit_the_weights_names_the_field(tmp_path, one_thread):
    lightning_checkpoint(tmp_path / "fmlm_star.ckpt")
    pipe = convert_flowmap_pipeline(tmp_path / "fmlm_star.ckpt", tmp_path / "pipe", "fmlm-star")
    config_path = tmp_path / "pipe" / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    layers = pipe.transformer.config.num_layers
    config_path.write_text(json.dumps({**config, "num_layers": layers + 1}))
    with pytest.raises(ValueError, match=f"num_layers = {layers + 1} in config.json, {layers} in the weights"):
        FlowMapPipeline.from_pretrained(tmp_path / "pipe")
