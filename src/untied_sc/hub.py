"""Resolving a local path or a Hugging Face Hub repo id to files on disk."""

import os
from pathlib import Path

from huggingface_hub import snapshot_download


# Keyword arguments that belong to the Hub download, as diffusers' and transformers' loaders name them.
HUB_KWARGS = ("cache_dir", "revision", "token", "force_download", "local_files_only", "proxies")


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), read at call time rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in {"1", "ON", "YES", "TRUE"}


def resolve_local(source: str | os.PathLike, allow_patterns: list[str] | None = None, **hub_kwargs) -> Path:
    """
    Returns `source` if it exists on disk; otherwise takes it as a Hub repo id and returns the downloaded snapshot.

    Offline mode (`HF_HUB_OFFLINE=1` or `local_files_only=True`) reads the Hugging Face cache only.
    """
    path = Path(source).expanduser()
    if path.exists():
        return path
    if str(source).startswith(("/", ".", "~")) or str(source).count("/") != 1:
        raise FileNotFoundError(f"{source!r} is neither an existing path nor a Hub repo id of the form 'owner/name'.")
    hub_kwargs["local_files_only"] = hub_kwargs.get("local_files_only", False) or hub_offline()
    try:
        return Path(snapshot_download(str(source), allow_patterns=allow_patterns, **hub_kwargs))
    except (OSError, ValueError) as error:  # no network, an unknown repo, a gated one: say what was being fetched
        raise FileNotFoundError(
            f"Could not fetch {source!r} from the Hugging Face Hub ({type(error).__name__}: {error}). It is not a "
            "path on this machine either: pass a local file or folder, or check the repo id, the network and "
            "`huggingface-cli login` for gated repos."
        ) from error
