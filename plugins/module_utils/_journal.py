# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serialising writers of one checkpoint and undoing an interrupted in-place header rewrite.

:class:`CheckpointLock` is one fcntl lock per checkpoint directory, which NFS forwards to its server, so runs on one
checkpoint from several hosts are serialised. Before a header is rewritten in place (_remap.py), the old header is
saved whole to a checksummed journal beside the file and fsynced; :func:`recover` rolls an interrupted rewrite back
from it the next time the file is opened.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import struct
import time

from ansible_collections.eagle3.ops.plugins.module_utils._atomic import (
    fsync_dir,
    hook_point,
    new_file_mode,
    write_all,
)
from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import (
    Header,
    SafetensorsError,
    header_error,
    parse_header_bytes,
    read_header,
)

JOURNAL_SUFFIX = ".remap-journal"
JOURNAL_MAGIC = b"E3REMAP2"


def journal_path(path: str) -> str:
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}{JOURNAL_SUFFIX}")


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
            hook_point("locked")
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


def journal_blob(header: Header) -> bytes:
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
        raise header_error(path, "its journal holds fewer than 8 header bytes")
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
            fsync_dir(path)
        return False
    fd = os.open(path, os.O_WRONLY)
    try:
        write_all(fd, saved, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.unlink(jpath)
    fsync_dir(path)
    return True
