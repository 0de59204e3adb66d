"""A folder written whole or not at all: the saves that replace a folder a user may have made go through here."""

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def refuse_non_empty(folder: Path, overwrite: bool, how: str) -> None:
    """Refuses to write over a non-empty `folder` (somebody's) unless `overwrite`; `how` says how to consent."""
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())) and not overwrite:
        raise FileExistsError(f"{folder} already exists and is not empty; {how} to replace it, or name a new folder.")


def replace_atomically(output: Path, write: Callable[[Path], object]) -> Path:
    """
    `write(folder)` into a temporary folder beside `output`, then renamed onto it (replacing what was there): `output`
    is either the complete folder or untouched, whatever error or interruption comes in between. Whether `output` may
    be replaced is the caller's to check first.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output.name}.", suffix=".partial", dir=output.parent))
    try:
        write(staging)
        if output.is_dir() and not output.is_symlink():
            shutil.rmtree(output)
        elif output.exists() or output.is_symlink():
            output.unlink()
        staging.rename(output)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output
