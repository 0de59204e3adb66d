"""Serialization, dtype/device loading, the converters, the CLI, and clear errors on bad input."""

import argparse
import json

import pytest
import torch
from safetensors.torch import save_file

from untied_sc import ELFTransformerModel, LangFlowTransformerModel, load_official_elf, load_official_langflow
from untied_sc.cli import main as cli_main
from untied_sc.models import ELF_PRESETS, UnsafeCheckpointError

from .conftest import elf_from_golden, langflow_from_golden
from .hub_cache import populate_hub_cache
from .tiny import tiny_tokenizer_folder


def _elf_inputs(model, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (2, model.config.max_length, model.config.latent_dim)
    return torch.randn(shape, generator=g), torch.tensor([0.2, 0.7]), torch.randn(shape, generator=g)


def _write_official_elf_checkpoint(path, weights, extra=None):
    payload = {
        "params": {k: v + 1 for k, v in weights.items()},  # the raw weights differ from the EMA ones on purpose
        "ema_params1": weights,
        "opt_state": {"state": {}, "param_groups": [{"lr": 1e-3, "params": [0]}]},
        "lr_scheduler": None,
        "step": 7,
        "epoch": 1,
        "dropout_rng": None,
        "grad_accum_buffers": {},
    }
    payload.update(extra or {})
    torch.save(payload, path)


def _write_official_langflow_folder(folder, golden):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "LangFlow", **golden.config}))
    save_file(golden.weights, folder / "model.safetensors")


# --- save/load and dtypes ---------------------------------------------------------------------------------------


@torch.no_grad()
def test_elf_save_pretrained_round_trip_is_exact(tmp_path, elf_golden):
    model = elf_from_golden(elf_golden)
    model.save_pretrained(tmp_path)
    reloaded = ELFTransformerModel.from_pretrained(tmp_path)
    z, t, m = _elf_inputs(model)
    a = model(z, t, m, 3.0, decoder_step_active=True)
    b = reloaded(z, t, m, 3.0, decoder_step_active=True)
    assert torch.equal(a.sample, b.sample) and torch.equal(a.logits, b.logits)


@torch.no_grad()
def test_langflow_save_pretrained_round_trip_is_exact(tmp_path, langflow_golden):
    model = langflow_from_golden(langflow_golden)
    model.save_pretrained(tmp_path)
    reloaded = LangFlowTransformerModel.from_pretrained(tmp_path)
    z, gamma, m = (langflow_golden.inputs[k] for k in ("latent", "gamma", "self_cond"))
    assert torch.equal(model(z, gamma, m).logits, reloaded(z, gamma, m).logits)
    assert reloaded.gumbel_parameters() == model.gumbel_parameters()


@pytest.mark.parametrize("keyword", ["dtype", "torch_dtype"])
@torch.no_grad()
def test_from_pretrained_accepts_dtype_and_device_map(tmp_path, tiny_langflow, tiny_elf, keyword):
    tiny_langflow.save_pretrained(tmp_path / "langflow")
    tiny_elf.save_pretrained(tmp_path / "elf")
    langflow = LangFlowTransformerModel.from_pretrained(
        tmp_path / "langflow", **{keyword: torch.bfloat16}, device_map="cpu"
    )
    elf = ELFTransformerModel.from_pretrained(tmp_path / "elf", **{keyword: torch.bfloat16}, device_map="cpu")
    for model in (langflow, elf):
        assert model.dtype == torch.bfloat16 and model.device.type == "cpu"
    z = torch.randn(1, 12, 32, dtype=torch.bfloat16)
    logits = langflow(z, 5.0).logits
    reference = tiny_langflow(z.float(), 5.0).logits
    assert (logits.float() - reference).abs().max() < 0.1 * reference.abs().max()
    out = elf(torch.randn(1, 12, 16), 0.5, sc_cfg_scale=3.0, decoder_step_active=True)
    assert out.sample.dtype == torch.bfloat16 and torch.isfinite(out.logits).all()


def test_from_pretrained_rejects_both_dtype_keywords(tmp_path, tiny_elf):
    tiny_elf.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="either `dtype` or `torch_dtype`"):
        ELFTransformerModel.from_pretrained(tmp_path, dtype=torch.float16, torch_dtype=torch.float16)


