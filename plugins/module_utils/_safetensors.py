# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A safetensors header codec: read and validate a file's header without loading tensor data, and encode a new one.

File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of UTF-8 JSON (may end in spaces), then the data section. Each tensor's
``data_offsets`` are relative to the data section. The JSON maps names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional ``__metadata__`` of strings.

Rewriting a header is _remap.py's; the checkpoint lock and the in-place journal are _journal.py's; writing a file
whole or not at all is _atomic.py's. Standard library only: the training payload ships this file beside _atomic.py
(eagle3_ops/payloads/training links both).
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from typing import Any

MAX_HEADER = 100_000_000  # the safetensors library refuses larger headers (HeaderTooLarge)
# Bits per element of every dtype the safetensors format defines (safetensors 0.8, src/tensor.rs Dtype::bitsize).
DTYPE_BITS = {
    "BOOL": 8, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8,
    "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
    "I32": 32, "U32": 32, "F32": 32,
    "I64": 64, "U64": 64, "F64": 64, "C64": 64,
    "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6,
}  # fmt: skip
RESERVED_NAMES = ("__metadata__",)  # the format's own key: never a tensor name


class SafetensorsError(Exception):
    """A file that is not a valid safetensors file, or an operation that would break one."""


@dataclass
class Tensor:
    name: str
    dtype: str
    shape: list[int]
    begin: int
    end: int

    def entry(self, begin: int | None = None) -> dict[str, Any]:
        start = self.begin if begin is None else begin
        return {"dtype": self.dtype, "shape": self.shape, "data_offsets": [start, start + self.end - self.begin]}


@dataclass
class Header:
    """A parsed, validated header of one file."""

    path: str
    header_len: int  # N, the bytes between the length prefix and the data section
    file_size: int
    tensors: list[Tensor]  # in header order
    metadata: dict[str, str] | None = None
    raw: bytes = field(default=b"", repr=False)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]


def header_error(path: str, problem: str) -> SafetensorsError:
    return SafetensorsError(f"{path} is not a valid safetensors file: {problem}")


