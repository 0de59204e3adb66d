"""`untied-sc convert elf` of a conditional checkpoint: the official conditional recording's tiny weights written as
the official trainer writes them (`checkpoint_<step>` beside its `config.yml`), or laid out in the Hugging Face cache
under a released repo id, converted to an ELFText2TextPipeline folder that samples the recorded tokens."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from untied_sc import ELFPipeline, ELFText2TextPipeline, UntiedELFScheduler
from untied_sc.cli import main
from untied_sc.models import official_checkpoints
from untied_sc.models.official_checkpoints import Sourced, official_checkpoint

from .hub_cache import populate_hub_cache
from .test_convert_pipeline import official_elf_checkpoint
from .test_pipelines_conditional import GOLDEN, components, replay_draws, replay_network, run
from .tiny import tiny_tokenizer, tiny_tokenizer_folder


CASE = "ode8_cfg2_sc1"  # the official conditional setting's shape: the ODE, guidance 2, SC-CFG 1 (at 8 steps)
DE_EN = "embedded-language-flows/ELF-B-de-en-torch"


def conditional_trainer_config(sampling: list[dict] | None = None, **overrides) -> dict:
    """The `config.yml` the official trainer writes for a conditional run (the keys of `train_de-en_ELF-B.yml`)."""
    run_settings = GOLDEN.run
    config = {
        "data_path": "embedded-language-flows/wmt14_de-en_train_t5",
        "eval_data_path": "embedded-language-flows/wmt14_de-en_validation_t5",
        "max_length": run_settings["max_length"],
        "max_input_length": run_settings["max_input_length"],
        "pad_token": run_settings["pad_token"],
        "encoder_model_name": "t5-small",
        "latent_mean": run_settings["latent_mean"],
        "latent_std": run_settings["latent_std"],
        "model": "ELF-B",
        "denoiser_p_mean": -1.5,
        "denoiser_p_std": 0.8,
        "denoiser_noise_scale": 2.0,
        "t_eps": 0.05,
        "sampling_configs_path": "src/configs/sampling_configs/cond_sampling_configs.yml",
        "sampling_configs": sampling if sampling is not None else [cond_entry()],
        "seed": 42,
    }
    return {**config, **overrides}


def cond_entry(steps=8, cfg=2, w=1, method="ode") -> dict:
    return {
        "sampling_method": method,
        "num_sampling_steps": [steps],
        "cfgs": [cfg],
        "self_cond_cfg_scales": [w],
        "time_schedule": "logit_normal",
    }


def conditional_folder(folder: Path, config: dict | None = None) -> Path:
    official_elf_checkpoint(folder / "checkpoint_7", GOLDEN.weights)
    (folder / "config.yml").write_text(yaml.dump(config or conditional_trainer_config(), sort_keys=False))
    return folder


def encoder_folder(folder: Path) -> str:
    components()[1].save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("conditional")
    source = conditional_folder(root / "trainer-output")
    tokenizer, encoder = tiny_tokenizer_folder(root / "tok"), encoder_folder(root / "t5")
    code = main(
        ["convert", "elf", str(source), str(root / "out"), "--tokenizer", tokenizer, "--text-encoder", encoder]
    )
    assert code == 0
    return root / "out"


def load(folder: Path, **kwargs) -> ELFText2TextPipeline:
    pipe = ELFText2TextPipeline.from_pretrained(folder, **kwargs)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_convert_writes_a_complete_conditional_pipeline_folder(converted):
    index = json.loads((converted / "model_index.json").read_text())
    assert index["_class_name"][-1] == "ELFText2TextPipeline"
    assert index["text_encoder"] == ["transformers", "T5EncoderModel"]
    for part in ("transformer", "scheduler", "tokenizer", "text_encoder"):
        assert (converted / part).is_dir(), part
    assert index["max_source_length"] == GOLDEN.run["max_input_length"]
    assert index["guidance_scale"] == 2.0 and index["sc_cfg_scale"] == 1.0 and index["pad_token"] == "eos"
    assert index["latent_std"] == GOLDEN.run["latent_std"]
    assert json.loads((converted / "scheduler" / "scheduler_config.json").read_text())["sde_gamma_by_steps"] == {
        "8": 0.0
    }
    record = json.loads((converted / "converted_from.json").read_text())
    assert record["checkpoint_file"] == "checkpoint_7" and record["max_length"] == GOLDEN.run["max_length"]
    card = (converted / "README.md").read_text()
    assert "ELFText2TextPipeline" in card and "max_input_length" in card and "cfgs" in card
    assert "text encoder (T5EncoderModel)" in card and "--text-encoder" in card and "prompt=" in card


def test_the_converted_folder_reproduces_the_official_conditional_sampler_bit_for_bit(converted, monkeypatch):
    pipe = load(converted)
    replay_draws(CASE, monkeypatch)
    replay_network(pipe, CASE, monkeypatch)
    output, trajectory = run(pipe, CASE)
    assert torch.equal(trajectory, GOLDEN.cases[CASE]["trajectory"])
    assert torch.equal(output.sequences, GOLDEN.cases[CASE]["tokens"])


def test_the_converted_folder_free_running_gives_the_official_tokens(converted, monkeypatch):
    pipe = load(converted)
    replay_draws(CASE, monkeypatch)
    # The folder's own defaults (guidance 2, SC-CFG 1 from the trainer's sampling_configs): the recorded setting.
    output = pipe(
        prompt=GOLDEN.run["prompts"],
        num_inference_steps=8,
        generator=torch.Generator().manual_seed(GOLDEN.run["seed"]),
        output_type="seq",
    )
    assert torch.equal(output.sequences, GOLDEN.cases[CASE]["tokens"])


def test_untied_at_zero_strength_on_the_converted_folder_is_the_official_sampler(converted, monkeypatch):
    official = load(converted)
    scheduler = UntiedELFScheduler.from_config(official.scheduler.config, eta_r=0.0, eta_t=0.0, eta_o=0.0, alpha=1.0)
    pipe = load(converted, scheduler=scheduler)
    replay_draws(CASE, monkeypatch)
    replay_network(pipe, CASE, monkeypatch)
    output, trajectory = run(pipe, CASE)
    assert torch.equal(trajectory, GOLDEN.cases[CASE]["trajectory"])
    assert torch.equal(output.sequences, GOLDEN.cases[CASE]["tokens"])


# --- the released checkpoints, by their Hub id -------------------------------------------------------------------


@pytest.fixture
def tiny_released(monkeypatch):
    """The released conditional records at the recording's lengths (12 positions, 6 of them the source)."""
    table = {}
    for key, record in official_checkpoints._BY_ID.items():
        record = dataclasses.replace(record, max_length=Sourced(GOLDEN.run["max_length"], record.max_length.source))
        if record.conditioning is not None:
            length = Sourced(GOLDEN.run["max_input_length"], record.conditioning.max_source_length.source)
            record = dataclasses.replace(
                record, conditioning=dataclasses.replace(record.conditioning, max_source_length=length)
            )
        table[key] = record
    monkeypatch.setattr(official_checkpoints, "_BY_ID", table)


