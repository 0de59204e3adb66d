"""A minimal reader for R's XDR serialization and lazy-load databases (`.rdx`/`.rdb`), in pure Python.

It reads what R data packages store: vectors (logical, integer, double, character, list), pairlists, symbols and
attributes. Closures, environments and byte code are skipped where possible and rejected otherwise. That is
enough to get the character vectors of a data package (for example `janeaustenr`'s novels) without R or `rdata`.
"""

import bz2
import gzip
import lzma
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any


NILVALUE, GLOBALENV, UNBOUNDVALUE, MISSINGARG, BASENAMESPACE = 254, 253, 252, 251, 250
EMPTYENV, BASEENV, REFSXP, ALTREP = 242, 241, 255, 238
SYMSXP, LISTSXP, CLOSXP, ENVSXP, PROMSXP, LANGSXP = 1, 2, 3, 4, 5, 6
CHARSXP, LGLSXP, INTSXP, REALSXP, CPLXSXP, STRSXP = 9, 10, 13, 14, 15, 16
DOTSXP, VECSXP, EXPRSXP, RAWSXP = 17, 19, 20, 24
NA_INTEGER = -(2**31)
_SPECIAL = {NILVALUE, GLOBALENV, UNBOUNDVALUE, MISSINGARG, BASENAMESPACE, EMPTYENV, BASEENV}


@dataclass
class RObject:
    """An R value: `value` (a Python list for vectors, a list of (tag, value) for pairlists) and its attributes."""

    type: int
    value: Any
    attributes: dict[str, Any] = field(default_factory=dict)

    @property
    def names(self) -> list[str] | None:
        names = self.attributes.get("names")
        return names.value if isinstance(names, RObject) else None


@dataclass
class RSymbol:
    name: str


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0
        self.refs: list[Any] = []

    def bytes(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("Truncated R serialization stream.")
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def int(self) -> int:
        return struct.unpack(">i", self.bytes(4))[0]

    def length(self) -> int:
        n = self.int()
        if n == -1:
            high, low = self.int(), self.int()
            n = (high << 32) + low
        return n

    def string(self, n: int) -> str:
        return self.bytes(n).decode("utf-8", errors="replace")

    def attributes(self) -> dict[str, Any]:
        pairs = self.item()
        if not isinstance(pairs, RObject) or pairs.type != LISTSXP:
            return {}
        return {tag.name if isinstance(tag, RSymbol) else str(tag): value for tag, value in pairs.value}

    def item(self) -> Any:
        flags = self.int()
        kind = flags & 0xFF
        has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
        if kind in _SPECIAL:
            return None
        if kind == REFSXP:
            index = flags >> 8
            return self.refs[(index or self.int()) - 1]
        if kind == SYMSXP:
            symbol = RSymbol(self.item() or "")
            self.refs.append(symbol)
            return symbol
        if kind == CHARSXP:
            n = self.int()
            return None if n == -1 else self.string(n)
        if kind in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
            items, attributes = [], {}
            while True:
                attributes = self.attributes() if has_attr else attributes
                tag = self.item() if has_tag else None
                items.append((tag, self.item()))
                flags = self.int()
                kind_next = flags & 0xFF
                if kind_next == NILVALUE:
                    break
                if kind_next not in (LISTSXP, LANGSXP, CLOSXP, PROMSXP, DOTSXP):
                    # A non-pairlist CDR (rare): rewind and read it as an ordinary item.
                    self.pos -= 4
                    items.append((None, self.item()))
                    break
                has_attr, has_tag = bool(flags & (1 << 9)), bool(flags & (1 << 10))
            return RObject(kind, items, attributes)
        if kind == ENVSXP:
            env = RObject(ENVSXP, None)
            self.refs.append(env)
            self.int()  # locked
            env.value = {"enclos": self.item(), "frame": self.item(), "hashtab": self.item()}
            env.attributes = self.attributes()
            return env
        if kind in (LGLSXP, INTSXP):
            n = self.length()
            values = list(struct.unpack(f">{n}i", self.bytes(4 * n)))
            value = [None if v == NA_INTEGER else v for v in values]
        elif kind == REALSXP:
            n = self.length()
            value = list(struct.unpack(f">{n}d", self.bytes(8 * n)))
        elif kind == CPLXSXP:
            n = self.length()
            parts = struct.unpack(f">{2 * n}d", self.bytes(16 * n))
            value = [complex(parts[2 * i], parts[2 * i + 1]) for i in range(n)]
        elif kind == RAWSXP:
            value = self.bytes(self.length())
        elif kind in (STRSXP, VECSXP, EXPRSXP):
            value = [self.item() for _ in range(self.length())]
        else:
            raise ValueError(f"Unsupported R object type {kind} in the serialization stream.")
        return RObject(kind, value, self.attributes() if has_attr else {})


def unserialize(data: bytes) -> Any:
    """Reads one object from an R serialization stream (XDR format, versions 2 and 3)."""
    reader = _Reader(data)
    if reader.bytes(2) != b"X\n":
        raise ValueError("Not an XDR R serialization stream (only the 'X' format is supported).")
    version = reader.int()
    reader.int(), reader.int()  # writer and minimal reader versions
    if version == 3:
        reader.bytes(reader.int())  # native encoding name
    elif version != 2:
        raise ValueError(f"Unsupported R serialization version {version}.")
    return reader.item()


def _decompress_entry(blob: bytes) -> bytes:
    """A lazy-load entry: a 4-byte big-endian length, then (for zlib) the compressed stream."""
    (size,) = struct.unpack(">I", blob[:4])
    kind = blob[4:5]
    if kind in (b"Z", b"2", b"X"):
        body = blob[5:]
        out = {b"Z": zlib.decompress, b"2": bz2.decompress, b"X": lzma.decompress}[kind](body)
    else:
        out = zlib.decompress(blob[4:])
    if len(out) != size:
        raise ValueError(f"Lazy-load entry decompressed to {len(out)} bytes, expected {size}.")
    return out


def read_lazyload_db(base: str) -> dict[str, Any]:
    """
    All variables of an R lazy-load database `base.rdx` + `base.rdb` (e.g. a package's `data/Rdata`).

    Returns:
        `dict[str, RObject]`: variable name → unserialized value.
    """
    with open(base + ".rdx", "rb") as handle:
        raw_index = handle.read()
    index_bytes = gzip.decompress(raw_index) if raw_index[:2] == b"\x1f\x8b" else _decompress_entry(raw_index)
    index = unserialize(index_bytes)
    parts = dict(zip(index.names, index.value, strict=True))
    variables = parts["variables"]
    with open(base + ".rdb", "rb") as handle:
        rdb = handle.read()
    out = {}
    for name, location in zip(variables.names, variables.value, strict=True):
        offset, length = (int(v) for v in location.value)
        out[name] = unserialize(_decompress_entry(rdb[offset : offset + length]))
    return out