def parse_header_bytes(path: str, prefix: bytes, header: bytes, file_size: int) -> Header:
    """Validate and parse a header already read from ``path``; ``file_size`` bounds the data spans."""
    (n,) = struct.unpack("<Q", prefix)
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise header_error(path, f"its header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.startswith("{"):
        raise header_error(path, "its header does not start with '{'")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _unused in pairs]
        if len(keys) != len(set(keys)):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"the name {dup!r} appears twice")
        return dict(pairs)

    try:
        obj = json.loads(text.rstrip(" "), object_pairs_hook=no_duplicates)
    except ValueError as exc:
        raise header_error(path, f"its header is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise header_error(path, "its header is not a JSON object")
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise header_error(path, "its __metadata__ is not a map of strings")
    data_size = file_size - 8 - n
    tensors: list[Tensor] = []
    for name, info in obj.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise header_error(path, f"tensor {name!r} must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_BITS:
            raise header_error(path, f"tensor {name!r} has the unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise header_error(path, f"tensor {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise header_error(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        numel = 1
        for d in shape:
            numel *= d
        bits = numel * DTYPE_BITS[dtype]
        if bits % 8:
            raise header_error(path, f"tensor {name!r} of {dtype} {shape} does not fill whole bytes")
        if not 0 <= begin <= end or end - begin != bits // 8:
            raise header_error(path, f"tensor {name!r} spans {end - begin} bytes where {dtype} {shape} needs "
                                     f"{bits // 8}")
        if end > data_size:
            raise header_error(path, f"tensor {name!r} ends at byte {end} past the data section ({data_size} bytes)")
        tensors.append(Tensor(name, dtype, list(shape), begin, end))
    problem = layout_problem(tensors, data_size)
    if problem:
        raise header_error(path, problem)
    return Header(path, n, file_size, tensors, metadata, raw=prefix + header)


def _tiling_gaps(tensors: list[Tensor], data_size: int) -> list[tuple[int, int]] | None:
    """The gaps left when ``tensors`` are laid out in the data section, or None when two overlap."""
    gaps, position = [], 0
    for t in sorted(tensors, key=lambda t: (t.begin, t.end)):
        if t.begin < position:
            return None
        if t.begin > position:
            gaps.append((position, t.begin))
        position = t.end
    if position < data_size:
        gaps.append((position, data_size))
    return gaps


def _span(t: Tensor) -> str:
    return f"{t.name!r} [{t.begin}, {t.end}]"


def layout_problem(tensors: list[Tensor], data_size: int) -> str | None:
    """Why the tensors do not tile the data section exactly, naming the tensor whose offsets are wrong.

    When the others tile the section but for one hole exactly that tensor's size, that tensor is the one
    whose data_offsets are wrong (the hole is where its bytes are); otherwise both tensors of the first
    overlap, or the gap, are named with their offsets.
    """
    ordered = sorted(tensors, key=lambda t: (t.begin, t.end))
    first_overlap: tuple[Tensor, Tensor] | None = None
    first_gap: tuple[int, int] | None = None
    position, furthest = 0, None  # the end reached so far, and the tensor that reaches it
    for t in ordered:
        if t.begin < position and first_overlap is None and furthest is not None:
            first_overlap = (furthest, t)
        elif t.begin > position and first_gap is None:
            first_gap = (position, t.begin)
        if t.end > position:
            position, furthest = t.end, t
    if position < data_size and first_gap is None:
        first_gap = (position, data_size)
    if first_overlap is None and first_gap is None:
        return None
    # Suspects: the later tensor of the overlap first (it starts inside another), then the earlier one, then
    # (for a pure gap) every tensor, since a tensor moved elsewhere leaves a hole of its own size.
    suspects = [first_overlap[1], first_overlap[0]] if first_overlap else []
    suspects += [t for t in ordered if all(t is not s for s in suspects)]
    for culprit in suspects:
        others = [t for t in tensors if t is not culprit]
        gaps = _tiling_gaps(others, data_size)
        if gaps is not None and len(gaps) == 1 and gaps[0][1] - gaps[0][0] == culprit.end - culprit.begin:
            where = f"its {culprit.end - culprit.begin} bytes fit the gap at {gaps[0][0]}..{gaps[0][1]}"
            if first_overlap and culprit in first_overlap:
                other = first_overlap[0] if culprit is first_overlap[1] else first_overlap[1]
                return f"tensor {_span(culprit)} overlaps tensor {_span(other)}; {where}"
            return f"tensor {_span(culprit)} has data_offsets that leave a gap; {where}"
        if len(tensors) > 4096 and culprit not in (first_overlap or ()):
            break  # a pathological header: name what was found instead of searching every tensor
    if first_overlap:
        a, b = first_overlap
        return f"tensors {_span(a)} and {_span(b)} overlap"
    gap = first_gap or (0, 0)  # first_gap is set whenever no overlap was found (checked above)
    return f"the data section has a gap at bytes {gap[0]}..{gap[1]} that no tensor covers"


def read_header(path: str) -> Header:
    """Read and validate the header of ``path``. Reads only the header bytes, never tensor data."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise SafetensorsError(f"cannot open {path}: {exc.strerror}") from None
    try:
        size = os.fstat(fd).st_size
        prefix = os.pread(fd, 8, 0)
        if len(prefix) < 8:
            raise header_error(path, f"it is {size} bytes long, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", prefix)
        if n == 0:
            raise header_error(path, "its header is empty (declared length 0), not even '{}'")
        if n < 2:
            raise header_error(path, f"its declared header length {n} is too short for a JSON object")
        if 8 + n > size:
            raise header_error(path, f"its declared header length {n} does not fit in the {size}-byte file")
        if n > MAX_HEADER:
            raise header_error(path, f"its declared header length {n} exceeds the {MAX_HEADER}-byte limit")
        header = os.pread(fd, n, 8)
        if len(header) != n:
            raise header_error(path, "it was truncated while being read")
        return parse_header_bytes(path, prefix, header, size)
    finally:
        os.close(fd)


# -- planning ----------------------------------------------------------------------------------


def file_problem(path: str) -> str | None:
    """Why ``path`` is not a complete checkpoint file, or None when it is: it exists, is a regular non-empty file,
    and a ``.safetensors`` header or a ``.json`` document reads whole (other files: presence and size only).
    The one definition for GPU cleanup's checkpoint guard and the training launcher's epoch check."""
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isfile(path):
        return f"{path} is not a regular file"
    if os.path.getsize(path) == 0:
        return f"{path} is empty"
    if path.endswith(".safetensors"):
        try:
            read_header(path)
        except SafetensorsError as exc:
            return str(exc)
    elif path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as fh:
                json.load(fh)
        except ValueError:
            return f"{path} is not complete JSON"
    return None


def encode_header(obj: dict[str, Any], pad_to: int | None = None) -> bytes:
    """Length prefix + JSON, padded with spaces to ``pad_to`` bytes of JSON (or to a multiple of 8)."""
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    target = pad_to if pad_to is not None else (len(body) + 7) // 8 * 8
    if len(body) > target:
        raise ValueError("header does not fit")
    body += b" " * (target - len(body))
    return struct.pack("<Q", len(body)) + body


# -- sharded checkpoints -----------------------------------------------------------------------

INDEX_NAME = "model.safetensors.index.json"


def read_index(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            index = json.load(fh)
    except ValueError as exc:
        raise SafetensorsError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise SafetensorsError(f"{path} has no weight_map: it is not a safetensors index")
    return index
