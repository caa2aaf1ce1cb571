# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Writing a file complete or not at all: a temporary beside it (named by host, PID and a random part, so hosts on
one share never collide), fsynced, renamed over it; and finding the temporaries killed runs left. Used by the
modules (units, stamps, exports) and the training payload (which links this file). Standard library only.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any

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


def fsync_dir(path: str) -> None:
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


def _replace_atomic(path: str, fill: Callable[[int], None], mode: int | None = None) -> None:
    """``fill`` a temporary beside ``path``, fsync it and rename it over ``path``: complete or absent, never partial.

    The temporary is removed on every error; the file gets ``mode``, or else keeps the mode of the one it replaces
    (a new one gets 0666 less the umask). The temporary is 0600 from its creation, so a secret is never readable
    by others on its way in.
    """
    tmp = temporary_path(path)
    mode = _mode_for(path) if mode is None else mode
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
    fsync_dir(path)


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary (see _replace_atomic)."""
    data = (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    _replace_atomic(path, lambda fd: write_all(fd, data, 0))


def write_lines_atomic(path: str, lines: Iterable[str], mode: int | None = None) -> int:
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

    _replace_atomic(path, fill, mode)
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


def hook_point(name: str) -> None:
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