def test_presets_have_the_official_sizes():
    for name, sizes in ELF_PRESETS.items():
        model = ELFTransformerModel.from_preset(name, max_length=8, vocab_size=10, num_layers=1)
        assert model.config.hidden_size == sizes["hidden_size"]
        assert model.config.intermediate_size == int(int(4 * sizes["hidden_size"]) * 2 / 3)
    # ELF-B at its real size: the README's 105M parameters (with the T5 vocabulary of 32100).
    elf_b = ELFTransformerModel.from_preset("elf-b")
    assert 104e6 < sum(p.numel() for p in elf_b.parameters()) < 106e6
    with pytest.raises(ValueError, match="Unknown ELF preset"):
        ELFTransformerModel.from_preset("elf-xl")


# --- bad input --------------------------------------------------------------------------------------------------


def test_elf_rejects_wrong_latent_width(tiny_elf):
    with pytest.raises(ValueError, match="latent_dim=16"):
        tiny_elf(torch.randn(2, 12, 15), 0.5, sc_cfg_scale=3.0)


def test_elf_rejects_sequence_length_other_than_its_rope_tables(tiny_elf):
    with pytest.raises(ValueError, match="RoPE tables are built for max_length=12"):
        tiny_elf(torch.randn(2, 13, 16), 0.5, sc_cfg_scale=3.0)


def test_elf_rejects_mismatched_self_conditioning_and_missing_scale(tiny_elf):
    with pytest.raises(ValueError, match="self_conditioning"):
        tiny_elf(torch.randn(2, 12, 16), 0.5, torch.randn(3, 12, 16), sc_cfg_scale=3.0)
    with pytest.raises(ValueError, match="sc_cfg_scale` is required"):
        tiny_elf(torch.randn(2, 12, 16), 0.5)
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        tiny_elf(torch.randn(2, 12, 16), torch.rand(3), sc_cfg_scale=3.0)


def test_langflow_rejects_wrong_latent_width(tiny_langflow):
    with pytest.raises(ValueError, match="hidden_size=32"):
        tiny_langflow(torch.randn(2, 12, 31), 5.0)


def test_langflow_reuses_its_normalised_embedding_only_within_the_block_and_while_unchanged(tiny_langflow):
    model = tiny_langflow
    z, logits = torch.randn(2, 12, 32), torch.randn(2, 12, 40)
    with torch.no_grad():
        fresh = (model(z, 5.0).logits, model.clean_prediction(logits))
        with model.reuse_embedding_matrix():
            first = model.embedding_matrix()
            with model.reuse_embedding_matrix():  # nested: the same table
                assert model.embedding_matrix() is first
            assert model.embedding_matrix() is first  # normalised once
            reused = (model(z, 5.0).logits, model.clean_prediction(logits))
            model.backbone.vocab_embed.embedding.mul_(2.0)  # in place: the table must be normalised again
            assert model.embedding_matrix() is not first
        assert model.embedding_matrix() is not model.embedding_matrix()  # outside the block: every call
    assert all(torch.equal(a, b) for a, b in zip(fresh, reused, strict=True))
    with model.reuse_embedding_matrix():
        with torch.no_grad():
            stored = model.embedding_matrix()
        assert model.embedding_matrix().requires_grad and not stored.requires_grad  # with grad: in the graph


# --- converters -------------------------------------------------------------------------------------------------


@torch.no_grad()
def test_official_elf_checkpoint_converts_to_the_ema_weights(tmp_path, elf_golden):
    for step in (3, 7):  # the newest step wins, as in the official loader
        weights = elf_golden.weights if step == 7 else {k: v * 0 for k, v in elf_golden.weights.items()}
        _write_official_elf_checkpoint(tmp_path / f"checkpoint_{step}", weights)
    model = load_official_elf(tmp_path, max_length=elf_golden.config["max_length"])
    reference = elf_from_golden(elf_golden)
    for key, value in reference.state_dict().items():
        assert torch.equal(model.state_dict()[key], value), key
    assert model.config.num_attention_heads == elf_golden.config["num_heads"]
    assert model.config.num_mode_tokens == elf_golden.config["num_model_mode_tokens"]


def test_pickled_elf_checkpoint_is_refused_without_opt_in(tmp_path, elf_golden):
    path = tmp_path / "checkpoint_1"
    _write_official_elf_checkpoint(path, elf_golden.weights, {"args": argparse.Namespace(lr=1.0)})
    with pytest.raises(UnsafeCheckpointError, match="allow_pickle=True"):
        load_official_elf(path, max_length=12)
    model = load_official_elf(path, max_length=12, allow_pickle=True)
    assert torch.equal(model.self_cond_proj.weight, elf_golden.weights["self_cond_proj.weight"])


def test_corrupt_checkpoints_give_clear_errors(tmp_path, elf_golden, langflow_golden):
    path = tmp_path / "checkpoint_1"
    _write_official_elf_checkpoint(path, elf_golden.weights)
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_official_elf(path)
    folder = tmp_path / "langflow"
    _write_official_langflow_folder(folder, langflow_golden)
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="corrupt or truncated"):
        load_official_langflow(folder)


