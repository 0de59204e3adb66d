"""A small byte-level BPE tokenizer (HF `tokenizers`) trained on the corpus' train split only.

Fixed settings make it reproducible: byte-level pre-tokenisation without a prefix space, the full 256-byte
alphabet, `min_frequency=2`, four special tokens first (`<|pad|>` 0, `<|bos|>` 1, `<|eos|>` 2, `<|unk|>` 3; byte-level
BPE never needs unk, but the pipeline and transformers expect one). Saved as a `PreTrainedTokenizerFast` folder.

Run `python -m untied_sc_lab.training.tokenizer [--train data/corpus/train.txt] [--out data/tokenizer-8k]`.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast


SPECIAL_TOKENS = {"pad_token": "<|pad|>", "bos_token": "<|bos|>", "eos_token": "<|eos|>", "unk_token": "<|unk|>"}
DEFAULT_VOCAB_SIZE = 8192


def train_tokenizer(
    train_files: str | os.PathLike | list[str | os.PathLike],
    out_dir: str | os.PathLike,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    model_max_length: int = 128,
) -> PreTrainedTokenizerFast:
    """
    Trains the byte-level BPE on `train_files` and saves it (tokenizer.json + configs) to `out_dir`.

    Returns:
        `PreTrainedTokenizerFast`: the tokenizer, as `AutoTokenizer.from_pretrained(out_dir)` loads it.
    """
    files = [str(train_files)] if isinstance(train_files, str | os.PathLike) else [str(f) for f in train_files]
    backend = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train(files, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=model_max_length, **SPECIAL_TOKENS)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out)
    return tokenizer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m untied_sc_lab.training.tokenizer", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--train", default="data/corpus/train.txt", help="training text (the train split only)")
    parser.add_argument("--out", default="data/tokenizer-8k")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    args = parser.parse_args(argv)
    tokenizer = train_tokenizer(args.train, args.out, args.vocab_size)
    sample = "It is a truth universally acknowledged, that a single man in possession of a good fortune."
    ids = tokenizer(sample)["input_ids"]
    info = {"vocab_size": len(tokenizer), "sample_tokens": len(ids), "round_trip": tokenizer.decode(ids) == sample}
    print(f"wrote {args.out}: {json.dumps(info)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
