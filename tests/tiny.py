"""Tiny real components for tests: a word-level tokenizer whose ids fit the tiny models."""

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def tiny_tokenizer(vocab_size: int = 40) -> PreTrainedTokenizerFast:
    """pad = 0, eos = 1 (T5's ids, so ELF's EOS cut applies), unk = 2, then words `w3`, `w4`, …"""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")


def tiny_tokenizer_folder(folder, vocab_size: int = 40) -> str:
    """`tiny_tokenizer` saved to `folder` (what `--tokenizer PATH` takes); returns the path as a string."""
    tiny_tokenizer(vocab_size).save_pretrained(folder)
    return str(folder)


def random_statistics(model, solver: str, steps=(8, 32), seed: int = 0):
    """SamplerStatistics with the model's real overlap basis and random per-step moments (for scheduler tests)."""
    import torch

    from untied_sc.calibration import overlap_basis_from_model
    from untied_sc.schedulers.sampler_statistics import SamplerStatistics, StepStatistics, num_update_steps

    generator = torch.Generator().manual_seed(seed)
    basis = overlap_basis_from_model(model)
    q, rho_sq = basis.storage_tensors()
    per_step = {}
    for n in steps:
        k = num_update_steps(solver, n)
        rms = torch.rand(k, generator=generator) + 0.1
        rms[0] = 0.0  # an inactive step, as the reference schedule produces early on
        per_step[n] = StepStatistics(
            mean=0.05 * torch.randn(k, q.shape[0], generator=generator) * (rms > 0)[:, None],
            rms=rms,
            cosine_distance=torch.rand(k, generator=generator) * (rms > 0),
        )
    return SamplerStatistics.build(model, solver, q, rho_sq, (0.8, 0.9), per_step)


def tiny_llama(vocab_size: int, eos_token_id: int, seed: int = 0):
    """A 1-layer random Llama (weights ~ N(0, 0.5²) drawn from `seed`, large enough that every token gets a distinct
    NLL): a real LM."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        eos_token_id=eos_token_id,
        pad_token_id=eos_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def tiny_evaluator(seed: int = 0):
    """`tiny_llama` over `tiny_tokenizer`'s vocabulary (`</s>` = 1 is its EOS and pad), with that tokenizer; another
    `seed` is another evaluator of the same vocabulary."""
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    return tiny_llama(len(tokenizer), tokenizer.eos_token_id, seed), tokenizer


def scored_run(
    nll_sum,
    num_tokens,
    *,
    sampler: str = "official",
    nfe: int = 8,
    seed: int = 0,
    value: float | None = None,
    mean_nll=None,
    entropy: float | None = None,
    sample_entropy=None,
    gen_ppl: float | None = None,
):
    """A scored run record (`experiments/records.py`) with these per-sample columns and scores, the rest filled in
    (per-token NLLs from the sums by default, the other scores `None`, one sample per second)."""
    from untied_sc_lab.experiments.records import SCORE_METRICS, PerSample, RunRecord, RunScores

    if mean_nll is None:
        mean_nll = [nll / tokens for nll, tokens in zip(nll_sum, num_tokens, strict=True)]
    count = len(nll_sum)
    per_sample = PerSample(mean_nll, nll_sum, num_tokens, sample_entropy)
    metrics = dict.fromkeys(SCORE_METRICS) | {"gen_ppl": gen_ppl, "entropy": entropy}
    scores = RunScores(count, count, 1.0, metrics, sum(num_tokens), per_sample)
    return RunRecord(sampler, nfe, seed, value, float(count), scores=scores)


def paired_cell(gen_ppl_ratio: float, gen_ppl_ratio_ci: list[float]) -> dict:
    """A report's paired cell (JSON) with this raw GenPPL ratio and interval, one seed's placeholders elsewhere."""
    from untied_sc_lab.evaluation.aggregates import MeanSE, PairedSummary

    return PairedSummary(
        baseline="official",
        seeds=[0],
        gen_ppl_ratio=gen_ppl_ratio,
        gen_ppl_ratio_ci=gen_ppl_ratio_ci,
        gen_ppl_ratio_per_seed=MeanSE(gen_ppl_ratio, None, 1),
        num_pairs=1,
        fraction_b_worse=0.0,
        fraction_tied=0.0,
        mean_delta=0.0,
        mean_delta_ci=[0.0, 0.0],
        fraction_b_worse_ci=[0.0, 0.0],
        num_dropped=0,
        retained_throughput=MeanSE(1.0, None, 1),
    ).to_json()