def t5_small_in_cache(cache: Path, tmp_path: Path) -> None:
    """The tiny encoder and tokenizer under the id the official code loads, `t5-small`, in the Hugging Face cache."""
    encoder, tokenizer = Path(encoder_folder(tmp_path / "t5")), Path(tiny_tokenizer_folder(tmp_path / "t5-tok"))
    files = {p.name: p for folder in (encoder, tokenizer) for p in folder.iterdir()}
    populate_hub_cache(cache, "t5-small", files)


def offline_cache(monkeypatch, cache: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)


def test_a_released_id_takes_the_official_conditional_settings_and_t5_small(tmp_path, tiny_released, monkeypatch):
    cache = tmp_path / "cache"
    checkpoint = official_elf_checkpoint(tmp_path / "src" / "checkpoint_5", GOLDEN.weights)
    populate_hub_cache(cache, DE_EN, {"checkpoint_5": checkpoint}, revision="cd" * 20)
    t5_small_in_cache(cache, tmp_path)
    offline_cache(monkeypatch, cache)
    assert main(["convert", "elf", DE_EN, str(tmp_path / "out")]) == 0
    pipe = load(tmp_path / "out")
    assert pipe.config.guidance_scale == 2.0 and pipe.sc_cfg_scale == 1.0
    assert pipe.scheduler.config.sde_gamma == 0.0 and pipe.config.max_source_length == GOLDEN.run["max_input_length"]
    card = (tmp_path / "out" / "README.md").read_text()
    for source in (
        "cond_sampling_configs.yml line 3 (cfgs: [2])",
        "cond_sampling_configs.yml line 4 (self_cond_cfg_scales: [1])",
        "cond_sampling_configs.yml line 1 (sampling_method: ode",
        "train_de-en_ELF-B.yml line 5 (max_input_length)",
        "train_de-en_ELF-B.yml line 11 (latent_std)",
        "src/modules/t5_encoder.py line 51",
        "cd" * 20,
    ):
        assert source in card, source
    replay_draws(CASE, monkeypatch)
    output = pipe(
        prompt=GOLDEN.run["prompts"],
        num_inference_steps=8,
        generator=torch.Generator().manual_seed(GOLDEN.run["seed"]),
        output_type="seq",
    )
    assert torch.equal(output.sequences, GOLDEN.cases[CASE]["tokens"])


