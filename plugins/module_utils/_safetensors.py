# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A safetensors header codec: read, validate, rename and rewrite headers without loading tensor data.

File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of UTF-8 JSON (may end in spaces), then the data section. Each tensor's
``data_offsets`` are relative to the data section. The JSON maps names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional ``__metadata__`` of strings.

Two ways to write a new header:

* in place, when it fits in the old N bytes (padded with spaces): the old header is first saved to a
  journal beside the file and fsynced; an interrupted rewrite is rolled back from the journal the next
  time the file is opened through :func:`recover`;
* rewrite, otherwise (or when tensors are dropped): a temporary file beside the original gets the new
  header and the data copied by the kernel (``copy_file_range``/``sendfile``), is fsynced, checked, and
  atomically renamed over the original.

Pure Python, no Ansible imports: unit-testable on its own and importable by modules.
"""

from __future__ import annotations

import errno
import json
import os
import re
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
JOURNAL_SUFFIX = ".remap-journal"
JOURNAL_MAGIC = b"E3REMAP1"


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


def _fail(path: str, problem: str) -> SafetensorsError:
    return SafetensorsError(f"{path} is not a valid safetensors file: {problem}")


def parse_header_bytes(path: str, prefix: bytes, header: bytes, file_size: int) -> Header:
    """Validate and parse a header already read from ``path``; ``file_size`` bounds the data spans."""
    (n,) = struct.unpack("<Q", prefix)
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, f"its header is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    if not text.startswith("{"):
        raise _fail(path, "its header does not start with '{'")

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _unused in pairs]
        if len(keys) != len(set(keys)):
            dup = next(k for k in keys if keys.count(k) > 1)
            raise ValueError(f"the name {dup!r} appears twice")
        return dict(pairs)

    try:
        obj = json.loads(text.rstrip(" "), object_pairs_hook=no_duplicates)
    except ValueError as exc:
        raise _fail(path, f"its header is not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise _fail(path, "its header is not a JSON object")
    metadata = obj.pop("__metadata__", None)
    if metadata is not None and (
        not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise _fail(path, "its __metadata__ is not a map of strings")
    data_size = file_size - 8 - n
    tensors: list[Tensor] = []
    for name, info in obj.items():
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise _fail(path, f"tensor {name!r} must have exactly dtype, shape and data_offsets")
        dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_BITS:
            raise _fail(path, f"tensor {name!r} has the unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise _fail(path, f"tensor {name!r} has an invalid shape {shape!r}")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        ):
            raise _fail(path, f"tensor {name!r} has invalid data_offsets {offsets!r}")
        begin, end = offsets
        numel = 1
        for d in shape:
            numel *= d
        bits = numel * DTYPE_BITS[dtype]
        if bits % 8:
            raise _fail(path, f"tensor {name!r} of {dtype} {shape} does not fill whole bytes")
        if not 0 <= begin <= end or end - begin != bits // 8:
            raise _fail(path, f"tensor {name!r} spans {end - begin} bytes where {dtype} {shape} needs {bits // 8}")
        if end > data_size:
            raise _fail(path, f"tensor {name!r} ends at byte {end} past the data section ({data_size} bytes)")
        tensors.append(Tensor(name, dtype, list(shape), begin, end))
    problem = layout_problem(tensors, data_size)
    if problem:
        raise _fail(path, problem)
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
            raise _fail(path, f"it is {size} bytes long, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", prefix)
        if n == 0:
            raise _fail(path, "its header is empty (declared length 0), not even '{}'")
        if n < 2:
            raise _fail(path, f"its declared header length {n} is too short for a JSON object")
        if 8 + n > size:
            raise _fail(path, f"its declared header length {n} does not fit in the {size}-byte file")
        if n > MAX_HEADER:
            raise _fail(path, f"its declared header length {n} exceeds the {MAX_HEADER}-byte limit")
        header = os.pread(fd, n, 8)
        if len(header) != n:
            raise _fail(path, "it was truncated while being read")
        return parse_header_bytes(path, prefix, header, size)
    finally:
        os.close(fd)


# -- planning ----------------------------------------------------------------------------------


@dataclass
class Plan:
    """What a remap of one file would do."""

    header: Header
    renames: list[tuple[str, str]]
    dropped: list[str]
    new_names: list[str]

    @property
    def changed(self) -> bool:
        return bool(self.renames or self.dropped)


def rename(name: str, rules: list[tuple[str, str]]) -> str:
    """Apply the first prefix rule that matches (rules are ordered)."""
    for old, new in rules:
        if name.startswith(old):
            return new + name[len(old) :]
    return name


def plan_names(
    path: str, names: list[str], rules: list[tuple[str, str]], drop: list[str]
) -> tuple[list[tuple[str, str]], list[str], list[str]]:
    """(renames, dropped, resulting names) for a list of tensor names; refuses duplicates."""
    patterns = [re.compile(p) for p in drop]
    renames: list[tuple[str, str]] = []
    dropped: list[str] = []
    result: list[str] = []
    seen: dict[str, str] = {}
    for name in names:
        if any(p.search(name) for p in patterns):
            dropped.append(name)
            continue
        new = rename(name, rules)
        if new in seen:
            raise SafetensorsError(
                f"renaming {path} would give two tensors the name {new!r} ({seen[new]!r} and {name!r}): "
                "fix the rules or drop one of them"
            )
        seen[new] = name
        if new != name:
            renames.append((name, new))
        result.append(new)
    return renames, dropped, result


def plan(header: Header, rules: list[tuple[str, str]], drop: list[str]) -> Plan:
    renames, dropped, names = plan_names(header.path, header.names, rules, drop)
    return Plan(header, renames, dropped, names)


def build_header(plan: Plan, compact: bool) -> tuple[dict[str, Any], list[tuple[int, int, int]]]:
    """The new header object, and (src_begin, dst_begin, length) data copies when compacting."""
    mapping = dict(plan.renames)
    dropped = set(plan.dropped)
    obj: dict[str, Any] = {}
    if plan.header.metadata is not None:
        obj["__metadata__"] = plan.header.metadata
    copies: list[tuple[int, int, int]] = []
    if not compact:
        for t in plan.header.tensors:
            if t.name not in dropped:
                obj[mapping.get(t.name, t.name)] = t.entry()
        return obj, copies
    position = 0
    kept = {t.name for t in plan.header.tensors if t.name not in dropped}
    new_begin: dict[str, int] = {}
    for t in sorted(plan.header.tensors, key=lambda t: t.begin):
        if t.name not in kept:
            continue
        new_begin[t.name] = position
        length = t.end - t.begin
        if copies and copies[-1][0] + copies[-1][2] == t.begin and copies[-1][1] + copies[-1][2] == position:
            src, dst, ln = copies[-1]
            copies[-1] = (src, dst, ln + length)
        else:
            copies.append((t.begin, position, length))
        position += length
    for t in plan.header.tensors:
        if t.name in kept:
            obj[mapping.get(t.name, t.name)] = t.entry(new_begin[t.name])
    return obj, copies


def encode_header(obj: dict[str, Any], pad_to: int | None = None) -> bytes:
    """Length prefix + JSON, padded with spaces to ``pad_to`` bytes of JSON (or to a multiple of 8)."""
    body = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    target = pad_to if pad_to is not None else (len(body) + 7) // 8 * 8
    if len(body) > target:
        raise ValueError("header does not fit")
    body += b" " * (target - len(body))
    return struct.pack("<Q", len(body)) + body


# -- writing -----------------------------------------------------------------------------------


def journal_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{JOURNAL_SUFFIX}")


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def pending_journal(path: str) -> bytes | None:
    """The header bytes a valid journal of ``path`` would restore, or None (no journal, or a torn one).

    A torn journal (cut short before it was fsynced) means the file was not touched yet; recover() removes
    it. A journal that does not match the file is an error, in check mode as in a real run.
    """
    jpath = journal_path(path)
    try:
        with open(jpath, "rb") as fh:
            blob = fh.read()
    except FileNotFoundError:
        return None
    if not blob.startswith(JOURNAL_MAGIC) or len(blob) < len(JOURNAL_MAGIC) + 16:
        return None
    size, length = struct.unpack("<QQ", blob[len(JOURNAL_MAGIC) : len(JOURNAL_MAGIC) + 16])
    saved = blob[len(JOURNAL_MAGIC) + 16 :]
    if len(saved) != length or os.path.getsize(path) != size:
        raise SafetensorsError(
            f"{jpath} does not match {path}; inspect both, then remove the journal if the file loads"
        )
    return saved


def read_header_as_recovered(path: str) -> tuple[Header, bool]:
    """The header ``path`` will have once recover() ran, without writing anything (for check mode).

    Returns (header, True) when a pending journal would roll the file back, else (read_header(path), False).
    """
    saved = pending_journal(path)
    if saved is None:
        return read_header(path), False
    size = os.path.getsize(path)
    if len(saved) < 8:
        raise _fail(path, "its journal holds fewer than 8 header bytes")
    return parse_header_bytes(path, saved[:8], saved[8:], size), True


def recover(path: str) -> bool:
    """Roll back an interrupted in-place rewrite of ``path`` from its journal. True when it did."""
    jpath = journal_path(path)
    saved = pending_journal(path)
    if saved is None:
        if os.path.lexists(jpath):
            # The journal itself was cut short before it was fsynced: the file was not touched yet.
            os.unlink(jpath)
            _fsync_dir(path)
        return False
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, saved, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(jpath)
    _fsync_dir(path)
    return True


def _crash_point(name: str) -> None:
    """Test hook: EAGLE3_CRASH_AT=<name> kills the process at that point, to test crash safety."""
    if os.environ.get("EAGLE3_CRASH_AT") == name:
        os.kill(os.getpid(), 9)


def write_in_place(header: Header, new: bytes) -> None:
    """Replace the header bytes of ``header.path`` (same length) behind an fsynced journal."""
    if len(new) != len(header.raw):
        raise SafetensorsError(f"{header.path}: an in-place header must keep its length ({len(header.raw)} bytes)")
    jpath = journal_path(header.path)
    blob = JOURNAL_MAGIC + struct.pack("<QQ", header.file_size, len(header.raw)) + header.raw
    fd = os.open(jpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, blob)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_dir(header.path)
    _crash_point("journal-written")
    written = False  # once a byte may have reached the file, only the journal can put it back
    try:
        fd = os.open(header.path, os.O_WRONLY)
        try:
            written = True
            half = len(new) // 2
            os.pwrite(fd, new[:half], 0)
            _crash_point("header-half-written")
            os.pwrite(fd, new[half:], half)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        if written:
            recover(header.path)  # put the old header back before reporting the failure
        else:
            os.unlink(jpath)  # nothing was written (the file could not be opened): the journal is moot
            _fsync_dir(header.path)
        raise
    _crash_point("header-written")
    os.unlink(jpath)
    _fsync_dir(header.path)


def copy_range(src: int, dst: int, src_off: int, dst_off: int, length: int) -> None:
    """Kernel-side copy of a byte range (copy_file_range, else sendfile), constant memory."""
    remaining = length
    use_cfr = hasattr(os, "copy_file_range")
    while remaining:
        chunk = min(remaining, 1 << 30)
        if use_cfr:
            try:
                n = os.copy_file_range(src, dst, chunk, src_off, dst_off)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                    raise
                use_cfr = False
                continue
        else:
            os.lseek(dst, dst_off, os.SEEK_SET)
            n = os.sendfile(dst, src, src_off, chunk)
        if n == 0:
            raise OSError(errno.EIO, "unexpected end of file while copying tensor data")
        src_off += n
        dst_off += n
        remaining -= n


def write_rewrite(
    header: Header, new: bytes, copies: list[tuple[int, int, int]] | None, dest: str | None = None
) -> str:
    """Write header ``new`` plus the data to a temporary file beside ``dest``, check it, rename it in place.

    ``copies`` lists (src_begin, dst_begin, length) data ranges; None copies the data section whole.
    ``dest`` defaults to the original path (an atomic replace); the original is untouched until the
    new file has been fsynced and re-read.
    """
    target = dest or header.path
    directory = os.path.dirname(os.path.abspath(target))
    tmp = os.path.join(directory, f".{os.path.basename(target)}.tmp-{os.getpid()}")
    data_len = header.file_size - header.data_start
    if copies is None:
        copies = [(0, 0, data_len)] if data_len else []
    src = os.open(header.path, os.O_RDONLY)
    try:
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(dst, new)
            for s, d, ln in copies:
                copy_range(src, dst, header.data_start + s, len(new) + d, ln)
            _crash_point("rewrite-data-copied")
            os.fsync(dst)
        finally:
            os.close(dst)
        st = os.stat(header.path)
        os.chmod(tmp, st.st_mode & 0o7777)
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass
        read_header(tmp)  # prove the new file before it replaces anything
        os.rename(tmp, target)
        _fsync_dir(target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    finally:
        os.close(src)
    return "rewrite"


def _in_place_header(plan: Plan, dest: str | None) -> bytes | None:
    """The same-length header for an in-place write, or None when the rewrite path must be taken.

    A symlink (a Hugging Face cache entry pointing into its content-addressed blobs) is never written
    through: the rewrite path replaces the link itself with a regular file and leaves the blob alone.
    """
    if plan.dropped or dest is not None or os.path.islink(plan.header.path):
        return None
    obj, _unused = build_header(plan, compact=False)
    try:
        return encode_header(obj, pad_to=plan.header.header_len)
    except ValueError:
        return None


def method_for(plan: Plan, dest: str | None = None) -> str:
    """What apply() would do: 'none', 'in_place' or 'rewrite' (check mode reports the same)."""
    if not plan.changed and dest is None:
        return "none"
    return "in_place" if _in_place_header(plan, dest) is not None else "rewrite"


def apply(plan: Plan, dest: str | None = None) -> str:
    """Carry out ``plan``: 'in_place' when the header fits, nothing is dropped and the path is no link."""
    new = _in_place_header(plan, dest)
    if new is not None:
        write_in_place(plan.header, new)
        return "in_place"
    compact = bool(plan.dropped)
    obj, copies = build_header(plan, compact)
    return write_rewrite(plan.header, encode_header(obj), copies if compact else None, dest)


# -- leftovers of killed runs ------------------------------------------------------------------

# Temporary files of this module: ".NAME.tmp-PID" (rewrites, index writes) and "NAME.tmp-PID" (index
# writes of earlier versions). Only files whose writer PID is gone are stale.
_TMP_RE = re.compile(r"^(?:\.(?P<hidden>.+)|(?P<plain>.+))\.tmp-(?P<pid>\d+)$")


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(paths: list[str]) -> list[str]:
    """Temporary files beside ``paths`` left by runs of this module that were killed mid-write."""
    wanted: dict[str, set[str]] = {}
    for path in paths:
        directory, base = os.path.split(os.path.abspath(path))
        wanted.setdefault(directory, set()).add(base)
    stale = []
    for directory, bases in sorted(wanted.items()):
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for entry in entries:
            m = _TMP_RE.match(entry)
            if not m or (m.group("hidden") or m.group("plain")) not in bases:
                continue
            full = os.path.join(directory, entry)
            if os.path.isfile(full) and not os.path.islink(full) and not _pid_alive(int(m.group("pid"))):
                stale.append(full)
    return stale


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


def write_json_atomic(path: str, obj: Any) -> None:
    head, tail = os.path.split(path)
    tmp = os.path.join(head, f".{tail}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(obj, fh, indent=2, ensure_ascii=False)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path)
