"""Reading SWORD Bible and commentary modules (Debian's `sword-text-*`, `sword-comm-*`) in pure Python.

A compressed SWORD module (drivers zText, zCom, zCom4) stores each testament in three files, named `ot.?z?` and
`nt.?z?` (the middle letter is the blocking: b = book, c = chapter, v = verse):

* `?zs`, the block index: per block, little-endian uint32 offset, compressed size, uncompressed size;
* `?zz`, the zlib-compressed blocks, back to back;
* `?zv`, the entry index, one per verse slot in canonical order: uint32 block, uint32 start in the uncompressed
  block, and the entry's size as uint16 (zText, zCom) or uint32 (zCom4).

Entries are OSIS XML fragments; paragraphs are `x-p` milestones (`<div type="x-p" sID=.../>`) that run across
entries, so the text is joined in canonical order before it is cut into paragraphs.
"""

import html
import re
import struct
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path


_BLOCK_ENTRY = struct.Struct("<III")
_DROPPED_ELEMENTS = re.compile(r"<(note|title|table|rdg)\b[^>]*?(?<!/)>.*?</\1>", re.S)
# a glossary (word lists, as in the World English Bible's appendix) runs between two milestones of one id
_GLOSSARY = re.compile(
    r"<div\b(?=[^>]*\btype=\"glossary\")(?=[^>]*\bsID=\"([^\"]+)\")[^>]*/>.*?<div\b(?=[^>]*\beID=\"\1\")[^>]*/>", re.S
)
# "Verses 8-15" labels of commentary paragraphs: a reference, not prose
_VERSE_LABEL = re.compile(r"<hi type=\"bold\">\s*Verses?\s[\d\s,\-:]*</hi>")
_PARAGRAPH_BREAK = re.compile(
    r"<div\b[^>]*\btype=\"(?:x-p|paragraph|book|introduction|front|glossary)\"[^>]*/>|<lb\b[^>]*type=\"x-p\"[^>]*/>"
    r"|</?p\b[^>]*>|<chapter\b[^>]*/>"
)
# block-level elements end a word; inline ones (w, hi, q, reference, seg, ...) do not, so they vanish without a space
_BLOCK_TAG = re.compile(r"</?(?:l|lg|lb|div|list|item|milestone|chapter|row|cell)\b[^>]*>")
_TAG = re.compile(r"<[^>]*>")


def verse_index_width(verse_index: bytes, num_blocks: int) -> int:
    """10 (uint16 sizes) or 12 (uint32 sizes, zCom4): the width whose every non-empty entry names an existing block.

    The module's `.conf` cannot be trusted for this (a zCom4 module may be written with 10-byte entries).
    """
    for width, fmt in ((12, "<III"), (10, "<IIH")):
        if len(verse_index) % width:
            continue
        entries = struct.iter_unpack(fmt, verse_index)
        if all(size == 0 or block < num_blocks for block, _, size in entries):
            return width
    raise ValueError(
        f"Cannot read this SWORD entry index ({len(verse_index)} bytes, {num_blocks} blocks): it is neither 10- nor "
        "12-byte entries pointing into the block index. Is it a zText/zCom module?"
    )


def read_testament(index: bytes, compressed: bytes, verse_index: bytes) -> Iterator[str]:
    """The entries of one testament in canonical order; empty slots and linked repeats (the same bytes again) skipped."""
    num_blocks = len(index) // _BLOCK_ENTRY.size
    width = verse_index_width(verse_index, num_blocks)
    fmt = "<IIH" if width == 10 else "<III"
    blocks: dict[int, bytes] = {}
    seen: set[tuple[int, int, int]] = set()
    for block, start, size in struct.iter_unpack(fmt, verse_index):
        if size == 0 or (block, start, size) in seen:
            continue
        seen.add((block, start, size))
        if block not in blocks:
            offset, length, _ = _BLOCK_ENTRY.unpack_from(index, block * _BLOCK_ENTRY.size)
            blocks[block] = zlib.decompress(compressed[offset : offset + length])
        yield blocks[block][start : start + size].decode("utf-8", errors="replace")


def read_sword_module(module_dir: str | Path) -> list[str]:
    """All entries of a compressed SWORD module folder (Old then New Testament)."""
    folder = Path(module_dir)
    entries: list[str] = []
    for testament in ("ot", "nt"):
        found = sorted(folder.glob(f"{testament}.[bcv]zs"))
        if not found:
            continue
        stem = found[0].with_suffix("")
        letter = found[0].suffix[1]
        entries.extend(
            read_testament(
                found[0].read_bytes(),
                stem.with_suffix(f".{letter}zz").read_bytes(),
                stem.with_suffix(f".{letter}zv").read_bytes(),
            )
        )
    if not entries:
        raise FileNotFoundError(f"No SWORD data (ot.bzs, nt.czs, ...) in {folder}.")
    return entries


def osis_paragraphs(entries: Iterable[str]) -> list[str]:
    """Plain-text paragraphs of OSIS entries: notes, titles, tables, glossaries and verse labels dropped, markup
    removed."""
    text = _GLOSSARY.sub(" ", " ".join(entries))
    text = _VERSE_LABEL.sub("", _DROPPED_ELEMENTS.sub("", text))  # a footnote sits right before its punctuation
    paragraphs = []
    for part in _PARAGRAPH_BREAK.split(text):
        plain = html.unescape(_TAG.sub("", _BLOCK_TAG.sub(" ", part)))
        plain = " ".join(plain.split())
        if plain:
            paragraphs.append(plain)
    return paragraphs
