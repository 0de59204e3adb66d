"""Resolving a local path or a Hugging Face Hub repo id to files on disk."""

import difflib
import os
from pathlib import Path
from urllib.parse import urlparse

from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError


# Keyword arguments that belong to the Hub download, as diffusers' and transformers' loaders name them.
HUB_KWARGS = ("cache_dir", "revision", "token", "force_download", "local_files_only", "proxies")


def hub_offline() -> bool:
    """`HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`), read at call time rather than at import."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in {"1", "ON", "YES", "TRUE"}


def endpoint_problem(endpoint: str | None = None) -> str | None:
    """
    Why the Hub endpoint (`HF_ENDPOINT`, as huggingface_hub read it) cannot be reached as it is written, or `None`:
    without a scheme (`127.0.0.1:9`) every request fails deep in the HTTP client with "UnsupportedProtocol".
    """
    endpoint = constants.ENDPOINT if endpoint is None else endpoint
    parsed = urlparse(endpoint)
    if parsed.scheme in ("http", "https") and parsed.netloc:
        return None
    return (
        f"HF_ENDPOINT={endpoint!r} is not a URL: it needs a scheme and a host, e.g. "
        f"'http://{endpoint.split('://')[-1] or '127.0.0.1:8080'}' or 'https://huggingface.co' (or unset it)"
    )


def check_endpoint() -> None:
    """Raises `ValueError` with [`endpoint_problem`]'s sentence before any request is made."""
    problem = endpoint_problem()
    if problem is not None:
        raise ValueError(f"{problem}.")


class HubPushError(RuntimeError):
    """A push to the Hub failed after the local result was written: the message says where it is kept."""


def push_error(repo_id: str, folder: str | os.PathLike, error: BaseException) -> HubPushError:
    """The [`HubPushError`] of a failed upload of `folder` to `repo_id`: the cause, where the result is kept, and the
    command that pushes it later."""
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    return HubPushError(
        f"Could not push to {repo_id!r} on the Hub at {constants.ENDPOINT} ({type(cause).__name__}: {cause}). "
        f"The local result is kept in {folder}; push it later with `hf upload {repo_id} {folder}` once the Hub "
        "can be reached (check the network, HF_ENDPOINT and `hf auth login`)."
    )


def push_folder(pipe, repo_id: str, folder: str | os.PathLike, **kwargs) -> None:
    """
    `pipe.push_to_hub(repo_id, **kwargs)`, for a result already saved in `folder`: a failure (the Hub unreachable,
    no login, no rights) is one [`HubPushError`] that says the local result is kept, and how to push it later.
    """
    check_endpoint()
    try:
        pipe.push_to_hub(repo_id, **kwargs)
    except Exception as error:  # httpx / requests / huggingface_hub errors alike: the local result is what matters
        raise push_error(repo_id, folder, error) from error


def upload_folder_to_hub(
    folder: str | os.PathLike,
    repo_id: str,
    token: str | None = None,
    private: bool | None = None,
    commit_message: str = "upload",
    create_pr: bool = False,
) -> str:
    """
    Uploads `folder` as it is to the Hub repo `repo_id` (created where missing) and returns the commit hash; a
    failure is one [`HubPushError`] that says `folder` is kept, as [`push_folder`]'s.
    """
    from huggingface_hub import HfApi

    check_endpoint()
    try:
        api = HfApi(token=token)
        api.create_repo(repo_id, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id, folder_path=str(folder), commit_message=commit_message, create_pr=create_pr
        )
    except Exception as error:  # as in push_folder: whatever the client raised, the folder is what is kept
        raise push_error(repo_id, folder, error) from error
    return info.oid


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
    if not hub_kwargs["local_files_only"]:
        check_endpoint()
    try:
        return Path(snapshot_download(str(source), allow_patterns=allow_patterns, **hub_kwargs))
    except (OSError, ValueError) as error:  # no network, an unknown repo, a gated one: say what was being fetched
        message = fetch_error_message(str(source), hub_kwargs, error)
        near = close_local_path(str(source))
        if near is not None:
            message = f"{source!r} is no path on this machine; did you mean the folder {near}? {message}"
        raise FileNotFoundError(message) from error


def close_local_path(source: str) -> Path | None:
    """An existing local path one typo away from `source` (`hub_artifact/elf-small` for `hub_artifacts/elf-small`):
    a mistyped folder looks like a Hub repo id `owner/name`, so the failed fetch names the folder it was likely."""
    owner, _, name = source.partition("/")
    try:
        entries = [entry.name for entry in Path.cwd().iterdir() if entry.is_dir()]
    except OSError:
        return None
    for match in difflib.get_close_matches(owner, entries, n=3, cutoff=0.8):
        folder = Path(match)
        names = [entry.name for entry in folder.iterdir()] if folder.is_dir() else []
        for near in difflib.get_close_matches(name, names, n=1, cutoff=0.8):
            return folder / near
    return None


def fetch_error_message(repo_id: str, hub_kwargs: dict, error: BaseException) -> str:
    """
    Why `snapshot_download(repo_id, **hub_kwargs)` failed, and the way out. huggingface_hub's own texts speak of its
    arguments (an offline cache miss says "pass local_files_only=False" even where `HF_HUB_OFFLINE` was set) and
    never name the endpoint, which matters where `HF_ENDPOINT` points at a mirror.
    """
    revision = hub_kwargs.get("revision") or "main"
    cache = hub_kwargs.get("cache_dir") or constants.HF_HUB_CACHE
    head = f"Could not fetch {repo_id!r} from the Hugging Face Hub at {constants.ENDPOINT}"
    local = "or pass a local file or folder"
    if isinstance(error, RevisionNotFoundError):
        return f"{head}: the repo has no revision {revision!r}. Pass an existing branch, tag or commit hash, {local}."
    if isinstance(error, GatedRepoError):
        return f"{head}: the repo is gated. Accept its conditions on its page and log in (`hf auth login`), {local}."
    if isinstance(error, RepositoryNotFoundError):
        return (
            f"{head}: no such repo (or a private one). Check the repo id (it is no path on this machine either); a "
            f"private repo needs a login (`hf auth login` or HF_TOKEN), {local}."
        )
    missing = f"revision {revision!r} of it is not in the Hugging Face cache ({cache})"
    if hub_kwargs.get("local_files_only"):
        reason = "HF_HUB_OFFLINE is set" if hub_offline() else "local_files_only=True was passed"
        return f"{head}: {reason}, and {missing}. Fetch it once with network access to cache it, {local}."
    cause = error
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if cause is not error and "LocalEntryNotFound" in type(error).__name__:  # the Hub did not answer
        return (
            f"{head}: it could not be reached ({type(cause).__name__}: {cause}), and {missing}. Check the network "
            f"(and HF_ENDPOINT), {local}."
        )
    return (
        f"{head} ({type(error).__name__}: {error}). It is not a path on this machine either: check the repo id, the "
        f"network and `hf auth login` for gated repos, {local}."
    )
