# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Renaming and dropping a checkpoint's tensors by rewriting its header, without loading tensor data.

Two ways to write a new header:

* in place, when it fits in the old N bytes (padded with spaces): the old header is first saved whole
  to a checksummed journal beside the file and fsynced (_journal.py); an interrupted rewrite is rolled back from
  the journal the next time the file is opened through :func:`recover`;
* rewrite, otherwise (or when tensors are dropped): a temporary file beside the original gets the new
  header and the data copied by the kernel (``copy_file_range``/``sendfile``), is fsynced, checked, and
  atomically renamed over the original.

Both paths validate the new header with the rules of every read (_safetensors.py) before a byte is written, refuse
a file the user could not write, and run under :class:`CheckpointLock`.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._atomic import (
    fsync_dir,
    hook_point,
    new_file_mode,
    temporary_path,
    write_all,
)
from ansible_collections.eagle3.ops.plugins.module_utils._journal import (
    journal_blob,
    journal_path,
    recover,
)
from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import (
    RESERVED_NAMES,
    Header,
    SafetensorsError,
    encode_header,
    parse_header_bytes,
    read_header,
)


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
            write_all(fd, journal_blob(header), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(header.path)
    except BaseException:
        os.unlink(jpath)  # the file was not touched: a partial journal would only be in the way
        raise
    hook_point("journal-written")
    written = False  # once a byte may have reached the file, only the journal can put it back
    try:
        fd = os.open(header.path, os.O_RDWR)
        try:
            _require_unchanged(fd, header)
            written = True
            half = len(new) // 2
            write_all(fd, new[:half], 0)
            hook_point("header-half-written")
            write_all(fd, new[half:], half)
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        if written:
            recover(header.path)  # put the old header back before reporting the failure
        else:
            os.unlink(jpath)  # nothing was written: the journal is moot
            fsync_dir(header.path)
        raise
    hook_point("header-written")
    os.unlink(jpath)
    fsync_dir(header.path)


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
            hook_point("rewrite-data-copied")
            os.fsync(dst)
        finally:
            os.close(dst)
        read_header(tmp)  # prove the new file before it replaces anything
        os.rename(tmp, target)
        fsync_dir(target)
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
