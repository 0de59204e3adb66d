"""Tiny real components for tests: a word-level tokenizer whose ids fit the tiny models."""

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def tiny_tokenizer(vocab_size: int = 40) -> PreTrainedTokenizerFast:
    """pad = 0, eos = 1 (T5's ids, so ELF's EOS cut applies), unk = 2, then words `w3`, `w4`, …"""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>")
