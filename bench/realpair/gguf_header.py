"""A GGUF file's header, read with the standard library alone: the magic, the version and, by walking the
metadata key/value pairs until it appears, `general.architecture` (llama.cpp writes it first, so this reads
a few hundred bytes). Enough to tell a fetched file is the model it should be before converting it; the
tensors are the converter's business.

Layout (little-endian, versions 2 and 3): b"GGUF", u32 version, u64 tensor count, u64 key/value count, then
per pair a string key (u64 length + UTF-8), a u32 value type and the value.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
VERSIONS = (2, 3)
ARCHITECTURE_KEY = "general.architecture"
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class HeaderError(ValueError):
    """The file is not a GGUF file this fetch expects; the message says what was found."""


@dataclass(frozen=True, slots=True)
class GGUFHeader:
    version: int
    num_tensors: int
    num_metadata: int
    architecture: str | None  # None when the metadata has no general.architecture


def _unpack(stream: BinaryIO, fmt: str):
    size = struct.calcsize("<" + fmt)
    data = stream.read(size)
    if len(data) != size:
        raise HeaderError("the file ends inside its GGUF header")
    return struct.unpack("<" + fmt, data)[0]


def _string(stream: BinaryIO) -> str:
    length = _unpack(stream, "Q")
    data = stream.read(length)
    if len(data) != length:
        raise HeaderError("the file ends inside its GGUF header")
    return data.decode("utf-8", errors="replace")


def _skip(stream: BinaryIO, value_type: int) -> None:
    if value_type in SCALARS:
        stream.seek(struct.calcsize("<" + SCALARS[value_type]), 1)
    elif value_type == STRING:
        stream.seek(_unpack(stream, "Q"), 1)
    elif value_type == ARRAY:
        item_type, count = _unpack(stream, "I"), _unpack(stream, "Q")
        if item_type in SCALARS:
            stream.seek(count * struct.calcsize("<" + SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                _skip(stream, item_type)
    else:
        raise HeaderError(f"unknown GGUF metadata value type {value_type}")


def read_header(path: Path) -> GGUFHeader:
    """The header of the GGUF file at `path`; raises HeaderError when it is not one."""
    with open(path, "rb") as stream:
        magic = stream.read(4)
        if magic != MAGIC:
            raise HeaderError(f"{path.name} does not start with the GGUF magic (found {magic!r})")
        version = _unpack(stream, "I")
        if version not in VERSIONS:
            raise HeaderError(f"{path.name} is GGUF version {version}; expected one of {VERSIONS}")
        num_tensors, num_metadata = _unpack(stream, "Q"), _unpack(stream, "Q")
        architecture = None
        for _ in range(num_metadata):
            key, value_type = _string(stream), _unpack(stream, "I")
            if key == ARCHITECTURE_KEY and value_type == STRING:
                architecture = _string(stream)
                break
            _skip(stream, value_type)
    return GGUFHeader(version, num_tensors, num_metadata, architecture)


def check_header(path: Path, architecture: str) -> GGUFHeader:
    """The header of `path`, checked to be GGUF v2/v3 with `general.architecture == architecture`."""
    header = read_header(path)
    if header.architecture != architecture:
        raise HeaderError(
            f"{path.name} has general.architecture {header.architecture!r}; expected {architecture!r}"
        )
    return header


def header_bytes(architecture: str, version: int = 3) -> bytes:
    """A minimal GGUF header with no tensors and one key, general.architecture (for tests and fakes)."""
    key, value = ARCHITECTURE_KEY.encode(), architecture.encode()
    return (
        MAGIC
        + struct.pack("<IQQ", version, 0, 1)
        + struct.pack("<Q", len(key))
        + key
        + struct.pack("<IQ", STRING, len(value))
        + value
    )