def test_missing_and_unexpected_keys_are_listed(tmp_path, elf_golden, langflow_golden):
    weights = dict(elf_golden.weights)
    del weights["blocks.1.attn.proj.bias"]
    weights["extra.weight"] = torch.zeros(1)
    _write_official_elf_checkpoint(tmp_path / "checkpoint_1", weights)
    with pytest.raises(ValueError, match=r"missing keys \(1\): blocks.1.attn.proj.bias.*unexpected keys \(1\): extra"):
        load_official_elf(tmp_path, max_length=12)
    folder = tmp_path / "langflow"
    _write_official_langflow_folder(folder, langflow_golden)
    broken = dict(langflow_golden.weights)
    broken["backbone.self_cond_proj.weight"] = torch.zeros(32, 32)
    save_file(broken, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"shape mismatches \(1\): backbone.self_cond_proj.weight"):
        load_official_langflow(folder)


@torch.no_grad()
def test_official_langflow_folder_converts_with_proposal_from_weights(tmp_path, langflow_golden):
    _write_official_langflow_folder(tmp_path, langflow_golden)
    model = load_official_langflow(tmp_path)
    reference = langflow_from_golden(langflow_golden)
    z, gamma = langflow_golden.inputs["latent"], langflow_golden.inputs["gamma"]
    assert torch.equal(model(z, gamma).logits, reference(z, gamma).logits)
    assert model.gumbel_parameters()[0] == langflow_golden.weights["proposal.loc"].item()


def test_converters_load_by_repo_id_from_the_hub_cache(tmp_path, monkeypatch, elf_golden, langflow_golden):
    _write_official_elf_checkpoint(tmp_path / "checkpoint_7", elf_golden.weights)
    _write_official_langflow_folder(tmp_path / "lf", langflow_golden)
    cache = tmp_path / "cache"
    populate_hub_cache(cache, "someone/elf-tiny", {"checkpoint_7": tmp_path / "checkpoint_7"})
    populate_hub_cache(
        cache, "someone/langflow-tiny", {n: tmp_path / "lf" / n for n in ("config.json", "model.safetensors")}
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    elf = load_official_elf("someone/elf-tiny", max_length=12, cache_dir=cache)
    assert torch.equal(elf.unembed_bias, elf_golden.weights["unembed_bias"])
    langflow = load_official_langflow("someone/langflow-tiny", cache_dir=cache)
    assert torch.equal(langflow.proposal.scale, langflow_golden.weights["proposal.scale"])


def test_cli_convert_writes_loadable_pipeline_folders(tmp_path, capsys, elf_golden, langflow_golden):
    tokenizer = tiny_tokenizer_folder(tmp_path / "tokenizer")
    _write_official_elf_checkpoint(tmp_path / "checkpoint_7", elf_golden.weights)
    elf_args = ["--max-length", "12", "--sde-gamma", "1.5", "--sc-cfg-scale", "3", "--tokenizer", tokenizer]
    assert cli_main(["convert", "elf", str(tmp_path / "checkpoint_7"), str(tmp_path / "elf"), *elf_args]) == 0
    assert torch.equal(
        ELFTransformerModel.from_pretrained(tmp_path / "elf", subfolder="transformer").mode_tokens,
        elf_golden.weights["mode_tokens"],
    )
    _write_official_langflow_folder(tmp_path / "lf", langflow_golden)
    lf_args = ["--tokenizer", tokenizer]
    assert cli_main(["convert", "langflow", str(tmp_path / "lf"), str(tmp_path / "lf-out"), *lf_args]) == 0
    assert (
        LangFlowTransformerModel.from_pretrained(tmp_path / "lf-out", subfolder="transformer").config.num_layers == 2
    )
    assert "Wrote" in capsys.readouterr().out
    assert cli_main(["convert", "elf", str(tmp_path / "nowhere" / "x"), str(tmp_path / "o")]) == 2
    assert "SOURCE '" in (err := capsys.readouterr().err) and "no such file or folder on this machine" in err


def test_models_name_their_family_and_keep_it_after_a_round_trip(tmp_path, tiny_elf, tiny_langflow):
    assert ELFTransformerModel.family == "elf" and LangFlowTransformerModel.family == "langflow"
    for model in (tiny_elf, tiny_langflow):
        model.save_pretrained(tmp_path / model.family)
        reloaded = type(model).from_pretrained(tmp_path / model.family)
        assert reloaded.family == model.family
        assert "family" not in reloaded.config  # a class attribute, not a config key
