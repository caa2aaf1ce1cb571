"""module_utils/_safetensors.py: the header codec - encoded, read back, and a file cut short named."""

from __future__ import annotations

import struct

import pytest

from tests.modules import module_utils

st = module_utils("_safetensors")


def write(path, tensors: dict, data: bytes) -> None:
    path.write_bytes(st.encode_header(tensors) + data)


def test_a_header_round_trips_and_is_padded_to_8(tmp_path):
    encoded = st.encode_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})
    (length,) = struct.unpack("<Q", encoded[:8])
    assert length % 8 == 0 and len(encoded) == 8 + length
    path = tmp_path / "m.safetensors"
    write(path, {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)
    header = st.read_header(str(path))
    assert [t.name for t in header.tensors] == ["a"]
    assert st.file_problem(str(path)) is None


def test_a_header_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="does not fit"):
        st.encode_header({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, pad_to=4)


def test_a_file_cut_short_is_named(tmp_path):
    path = tmp_path / "cut.safetensors"
    write(path, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    problem = st.file_problem(str(path))
    assert problem and "cut.safetensors" in problem
    (tmp_path / "tiny.safetensors").write_bytes(b"\1\0")
    with pytest.raises(st.SafetensorsError, match="shorter than the 8-byte header length"):
        st.read_header(str(tmp_path / "tiny.safetensors"))