def test_the_table_records_both_conditional_checkpoints_with_every_source():
    for name, length, source_length in (("xsum", 1088, 1024), ("de-en", 128, 64)):
        record = official_checkpoint(f"embedded-language-flows/ELF-B-{name}-torch")
        assert record.max_length.value == length and record.conditioning.max_source_length.value == source_length
        assert record.conditioning.text_encoder.value == "t5-small" and record.conditioning.guidance_scale.value == 2
        assert record.sampling.sde_gamma.value == 0.0 and record.sampling.sc_cfg_scale.value == 1.0
        assert record.evaluation_steps.value == (64,)
        fields = [getattr(record.conditioning, f.name) for f in dataclasses.fields(record.conditioning)]
        assert all(" line " in f.source for f in fields), name


def test_elf_pipeline_from_official_refuses_a_conditional_checkpoint_before_any_download(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing answers there: a download would fail
    with pytest.raises(ValueError, match="ELFText2TextPipeline.from_official"):
        ELFPipeline.from_official(DE_EN, tokenizer=tiny_tokenizer())


# --- bad input ------------------------------------------------------------------------------------------------------


def test_conditional_flags_to_an_unconditional_checkpoint_are_refused(tmp_path, capsys):
    config = conditional_trainer_config()
    for key in ("eval_data_path", "max_input_length"):
        config.pop(key)
    source = conditional_folder(tmp_path / "src", config)
    assert main(["convert", "elf", str(source), str(tmp_path / "out"), "--text-encoder", "t5-small"]) == 2
    error = capsys.readouterr().err
    assert "--text-encoder" in error and "unconditional" in error and "leave them out" in error
    with pytest.raises(ValueError, match="ELFPipeline.from_official"):
        ELFText2TextPipeline.from_official(source, tokenizer=tiny_tokenizer(), text_encoder=components()[1])
    assert not (tmp_path / "out").exists()


def test_an_encoder_of_another_width_is_refused_naming_the_flag(tmp_path, capsys):
    from transformers import T5Config, T5EncoderModel

    source = conditional_folder(tmp_path / "src")
    wide = {**GOLDEN.encoder_config, "d_model": 24, "d_kv": 6}
    T5EncoderModel(T5Config(**wide)).save_pretrained(tmp_path / "wide")
    tokenizer = tiny_tokenizer_folder(tmp_path / "tok")
    args = ["convert", "elf", str(source), str(tmp_path / "out"), "--tokenizer", tokenizer]
    assert main([*args, "--text-encoder", str(tmp_path / "wide")]) == 2
    error = capsys.readouterr().err
    assert "24-wide latents" in error and "--text-encoder NAME_OR_PATH" in error and "checkpoint_7" in error
    assert main([*args, "--text-encoder", str(tmp_path / "missing")]) == 2
    assert "The text encoder" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_missing_conditional_settings_name_their_flags(tmp_path, capsys):
    tokenizer, encoder = tiny_tokenizer_folder(tmp_path / "tok"), encoder_folder(tmp_path / "t5")
    flags = ["--tokenizer", tokenizer, "--text-encoder", encoder]
    no_sampling = conditional_folder(tmp_path / "a", conditional_trainer_config(sampling=[]))
    assert main(["convert", "elf", str(no_sampling), str(tmp_path / "out"), *flags]) == 2
    assert "--sde-gamma G and --sc-cfg-scale W" in capsys.readouterr().err
    assert main(["convert", "elf", str(no_sampling), str(tmp_path / "out"), *flags, "--sde-gamma", "0"]) == 2
    assert "--sc-cfg-scale W" in capsys.readouterr().err
    given = [*flags, "--sde-gamma", "0", "--sc-cfg-scale", "1"]
    assert main(["convert", "elf", str(no_sampling), str(tmp_path / "out"), *given]) == 2
    assert "--guidance-scale G" in capsys.readouterr().err
    assert main(["convert", "elf", str(no_sampling), str(tmp_path / "out"), *given, "--guidance-scale", "2"]) == 0
    two_guidances = conditional_folder(tmp_path / "b", conditional_trainer_config([cond_entry(), cond_entry(64, 3)]))
    assert main(["convert", "elf", str(two_guidances), str(tmp_path / "out2"), *flags]) == 2
    assert "--guidance-scale G" in capsys.readouterr().err
    disagree = ["--guidance-scale", "2", "--max-source-length", "5"]
    assert main(["convert", "elf", str(no_sampling), str(tmp_path / "out3"), *given, *disagree]) == 2
    assert "disagrees with 6" in capsys.readouterr().err


# --- docs/usage.md, as written ---------------------------------------------------------------------------------------


def usage_section() -> str:
    text = (Path(__file__).resolve().parents[1] / "docs" / "usage.md").read_text()
    return text.split("## ELF with a source text", 1)[1].split("\n## ", 1)[0]


def test_the_usage_guides_convert_calibrate_and_untied_example_run_as_written(tmp_path, monkeypatch, one_thread):
    """docs/usage.md's conditional commands and their Python, every line as written, on the released id's table
    lengths (128 positions, 64 of them the source): the official recording's tiny weights (no learned positions:
    they run at any length) under `ELF-B-de-en-torch` and the tiny T5 under `t5-small`, in the Hugging Face cache."""
    import shlex

    section = usage_section()
    commands = [line for line in section.split("```bash\n", 1)[1].split("```", 1)[0].splitlines() if line]
    example = section.split("```python\n")[3].split("```", 1)[0]
    argvs = [shlex.split(c) for c in commands]
    assert [argv[:2] for argv in argvs] == [["untied-sc", "convert"], ["untied-sc", "calibrate"]]
    calibrate = argvs[1]
    prompt_file = calibrate[calibrate.index("--prompts") + 1]
    nfes = [int(n) for n in calibrate[calibrate.index("--nfe") + 1 :] if n.isdigit()]
    cache = tmp_path / "cache"
    checkpoint = official_elf_checkpoint(tmp_path / "src" / "checkpoint_5", GOLDEN.weights)
    populate_hub_cache(cache, DE_EN, {"checkpoint_5": checkpoint})
    t5_small_in_cache(cache, tmp_path)
    offline_cache(monkeypatch, cache)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / prompt_file).write_text("\n".join(GOLDEN.run["prompts"]) + "\n")  # the prompt file the doc names
    for argv in argvs:
        assert main(argv[1:]) == 0, argv
    index = json.loads((work / argvs[0][4] / "model_index.json").read_text())
    assert index["max_source_length"] == 64
    assert json.loads((work / argvs[0][4] / "transformer" / "config.json").read_text())["max_length"] == 128
    scope = {}
    exec(compile(example, "docs/usage.md", "exec"), scope)
    assert type(scope["pipe"].scheduler).__name__ == "UntiedELFScheduler"
    assert scope["pipe"].sampler_statistics.config.calibrated_steps == nfes
    assert len(scope["out"].texts) == 1 and isinstance(scope["out"].texts[0], str)
