# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A safetensors header codec: read, validate, rename and rewrite headers without loading tensor data.

File layout (https://github.com/huggingface/safetensors): an 8-byte little-endian header length N,
N bytes of UTF-8 JSON (may end in spaces), then the data section. Each tensor's
``data_offsets`` are relative to the data section. The JSON maps names to
``{"dtype", "shape", "data_offsets": [begin, end]}`` plus an optional ``__metadata__`` of strings.

Two ways to write a new header:

* in place, when it fits in the old N bytes (padded with spaces): the old header is first saved whole
  to a checksummed journal beside the file and fsynced; an interrupted rewrite is rolled back from the
  journal the next time the file is opened through :func:`recover`;
* rewrite, otherwise (or when tensors are dropped): a temporary file beside the original gets the new
  header and the data copied by the kernel (``copy_file_range``/``sendfile``), is fsynced, checked, and
  atomically renamed over the original.

Both paths validate the new header with the rules of every read before a byte is written, refuse a file
the user could not write, and run under :class:`CheckpointLock` (one fcntl lock per checkpoint directory,
which NFS forwards to its server), so runs on one checkpoint from several hosts are serialised.

Pure Python, no Ansible imports: unit-testable on its own and importable by modules.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import secrets
import socket
import struct
import time
from collections.abc import Callable, Iterable
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
JOURNAL_MAGIC = b"E3REMAP2"
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
        if new != name and new in RESERVED_NAMES:
            raise SafetensorsError(
                f"renaming {name!r} in {path} would give a tensor the reserved name {new!r}, which the format keeps "
                "for metadata: fix the rules"
            )
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
#
# Every write of a checkpoint runs under CheckpointLock (one lock per checkpoint directory, an fcntl
# lock, which NFS forwards to its server), reads the offsets it rewrites only once it holds the lock, and
# writes each byte range whole (a short write is retried, a write that makes no progress fails) before
# the original is touched. Temporary names carry the host, the PID and a random part: PIDs are per
# container, and containers on one share can run the same PID at once.


def host_tag() -> str:
    """This host's name, reduced to characters that are safe in a file name."""
    return re.sub(r"[^A-Za-z0-9_.]", "_", socket.gethostname() or "host")[:64] or "host"


def unique_suffix() -> str:
    """HOST-PID-RANDOM: unique across the hosts that share one directory."""
    return f"{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


def temporary_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.tmp-{unique_suffix()}")


def journal_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{JOURNAL_SUFFIX}")


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite ``data`` whole at ``offset``: a short write is continued, one that writes nothing fails (ENOSPC)."""
    view = memoryview(data)
    done = 0
    while done < len(view):
        n = os.pwrite(fd, view[done:], offset + done)
        if n <= 0:
            raise OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} (only {done} of {len(view)} bytes written)")
        done += n


def new_file_mode() -> int:
    """The mode an ordinary write gives a new file: 0666 less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _mode_for(target: str) -> int:
    """An existing file keeps its mode when it is replaced; a new one gets what the umask gives."""
    try:
        return os.stat(target).st_mode & 0o7777
    except FileNotFoundError:
        return new_file_mode()


def check_writable(path: str) -> None:
    """Refuse, before anything is written, a file this user could not write (both write paths use this rule).

    The rewrite path could replace such a file through its writable directory; a checkpoint the user may not
    write is refused on both paths instead.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    if os.statvfs(directory).f_flag & os.ST_RDONLY:
        raise SafetensorsError(f"{path} is on a read-only file system: remount it read-write (or export on a host "
                               "that mounts it so); nothing was changed")
    if os.path.exists(path) and not os.path.islink(path) and not os.access(path, os.W_OK):
        st = os.stat(path)
        raise SafetensorsError(
            f"{path} is not writable by this user (mode {st.st_mode & 0o7777:04o}, owner uid {st.st_uid}): "
            "fix its permissions or run as its owner; nothing was changed"
        )
    if not os.access(directory, os.W_OK | os.X_OK):
        raise SafetensorsError(f"{directory} is not writable by this user (the journal and temporary files go there): "
                               "fix its permissions or run as its owner; nothing was changed")


# -- the lock ----------------------------------------------------------------------------------

LOCK_NAME = ".eagle3-checkpoint.lock"


class CheckpointLock:
    """An exclusive advisory lock on one checkpoint directory, held by every run that writes in it.

    ``fcntl.lockf`` (POSIX record locks) is forwarded to the server by NFSv4 and NFSv3 with lockd, so hosts that
    mount one share exclude each other; the kernel drops the lock when its holder dies, so a killed run leaves
    no stale lock. The lock file holds who has it (host, PID, since when) for the message others get; it is
    removed on release, and a waiter that locked a file that was removed meanwhile tries again.
    """

    def __init__(self, directory: str, timeout: float = 300.0, what: str = "a checkpoint write") -> None:
        self.directory = os.path.abspath(directory)
        self.path = os.path.join(self.directory, LOCK_NAME)
        self.timeout = timeout
        self.what = what
        self.fd: int | None = None
        self.readonly = False  # the directory cannot be written here: no lock was taken

    def _holder(self, fd: int) -> str:
        try:
            info = json.loads(os.pread(fd, 4096, 0).decode("utf-8") or "{}")
        except (OSError, ValueError):
            info = {}
        if not isinstance(info, dict) or "host" not in info:
            return "another run holds the lock"
        return (f"another run ({info.get('what', 'a write')} by pid {info.get('pid')} on host {info.get('host')}) "
                f"holds the lock since {info.get('since')}")

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout
        holder = "another run holds the lock"
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, new_file_mode())
            except OSError as exc:
                if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
                    # Nobody can write here through this mount or as this user, so nothing to serialise: a run
                    # that finds nothing to do succeeds, and any write is refused by check_writable.
                    self.readonly = True
                    return
                raise
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    os.close(fd)
                    raise
                holder = self._holder(fd)
                os.close(fd)
                if time.monotonic() >= deadline:
                    raise SafetensorsError(
                        f"Cannot lock {self.directory}: {holder}, and did not release it within {self.timeout:g} s; "
                        "wait for that run to finish (or stop it), or raise the lock timeout; nothing was changed"
                    ) from None
                time.sleep(0.1)
                continue
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                os.close(fd)  # released and removed meanwhile: lock the new file
                continue
            mine = os.fstat(fd)
            if (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                os.close(fd)
                continue
            info = {"host": socket.gethostname(), "pid": os.getpid(), "what": self.what,
                    "since": time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())}  # fmt: skip
            try:  # who holds it, for the message others get; the lock holds without it (a full disk, say)
                os.ftruncate(fd, 0)
                write_all(fd, json.dumps(info).encode("utf-8"), 0)
            except OSError:
                pass
            self.fd = fd
            _hook("locked")
            return

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)  # closing drops the lock
            self.fd = None

    def __enter__(self) -> CheckpointLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LockSet:
    """Locks on several directories, taken in one order (their real paths sorted) so two runs cannot deadlock."""

    def __init__(self, directories: list[str], timeout: float, what: str) -> None:
        unique = sorted({os.path.realpath(d) for d in directories})
        self.locks = [CheckpointLock(d, timeout, what) for d in unique]

    def __enter__(self) -> LockSet:
        taken: list[CheckpointLock] = []
        try:
            for lock in self.locks:
                lock.acquire()
                taken.append(lock)
        except BaseException:
            for lock in reversed(taken):
                lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for lock in reversed(self.locks):
            lock.release()


# -- the journal -------------------------------------------------------------------------------
# Layout: MAGIC, file size (u64), header length L (u64), the L header bytes, their SHA-256. A journal whose
# checksum does not match was cut short before it was fsynced, and so before the file was touched.


def _journal_blob(header: Header) -> bytes:
    body = struct.pack("<QQ", header.file_size, len(header.raw)) + header.raw
    return JOURNAL_MAGIC + body + hashlib.sha256(JOURNAL_MAGIC + body).digest()


def pending_journal(path: str) -> bytes | None:
    """The header bytes a valid journal of ``path`` would restore, or None (no journal, or a torn one).

    A torn journal (cut short before it was fsynced) means the file was not touched yet; recover() removes
    it. A complete journal that does not match the file is an error, in check mode as in a real run.
    """
    jpath = journal_path(path)
    try:
        with open(jpath, "rb") as fh:
            blob = fh.read()
    except FileNotFoundError:
        return None
    head = len(JOURNAL_MAGIC)
    if not blob.startswith(JOURNAL_MAGIC) or len(blob) < head + 16 + 32:
        return None
    if hashlib.sha256(blob[:-32]).digest() != blob[-32:]:
        return None  # torn: written only partly, before it was fsynced, so before the file was touched
    size, length = struct.unpack("<QQ", blob[head : head + 16])
    saved = blob[head + 16 : -32]
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
    """Roll back an interrupted in-place rewrite of ``path`` from its journal. True when it did.

    Call it with the checkpoint's lock held: a journal is only ever pending while no run holds the lock.
    """
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
        write_all(fd, saved, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(jpath)
    _fsync_dir(path)
    return True


def _hook(name: str) -> None:
    """Test hooks at named points of a write, to test crash safety and force the order of concurrent runs.

    EAGLE3_CRASH_AT=<name> kills the process there; EAGLE3_HOLD_AT=<name>:<gate> creates ``<gate>.reached`` and
    waits (60 s at most) until ``<gate>`` exists.
    """
    if os.environ.get("EAGLE3_CRASH_AT") == name:
        os.kill(os.getpid(), 9)
    hold = os.environ.get("EAGLE3_HOLD_AT", "")
    point, _sep, gate = hold.partition(":")
    if point == name and gate:
        with open(gate + ".reached", "w", encoding="utf-8") as fh:
            fh.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(0.02)


def _require_unchanged(fd: int, header: Header) -> None:
    """Refuse when the file open on ``fd`` no longer has the size and header bytes that were read."""
    if os.fstat(fd).st_size != header.file_size or os.pread(fd, len(header.raw), 0) != header.raw:
        raise SafetensorsError(f"{header.path} changed while it was being remapped (another writer that does not "
                               "take the checkpoint lock?): rerun once it is done")


def validate_new_header(header: Header, new: bytes, copies: list[tuple[int, int, int]] | None = None) -> None:
    """Parse a header about to be written with the rules every read uses, before a byte of it is written.

    ``copies`` are the data ranges the new file will hold (write_rewrite's); None keeps the data section whole.
    """
    data = header.file_size - header.data_start if copies is None else sum(ln for _s, _d, ln in copies)
    size = len(new) + data
    try:
        parse_header_bytes(header.path, new[:8], new[8:], size)
    except SafetensorsError as exc:
        problem = str(exc).split(": ", 1)[-1]
        raise SafetensorsError(f"the new header of {header.path} would not load ({problem}): fix the rules; "
                               "nothing was changed") from None


def write_in_place(header: Header, new: bytes) -> None:
    """Replace the header bytes of ``header.path`` (same length) behind an fsynced journal.

    The journal is written whole and fsynced before the file is opened for writing; a journal that cannot be
    written whole is removed and the file is left as it was. The file must still hold the header that was
    read (the lock makes sure of it; the check catches writers that do not take it).
    """
    if len(new) != len(header.raw):
        raise SafetensorsError(f"{header.path}: an in-place header must keep its length ({len(header.raw)} bytes)")
    validate_new_header(header, new)
    jpath = journal_path(header.path)
    fd = os.open(jpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        try:
            write_all(fd, _journal_blob(header), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        _fsync_dir(header.path)
    except BaseException:
        os.unlink(jpath)  # the file was not touched: a partial journal would only be in the way
        raise
    _hook("journal-written")
    written = False  # once a byte may have reached the file, only the journal can put it back
    try:
        fd = os.open(header.path, os.O_RDWR)
        try:
            _require_unchanged(fd, header)
            written = True
            half = len(new) // 2
            write_all(fd, new[:half], 0)
            _hook("header-half-written")
            write_all(fd, new[half:], half)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        if written:
            recover(header.path)  # put the old header back before reporting the failure
        else:
            os.unlink(jpath)  # nothing was written: the journal is moot
            _fsync_dir(header.path)
        raise
    _hook("header-written")
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
    new file has been fsynced and re-read. The new file gets the mode of the file it replaces, or, when
    nothing is replaced, the mode an ordinary write gives (0666 less the umask).
    """
    target = dest or header.path
    validate_new_header(header, new, copies)
    data_len = header.file_size - header.data_start
    if copies is None:
        copies = [(0, 0, data_len)] if data_len else []
    tmp = temporary_path(target)
    replaced = None if os.path.islink(target) else (os.stat(target) if os.path.exists(target) else None)
    mode = replaced.st_mode & 0o7777 if replaced else new_file_mode()
    src = os.open(header.path, os.O_RDONLY)
    try:
        _require_unchanged(src, header)
        dst = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(dst, mode)
            if replaced is not None:
                try:
                    os.fchown(dst, replaced.st_uid, replaced.st_gid)
                except PermissionError:
                    pass
            write_all(dst, new, 0)
            for s, d, ln in copies:
                copy_range(src, dst, header.data_start + s, len(new) + d, ln)
            _hook("rewrite-data-copied")
            os.fsync(dst)
        finally:
            os.close(dst)
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


def new_header_bytes(plan: Plan, dest: str | None = None) -> tuple[str, bytes, list[tuple[int, int, int]] | None]:
    """(method, header bytes, data copies or None for the whole section) that apply() would write for ``plan``.

    The write paths validate the header before writing; validate_new_header(plan.header, new, copies) refuses it
    earlier, writing nothing.
    """
    new = _in_place_header(plan, dest)
    if new is not None:
        return "in_place", new, None
    compact = bool(plan.dropped)
    obj, copies = build_header(plan, compact)
    return "rewrite", encode_header(obj), copies if compact else None


def apply(plan: Plan, dest: str | None = None) -> str:
    """Carry out ``plan``: 'in_place' when the header fits, nothing is dropped and the path is no link."""
    method, new, copies = new_header_bytes(plan, dest)
    if method == "in_place":
        write_in_place(plan.header, new)
        return "in_place"
    return write_rewrite(plan.header, new, copies, dest)


# -- leftovers of killed runs ------------------------------------------------------------------

# Temporary files of this module: ".NAME.tmp-HOST-PID-RANDOM" (this version), ".NAME.tmp-PID" and
# "NAME.tmp-PID" (earlier versions, which took no lock).
_TMP_RE = re.compile(
    r"^(?:\.(?P<hidden>.+?)|(?P<plain>.+?))\.tmp-(?:(?P<pid>\d+)|(?P<host>[A-Za-z0-9_.]+)-(?P<hpid>\d+)-[0-9a-f]{8})$"
)


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


def stale_temporaries(paths: list[str], locked: bool = True) -> list[str]:
    """Temporary files beside ``paths`` left by runs that were killed mid-write.

    With the directory's lock held (``locked``), every temporary of this version is stale: a writer holds the
    lock for as long as its temporary exists, on whichever host it runs. A name of an earlier version (PID only)
    is stale when no process of that PID runs here. Without the lock (check mode) the same answer is predicted.
    """
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
            if not os.path.isfile(full) or os.path.islink(full):
                continue
            if m.group("pid") is not None:
                if _pid_alive(int(m.group("pid"))):
                    continue
            elif not locked and m.group("host") == host_tag() and _pid_alive(int(m.group("hpid"))):
                continue
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


def _replace_atomic(path: str, fill: Callable[[int], None]) -> None:
    """``fill`` a temporary beside ``path``, fsync it and rename it over ``path``: complete or absent, never partial.

    The temporary is removed on every error; the file keeps the mode of the one it replaces (a new one gets
    0666 less the umask).
    """
    tmp = temporary_path(path)
    mode = _mode_for(path)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, mode)
            fill(fd)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(path)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary (see _replace_atomic)."""
    data = (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    _replace_atomic(path, lambda fd: write_all(fd, data, 0))


def write_lines_atomic(path: str, lines: Iterable[str]) -> int:
    """Write text ``lines`` (each with its own newline), as they come, to ``path`` through a temporary of its own
    (see _replace_atomic): an error raised while they are produced leaves ``path`` as it was, and writers of one
    shared file on several hosts each rename a complete file over it. Returns the bytes written."""
    written = 0

    def fill(fd: int) -> None:
        nonlocal written
        chunk: list[bytes] = []
        size = 0
        for line in lines:
            data = line.encode("utf-8")
            chunk.append(data)
            size += len(data)
            if size >= 1 << 20:
                write_all(fd, b"".join(chunk), written)
                written, chunk, size = written + size, [], 0
        write_all(fd, b"".join(chunk), written)
        written += size

    _replace_atomic(path, fill)
    return written


def copy_file_atomic(src: str, dest: str) -> None:
    """Copy ``src`` to ``dest`` through a temporary beside it (see _replace_atomic)."""

    def fill(fd: int) -> None:
        with open(src, "rb") as fin:
            offset = 0
            while chunk := fin.read(1 << 20):
                write_all(fd, chunk, offset)
                offset += len(chunk)

    _replace_atomic(dest, fill)
