"""The names of the files a benchmark writes, in a module that imports nothing heavy: the command line refuses to
replace them before any work (and `untied-sc evaluate` finds the record beside a samples file), and claims them for
the whole run ([`claimed_outputs`]), so that two runs writing one file cannot both succeed."""

import contextlib
import os
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path


try:
    import fcntl
except ImportError:  # not POSIX: an exclusively created lock file, removed at the end (a crash leaves it behind)
    fcntl = None


REPORT_SAMPLES_SUFFIX = ".samples.jsonl.gz"


def report_paths(output_dir: str | os.PathLike, stem: str, samples: bool = True) -> dict[str, Path]:
    """The files `report.write_results` writes for `stem`: `json`, `markdown`, `plot` and (with `samples`)
    `samples`."""
    folder = Path(output_dir)
    paths = {"json": folder / f"{stem}.json", "markdown": folder / f"{stem}.md", "plot": folder / f"{stem}.png"}
    if samples:
        paths["samples"] = folder / f"{stem}{REPORT_SAMPLES_SUFFIX}"
    return paths


def record_beside_samples(samples: str | os.PathLike) -> Path | None:
    """The JSON record a benchmark wrote beside its samples file (`<stem>.json` beside a report's
    `<stem>.samples.jsonl.gz`), or `None` for a file of another name."""
    path = Path(samples)
    if not path.name.endswith(REPORT_SAMPLES_SUFFIX):
        return None
    return report_paths(path.parent, path.name[: -len(REPORT_SAMPLES_SUFFIX)])["json"]


def rescored_report_name(model: str, evaluator: str | os.PathLike, dtype: str | None = None) -> str:
    """The default file stem of a report rescored under another evaluator (`benchmark --rescore`): the first
    report's model and the evaluator's short name (`elf-small-baselines-gemma3-270m`; a folder or Hub id by its last
    part), and the dtype when only that differs from the first report's."""
    short = Path(str(evaluator).rstrip("/")).name
    return f"{model}-{short}" + (f"-{dtype}" if dtype else "")


LOCK_SUFFIX = ".lock"


def lock_path(path: str | os.PathLike) -> Path:
    """The lock file beside an output while a run writes it: `<output>.lock`."""
    path = Path(path)
    return path.with_name(path.name + LOCK_SUFFIX)


@contextlib.contextmanager
def claimed_outputs(
    paths: Iterable[str | os.PathLike], overwrite: bool, remedy: str, active: bool = True
) -> Iterator[None]:
    """
    Holds each of `paths` for one run, from its start to its last write: a second run that would write one of them
    while this one runs is refused at its start, naming the file and the process that holds it, instead of both
    printing "Wrote" over one another's results. Under the claim an existing file is refused unless `overwrite`
    (checked again: another run may have written it since the command's first check). `remedy` ends the errors
    (e.g. "choose another --out"); `active=False` (a process that writes nothing) claims nothing.

    A claim is an exclusive `flock` on `<output>.lock`, which the system releases when the process ends however it
    ends (no stale lock after a crash); the lock file is removed when the run is done.
    """
    if not active:
        yield
        return
    with contextlib.ExitStack() as stack:
        for path in sorted({Path(p) for p in paths}, key=str):  # one order for every run: no two wait on each other
            stack.enter_context(_claimed(path, overwrite, remedy))
        yield


@contextlib.contextmanager
def _claimed(path: Path, overwrite: bool, remedy: str) -> Iterator[None]:
    lock = lock_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = _lock(lock, path, remedy)
    except FileExistsError as error:
        if path.parent.is_dir():  # a run holding the file: `_busy`'s message
            raise
        raise _unwritable(path, error, remedy) from None
    except OSError as error:  # under a regular file, a read-only or virtual file system (/proc), no permission
        raise _unwritable(path, error, remedy) from None
    try:
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} exists; pass --overwrite to replace it, or {remedy}.")
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()  # before the descriptor closes: a run that opened the old file sees it gone and retries
        os.close(descriptor)


def _unwritable(path: Path, error: OSError, remedy: str) -> ValueError:
    blocker = next((folder for folder in (path.parent, *path.parent.parents) if folder.is_file()), None)
    why = f"{blocker} is a file, not a folder" if blocker else f"{error.strerror or error} at {error.filename or path}"
    return ValueError(f"{path} cannot be written ({why}), found before any work: {remedy} in a folder one can write.")


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"


def _busy(path: Path, lock: Path, holder: str, remedy: str) -> FileExistsError:
    return FileExistsError(
        f"{path} is being written by another run ({holder or 'holder unknown'}; lock {lock}): two runs writing one "
        f"file would leave only one's results under both runs' messages. Wait for that run to finish, or {remedy}."
    )


def _lock(lock: Path, path: Path, remedy: str) -> int:
    """An open descriptor of `lock`, exclusively locked by this process, with this process named in it."""
    if fcntl is None:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise _busy(
                path,
                lock,
                lock.read_text(errors="replace").strip(),
                remedy + f" (or remove {lock} if no run is writing it)",
            ) from None
        os.write(descriptor, _holder().encode())
        return descriptor
    for _ in range(5):
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(descriptor, 4096, 0).decode(errors="replace").strip()
            os.close(descriptor)
            raise _busy(path, lock, holder, remedy) from None
        try:  # the holder may have removed the file between our open and our lock: then lock the new one
            current = os.stat(lock).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            current = False
        if current:
            os.ftruncate(descriptor, 0)
            os.pwrite(descriptor, _holder().encode(), 0)
            return descriptor
        os.close(descriptor)
    raise _busy(path, lock, "", remedy)
