"""The GGUF header reader of bench.realpair, on headers written here: the magic and version are checked,
and general.architecture is found behind keys of every value type (scalars, strings, arrays of both)."""

from __future__ import annotations

import struct

import pytest

from bench.realpair.gguf_header import ARRAY, STRING, HeaderError, check_header, header_bytes, read_header


def string(text: str) -> bytes:
    return struct.pack("<Q", len(text.encode())) + text.encode()


def test_realpair_header_finds_the_architecture_behind_other_keys(tmp_path):
    pairs = [
        string("general.alignment") + struct.pack("<II", 4, 32),  # u32
        string("general.name") + struct.pack("<I", STRING) + string("Qwen2.5 Coder"),
        string("scores") + struct.pack("<IIQ", ARRAY, 6, 3) + struct.pack("<3f", 0.5, 1.5, 2.5),  # f32 array
        string("tokens") + struct.pack("<IIQ", ARRAY, STRING, 2) + string("a") + string("bc"),
        string("flag") + struct.pack("<I?", 7, True),
        string("general.architecture") + struct.pack("<I", STRING) + string("qwen2"),
    ]
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 291, len(pairs)) + b"".join(pairs) + b"\0" * 64)
    header = read_header(path)
    assert (header.version, header.num_tensors, header.num_metadata, header.architecture) == (
        3,
        291,
        6,
        "qwen2",
    )
    assert check_header(path, "qwen2") == header


def test_realpair_header_refuses_what_is_not_the_expected_gguf(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"PK\x03\x04" + bytes(64))
    with pytest.raises(HeaderError, match="does not start with the GGUF magic"):
        read_header(path)
    path.write_bytes(header_bytes("qwen2", version=9))
    with pytest.raises(HeaderError, match="GGUF version 9"):
        read_header(path)
    path.write_bytes(header_bytes("llama"))
    with pytest.raises(HeaderError, match="general.architecture 'llama'; expected 'qwen2'"):
        check_header(path, "qwen2")
    path.write_bytes(header_bytes("qwen2")[:30])
    with pytest.raises(HeaderError, match="ends inside its GGUF header"):
        read_header(path)
