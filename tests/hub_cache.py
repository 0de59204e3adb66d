"""Builds a Hugging Face Hub cache entry on disk, so that repo-id loading is tested offline."""

import shutil
from pathlib import Path


def populate_hub_cache(cache_dir: Path, repo_id: str, files: dict[str, Path], revision: str = "0" * 40) -> None:
    """Lays out `models--owner--name/{refs/main, snapshots/<revision>/...}` the way `snapshot_download` leaves it."""
    repo = Path(cache_dir) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / revision
    for name, source in files.items():
        target = snapshot / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
