"""Sample-quality metrics: generative perplexity, unigram entropy, repetition, diversity, throughput
(docs/algorithm.md §6).

Everything here scores texts and token ids; nothing imports the pipelines.

Generative perplexity (GenPPL) re-tokenises decoded text with a causal LM evaluator and reports

    GenPPL = exp( Σ_i Σ_t w_it · NLL_it / Σ_i Σ_t w_it ),

pooled over all tokens of all samples, where NLL_it = -log p(x_t | x_<t) and the weights w_it follow one of the two
official protocols (`../shared/research/upstream.md` §1.7 and §2.7):

`"elf"` (ELF `Metrics.record_generative_perplexity` and `scripts/eval_ppl.py`):
    1. Samples that are empty or whitespace-only (`not text.strip()`) are dropped; nothing else is filtered.
    2. The kept texts are tokenised with the tokenizer's defaults (`add_special_tokens=True`), truncated to
       `max_length`, and right-padded with EOS (the official code sets pad = eos).
    3. The padded ids are cut into chunks of `context_size` columns; each chunk is scored on its own (no context
       carried across chunks, and a chunk's first token is never a target).
    4. Per chunk, with ids y (pads included), the MDLM/DUO weights on the targets y_1..y_{T-1} are
       `w = [cumsum(y == eos) == 1][1:] + [y != eos][1:]`: every non-EOS token counts once and the first EOS (in
       practice the first pad, i.e. the end of the text) counts once, so the evaluator is also scored on ending the
       text. Two quirks are kept on purpose: a non-EOS token between the first and the second EOS of a chunk gets
       weight 2 (only possible when the text itself contains the evaluator's EOS string), and the cumulative sum
       restarts in every chunk. The attention mask plays no part in the weights.
    5. Entropy: per kept sample, the unigram entropy of its evaluator ids (truncated, unpadded), averaged.

`"langflow"` (LangFlow `gen_ppl.py`):
    1. No sample is dropped; generator special tokens stay in the text (decode with `skip_special_tokens=False`).
    2. Texts are tokenised with the tokenizer's defaults and truncated to `max_length` (the evaluator context); no
       chunking and no EOS special-casing.
    3. `labels = ids` with padding set to -100; the HF mean loss times Σ(len - 1) is the batch's NLL, i.e. every token
       after the first of each sample counts once: w_it = 1 for t = 1..len_i - 1.
    4. Entropy: per sample, the unigram entropy of the generator's token ids (not re-tokenised), averaged.

Shared conventions and deviations (both protocols):

- The first token of a sample is context only, never a target. GPT-2 (the papers' evaluator) and SmolLM2
  (`add_bos_token=False`) add no BOS, so neither protocol scores a sample's first token; an evaluator whose tokenizer
  adds a BOS scores it, exactly as the official code would. No BOS is inserted here.
- Padding is always on the right and built here (not by the tokenizer), so causal attention makes every real token's
  logits independent of padding. For `"elf"` a batch is padded to `min(longest in the whole set, longest in the
  batch + 1)`: the official code pads the whole set to its longest sample, and the weights then only depend on
  whether a pad follows a sample, which this reproduces without paying for the extra padding.
- NLLs are `logsumexp(logits) - logit[target]` in float32 and accumulated in float64. The `"langflow"` total equals the
  official "batch mean loss × token count" up to rounding; the per-sample values come from the batched forward pass
  rather than the official separate unpadded re-scoring (identical up to rounding).
- For speed (none of it changes a score beyond rounding): the texts are tokenised once, sorted by length and batched
  by a token budget ([`length_batches`]); a pass runs only the rows and columns that carry a weight, and only the
  weighted positions are projected onto the vocabulary ([`weighted_nll_sums`]).
- The official scorers ran GPT-2-large in bfloat16 (ELF) or float16 (LangFlow on CUDA); here the dtype is whatever the
  evaluator was loaded with (`"auto"` by default: bfloat16 where the device computes it natively, else float32).
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from untied_sc.generation import word_ngrams

from .evaluator import evaluator_context_size


PROTOCOLS = ("elf", "langflow")


def _check_protocol(protocol: str) -> None:
    if protocol not in PROTOCOLS:
        raise ValueError(f"Unknown GenPPL protocol {protocol!r}; expected one of {PROTOCOLS}.")


@dataclass
class SampleNLLs:
    """Per-sample scores of one protocol. Sample i contributes `nll_sum[i]` nats over `num_tokens[i]` weighted tokens.

    Attributes:
        nll_sum (`torch.Tensor` of shape `(N,)`, float64): weighted sum of token NLLs of each sample.
        num_tokens (`torch.Tensor` of shape `(N,)`, int64): sum of the token weights of each sample.
        scored (`torch.Tensor` of shape `(N,)`, bool): False for samples the protocol drops (`"elf"`: empty texts).
        evaluator_ids (`list[list[int]]`): each sample's evaluator token ids after truncation (`[]` when dropped).
    """

    nll_sum: torch.Tensor
    num_tokens: torch.Tensor
    scored: torch.Tensor
    evaluator_ids: list[list[int]]

    @property
    def mean_nll(self) -> torch.Tensor:
        """Per-sample NLL per token (log of the sample's perplexity); NaN where a sample has no scored token."""
        has_tokens = self.num_tokens > 0
        return torch.where(has_tokens, self.nll_sum / self.num_tokens.clamp(min=1), float("nan"))


@dataclass
class GenerativePerplexity:
    """GenPPL of a set of samples and the per-sample values behind it.

    Attributes:
        gen_ppl (`float`): exp(nll_per_token).
        nll_per_token (`float`): Σ nll_sum / Σ num_tokens over all samples.
        num_tokens (`int`): Σ num_tokens.
        protocol (`str`): `"elf"` or `"langflow"`.
        per_sample ([`SampleNLLs`]): the per-sample sums, counts and evaluator ids.
    """

    gen_ppl: float
    nll_per_token: float
    num_tokens: int
    protocol: str
    per_sample: SampleNLLs


def perplexity_from_nlls(nll_sum, num_tokens) -> float:
    """Pooled perplexity exp(Σ nll_sum / Σ num_tokens) of per-sample NLL sums and token counts (NaN if no tokens)."""
    nll_sum = torch.as_tensor(nll_sum, dtype=torch.float64)
    num_tokens = torch.as_tensor(num_tokens, dtype=torch.float64)
    total = float(num_tokens.sum())
    return math.exp(float(nll_sum.sum()) / total) if total > 0 else float("nan")


def elf_token_weights(ids: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """The MDLM/DUO weights `[cumsum(ids == eos) == 1][:, 1:] + [ids != eos][:, 1:]` of one chunk, shape (B, T-1).

    `ids` is a (B, T) chunk whose padding is EOS. Every non-EOS target counts once, the first EOS counts once, and a
    non-EOS target between the first and second EOS counts twice (the official quirk, kept).
    """
    is_eos = ids == eos_token_id
    first_eos = is_eos.long().cumsum(dim=-1) == 1
    return first_eos[:, 1:].long() + (~is_eos)[:, 1:].long()


@torch.no_grad()
def token_nlls(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """NLL_t = logsumexp(logits_{t-1}) - logits_{t-1}[x_t] of targets t = 1..T-1, shape (B, T-1), in float32."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    targets = input_ids[:, 1:].unsqueeze(-1)
    return torch.logsumexp(logits.float(), dim=-1) - logits.gather(-1, targets).squeeze(-1).float()


# Architectures whose logits are `lm_head(base_model(...).last_hidden_state)`, then Gemma's soft cap where configured:
# for these only the scored positions go through the vocabulary projection (Gemma 3 270M: 63% of its weights).
_HEAD_ON_HIDDEN_STATES = ("llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "gpt2")
# Logit elements per vocabulary-projection chunk (128 MB in float32): bounds memory at Gemma's 262k vocabulary.
_LOGITS_PER_CHUNK = 2**25
# Tokens per forward pass when the batch size is automatic: on a 2-core AVX2 CPU throughput is flat from ~1k tokens.
AUTO_BATCH_TOKENS = 2048


def _split_head(model):
    """`(body, head, soft_cap)` of a causal LM whose logits are head(body(...).last_hidden_state), else `None`."""
    config = getattr(model, "config", None)
    if getattr(config, "model_type", None) not in _HEAD_ON_HIDDEN_STATES:
        return None
    body, head = getattr(model, model.base_model_prefix, None), model.get_output_embeddings()
    if body is None or head is None:
        return None
    return body, head, getattr(config, "final_logit_softcapping", None)


def _nll_of_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """logsumexp(logits) - logits[target] per row, in float32 (as [`token_nlls`])."""
    return torch.logsumexp(logits.float(), dim=-1) - logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1).float()


@torch.no_grad()
def weighted_nll_sums(
    model, ids: torch.Tensor, mask: torch.Tensor, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """
    Σ_t w_t · NLL_t per row of a right-padded chunk (float64) and Σ_t w_t (int64), for `weights` (B, T-1) on the
    targets t = 1..T-1 of `ids`/`mask` (B, T); the same numbers as weighting [`token_nlls`], for less work.

    Only rows and columns that a positive weight needs are run (the last column is a target only, trailing padding
    is never an input), and only the scored positions are projected onto the vocabulary, in bounded chunks.
    """
    sums = torch.zeros(ids.shape[0], dtype=torch.float64)
    counts = weights.sum(dim=-1).cpu().long()
    rows, columns = (weights > 0).nonzero(as_tuple=True)  # target t = column + 1 is read at position `column`
    if rows.numel() == 0:
        return sums, counts
    active = torch.unique(rows)
    width = int(columns.max()) + 1
    local = torch.searchsorted(active, rows)  # the row's index among the active rows
    inputs, attention = ids[active, :width], mask[active, :width]
    targets = ids[rows, columns + 1]
    split = _split_head(model)
    if split is None:
        logits = model(input_ids=inputs, attention_mask=attention).logits
        nlls = _nll_of_logits(logits[local, columns], targets)
    else:
        body, head, soft_cap = split
        hidden = body(input_ids=inputs, attention_mask=attention).last_hidden_state[local, columns]
        step = max(1, _LOGITS_PER_CHUNK // head.weight.shape[0])
        parts = []
        for start in range(0, hidden.shape[0], step):
            logits = head(hidden[start : start + step])
            if soft_cap is not None:
                logits = torch.tanh(logits / soft_cap) * soft_cap
            parts.append(_nll_of_logits(logits, targets[start : start + step]))
        nlls = torch.cat(parts)
    contribution = nlls.double() * weights[rows, columns].double()
    sums.index_add_(0, rows.cpu(), contribution.cpu())
    return sums, counts


def _pad_right(rows: Sequence[Sequence[int]], width: int, pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.as_tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return ids.to(device), mask.to(device)


def length_batches(lengths: Sequence[int], batch_size: int | None = None, max_tokens: int = AUTO_BATCH_TOKENS):
    """
    Indices into `lengths` grouped into batches of similar length, longest first (ties in index order): each batch is
    `batch_size` samples, or with `batch_size=None` as many as keep samples × longest ≤ `max_tokens` (at least one).

    Sorting leaves little padding, and each sample's score does not depend on its batch (right padding under causal
    attention), so the order only changes the speed. E.g. `length_batches([3, 9, 5], 2)` → `[[1, 2], [0]]`.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches, start = [], 0
    while start < len(order):
        if batch_size is not None:
            size = batch_size
        else:  # the first sample is the batch's longest
            size = max(1, max_tokens // max(lengths[order[start]], 1))
        batches.append(order[start : start + size])
        start += size
    return batches


def sample_nlls(
    texts: Sequence[str],
    model,
    tokenizer,
    protocol: str = "elf",
    batch_size: int | None = None,
    max_length: int | None = None,
    context_size: int | None = None,
    eos_token_id: int | None = None,
) -> SampleNLLs:
    """Per-sample NLL sums and token counts of `texts` under a causal LM evaluator, following one official protocol.

    See the module docstring for the exact rules of each protocol and every deviation. The texts are tokenised once,
    sorted by length and batched with little padding ([`length_batches`]); the result is in the order of `texts`.

    Args:
        texts (`Sequence[str]`): decoded samples.
        model: a causal LM returning `.logits` (e.g. from [`load_evaluator`]).
        tokenizer: the evaluator's tokenizer.
        protocol (`str`, defaults to `"elf"`): `"elf"` or `"langflow"`.
        batch_size (`int`, *optional*): samples per forward pass; by default as many as fit `AUTO_BATCH_TOKENS`
            tokens. Scores do not depend on it beyond rounding (~1e-7 relative).
        max_length (`int`, *optional*): truncation length in evaluator tokens; defaults to the evaluator's context
            ([`evaluator_context_size`]; 1024 for GPT-2, as in both papers).
        context_size (`int`, *optional*): `"elf"` only: chunk width; defaults to `max_length` (the official setting,
            under which no chunking happens).
        eos_token_id (`int`, *optional*): `"elf"` only: the EOS id used for padding and weighting; defaults to the
            tokenizer's.

    Returns:
        [`SampleNLLs`] with one entry per text, in order.
    """
    _check_protocol(protocol)
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"`batch_size` must be at least 1, got {batch_size}.")
    max_length = max_length or evaluator_context_size(model, tokenizer)
    if protocol == "elf":
        context_size = context_size or max_length
        eos_token_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
        if eos_token_id is None:
            raise ValueError("The 'elf' protocol pads and weights with EOS, but the tokenizer has no eos_token_id.")
        if context_size is None or context_size < 2:
            raise ValueError(f"The 'elf' protocol needs a context of at least 2 tokens, got {context_size}.")
        pad_id = eos_token_id
    else:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device

    scored = [protocol == "langflow" or bool(text.strip()) for text in texts]
    kept = [i for i, keep in enumerate(scored) if keep]
    encoded = (
        tokenizer(
            [texts[i] for i in kept], add_special_tokens=True, truncation=max_length is not None, max_length=max_length
        )["input_ids"]
        if kept
        else []
    )
    evaluator_ids = [[] for _ in texts]
    for i, ids in zip(kept, encoded, strict=True):
        evaluator_ids[i] = list(ids)
    longest = max((len(ids) for ids in encoded), default=0)

    nll_sum = torch.zeros(len(texts), dtype=torch.float64)
    num_tokens = torch.zeros(len(texts), dtype=torch.long)
    for batch in length_batches([len(ids) for ids in encoded], batch_size):
        rows = torch.tensor([kept[j] for j in batch])
        batch_ids = [encoded[j] for j in batch]
        if protocol == "elf":
            # The official code pads the whole set to its longest sample: a sample shorter than that is followed by
            # a pad (its first EOS is a target), the longest is not.
            width = min(longest, max(len(ids) for ids in batch_ids) + 1)
            ids, mask = _pad_right(batch_ids, width, pad_id, device)
            for chunk in range(0, width, context_size):
                chunk_ids, chunk_mask = ids[:, chunk : chunk + context_size], mask[:, chunk : chunk + context_size]
                sums, counts = weighted_nll_sums(
                    model, chunk_ids, chunk_mask, elf_token_weights(chunk_ids, eos_token_id)
                )
                nll_sum.index_add_(0, rows, sums)
                num_tokens.index_add_(0, rows, counts)
        else:
            ids, mask = _pad_right(batch_ids, max(len(ids) for ids in batch_ids), pad_id, device)
            sums, counts = weighted_nll_sums(model, ids, mask, mask[:, 1:])
            nll_sum.index_add_(0, rows, sums)
            num_tokens.index_add_(0, rows, counts)
    return SampleNLLs(nll_sum, num_tokens, torch.tensor(scored), evaluator_ids)


def generative_perplexity(
    texts: Sequence[str], model, tokenizer, protocol: str = "elf", **kwargs
) -> GenerativePerplexity:
    """GenPPL = exp(Σ_i nll_sum_i / Σ_i num_tokens_i) of `texts` under one official protocol.

    Args:
        texts, model, tokenizer, protocol: as in [`sample_nlls`].
        **kwargs: `batch_size`, `max_length`, `context_size`, `eos_token_id`, passed to [`sample_nlls`].

    Returns:
        [`GenerativePerplexity`], including the per-sample values for paired comparisons.

    Raises:
        ValueError: if no token was scored (e.g. every sample is empty).
    """
    per_sample = sample_nlls(texts, model, tokenizer, protocol=protocol, **kwargs)
    total_tokens = int(per_sample.num_tokens.sum())
    if total_tokens == 0:
        raise ValueError(f"No token of the {len(texts)} samples was scored (all empty or single-token?).")
    nll_per_token = float(per_sample.nll_sum.sum()) / total_tokens
    return GenerativePerplexity(math.exp(nll_per_token), nll_per_token, total_tokens, protocol, per_sample)


def unigram_entropy(ids) -> float:
    """Unigram entropy H = -Σ_v p_v ln p_v (nats) of one sample's token ids, p_v the frequency of id v in the sample.

    Returns NaN for an empty sample. E.g. `[1, 1, 2, 2]` → ln 2.
    """
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        return float("nan")
    counts = torch.unique(ids, return_counts=True)[1].double()
    p = counts / counts.sum()
    return float(-(p * p.log()).sum())


def mean_unigram_entropy(samples) -> tuple[float, list[float]]:
    """Mean over samples of [`unigram_entropy`], and the per-sample values (empty samples are NaN and skipped).

    `samples` is a sequence of id sequences, or a (N, L) tensor (one sample per row, every position counted, as
    LangFlow's entropy of generator ids does).
    """
    per_sample = [unigram_entropy(ids) for ids in samples]
    finite = [h for h in per_sample if not math.isnan(h)]
    return (sum(finite) / len(finite) if finite else float("nan")), per_sample


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n of a set of texts: #unique word n-grams / #word n-grams, pooled over all texts (0 if none)."""
    ngrams = [gram for text in texts for gram in word_ngrams(text, n)]
    return len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def token_ngrams(ids: Sequence[int], n: int) -> list[tuple[int, ...]]:
    """The n-grams of one sample's token ids."""
    if n < 1:
        raise ValueError(f"`n` must be at least 1, got {n}.")
    ids = [int(i) for i in ids]
    return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]


def token_repetition(ids: Sequence[int], n: int = 4) -> float:
    """Rep-n on token ids: the fraction of a sample's id n-grams that repeat an earlier one, 1 - #unique / #total.

    The subword-level twin of [`word_repetition`]: it sees loops inside a word ("unlylylyly" is one word but repeats
    "ly" as a token) that the word level misses. 0 for fewer than `n` ids. E.g. `[5, 6, 5, 6, 5, 6]` has five
    2-grams, two unique → Rep-2 = 0.6.
    """
    ngrams = token_ngrams(ids, n)
    return 1.0 - len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def token_distinct_n(samples: Sequence[Sequence[int]], n: int) -> float:
    """Distinct-n on token ids: #unique id n-grams / #id n-grams, pooled over samples (0 if none)."""
    ngrams = [gram for ids in samples for gram in token_ngrams(ids, n)]
    return len(set(ngrams)) / len(ngrams) if ngrams else 0.0


def longest_repeated_run(ids: Sequence[int], max_period: int = 4) -> int:
    """Length in tokens of the longest stretch that repeats one unit of at most `max_period` ids back to back.

    A stretch s[i:j] counts when s[k] = s[k - p] for every k in [i + p, j) with some period p ≤ `max_period`, and it
    holds the unit at least twice (j - i ≥ 2p); 0 when there is none. "just just just" is a run of 3 (p = 1);
    `[7, 1, 2, 1, 2, 1, 2, 9]` a run of 6 (p = 2).
    """
    ids = [int(i) for i in ids]
    longest = 0
    for period in range(1, max_period + 1):
        matches = 0  # consecutive positions k with s[k] == s[k - period]
        for k in range(period, len(ids)):
            matches = matches + 1 if ids[k] == ids[k - period] else 0
            if matches >= period:
                longest = max(longest, matches + period)
    return longest


def samples_per_second(num_samples: int, seconds: float) -> float:
    """Throughput num_samples / seconds."""
    if seconds <= 0:
        raise ValueError(f"`seconds` must be positive, got {seconds}.")
    return num_samples / seconds


def retained_throughput(official_sps: float, untied_sps: float) -> float:
    """Fraction of the official sampler's throughput that the untied sampler keeps: untied_sps / official_sps."""
    if official_sps <= 0:
        raise ValueError(f"`official_sps` must be positive, got {official_sps}.")
    return untied_sps / official_sps
