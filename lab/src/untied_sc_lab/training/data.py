"""Token streams and random windows for training: a split's paragraphs, tokenised and packed end to end.

Every paragraph keeps its trailing newline, so the packed stream is the text file itself, tokenised paragraph by
paragraph (a token never spans two paragraphs). Training draws random windows of `seq_len` tokens at uniform
offsets from a `torch.Generator`; nothing here touches the global RNG.
"""

import hashlib
import os
from pathlib import Path

import torch


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary and merges (the cache key of tokenised splits)."""
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    payload = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def tokenize_paragraphs(paragraphs: list[str], tokenizer, batch: int = 4096) -> torch.Tensor:
    """Concatenated ids of `paragraph + "\\n"` for each paragraph, without special tokens (int32, 1-D)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    ids: list[int] = []
    for start in range(0, len(paragraphs), batch):
        chunk = [p + "\n" for p in paragraphs[start : start + batch]]
        if backend is not None:  # the fast path, and no "longer than model_max_length" warnings
            rows = [encoding.ids for encoding in backend.encode_batch(chunk, add_special_tokens=False)]
        else:
            rows = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        for row in rows:
            ids.extend(row)
    return torch.tensor(ids, dtype=torch.int32)


def load_split_tokens(text_file: str | os.PathLike, tokenizer, cache_dir: str | os.PathLike | None = None):
    """
    The token stream of a split file (one paragraph per line), cached as `<cache_dir>/<name>-<fingerprint>.pt`.

    Returns:
        `torch.Tensor` (int32, 1-D).
    """
    path = Path(text_file)
    text = path.read_text(encoding="utf-8")
    text_hash = hashlib.sha256(text.encode()).hexdigest()[:12]
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"{path.stem}-{text_hash}-{tokenizer_fingerprint(tokenizer)}.pt"
        if cache.exists():
            return torch.load(cache)
    tokens = tokenize_paragraphs([line for line in text.split("\n") if line], tokenizer)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save(tokens, cache)
    return tokens


def sample_windows(tokens: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """`batch_size` windows of `seq_len` tokens at uniform random offsets (int64, `(batch, seq_len)`)."""
    if tokens.numel() < seq_len:
        raise ValueError(f"The token stream has {tokens.numel()} tokens, fewer than seq_len={seq_len}.")
    offsets = torch.randint(0, tokens.numel() - seq_len + 1, (batch_size,), generator=generator)
    index = offsets[:, None] + torch.arange(seq_len)[None]
    return tokens[index].long()


def fixed_windows(tokens: torch.Tensor, count: int, seq_len: int, seed: int = 0) -> torch.Tensor:
    """`count` windows at offsets drawn once from `seed` (the same windows on every call): for evaluation."""
    return sample_windows(tokens, count, seq_len, torch.Generator().manual_seed(seed))


def unigram_entropy(tokens: torch.Tensor, vocab_size: int, reference: torch.Tensor | None = None) -> float:
    """
    Cross-entropy (nats per token) of `tokens` under the unigram distribution of `reference` (default: `tokens`
    itself, which gives its entropy), with add-one smoothing when a reference is given.
    """
    reference = tokens if reference is None else reference
    counts = torch.bincount(reference.long().flatten(), minlength=vocab_size).double()
    if reference is not tokens:
        counts = counts + 1.0
    log_p = (counts / counts.sum()).clamp_min(1e-300).log()
    own = torch.bincount(tokens.long().flatten(), minlength=vocab_size).double()
    return float(-(own * log_p).sum() / own.sum())
