# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Immutable draft versions under one draft root (on shared storage, mounted by every server).

An export never rewrites a draft a server may load: it writes a new directory named by the content hash of what it
was made from (the checkpoint's config and weights and the export's own parameters), beside the root's record of
which version each server serves (``versions.json``: ``servers``, ``current``, ``previous``). A version is staged in
a hidden directory and renamed into place whole, so it is complete or absent; two exports of one checkpoint make
one version. Versions no server serves are collected, the newest ``keep`` kept. Standard library only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import time
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._atomic import fsync_dir, unique_suffix, write_json_atomic

VERSION_CHARS = 16
RECORD = "versions.json"
_VERSION = re.compile(r"^[0-9a-f]{16}$")  # VERSION_CHARS hex digits
_STAGING = re.compile(r"^\.([0-9a-f]{16})\..+\.partial$")
STAGING_STALE_S = 24 * 3600


class VersionError(Exception):
    """A draft root or record that cannot be used as it is; the message names it and the fix."""


def content_digest(files: list[str], params: dict[str, Any]) -> str:
    """sha256 over the export's parameters (canonical JSON) and each file's name and bytes, in order."""
    digest = hashlib.sha256(json.dumps(params, sort_keys=True, separators=(",", ":")).encode())
    for path in files:
        digest.update(b"\0" + os.path.basename(path).encode() + b"\0")
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                digest.update(chunk)
    return digest.hexdigest()


def version_name(digest: str) -> str:
    return digest[:VERSION_CHARS]


def is_version(name: str) -> bool:
    return bool(_VERSION.match(name))


def staging_dir(root: str, version: str) -> str:
    """A new hidden directory in ``root`` for one writer's copy of ``version`` (host, pid and a random tag in its
    name)."""
    path = os.path.join(root, f".{version}.{unique_suffix()}.partial")
    os.mkdir(path, 0o755)
    return path


def publish(staging: str, final: str) -> bool:
    """Rename a complete staging directory to its version's name; False (and the copy removed) when another writer
    published it first - the same content, as the name is its hash."""
    try:
        os.rename(staging, final)
    except OSError as exc:
        if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
            raise
        shutil.rmtree(staging, ignore_errors=True)
        return False
    fsync_dir(os.path.dirname(final))
    return True


def read_record(root: str) -> dict[str, Any]:
    """The root's record: {"servers": {host: version}, "current": version|None, "previous": version|None,
    "history": [versions, oldest first]}; an empty one when there is none."""
    path = os.path.join(root, RECORD)
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
    except FileNotFoundError:
        record = {}
    except ValueError as exc:
        raise VersionError(f"{path} is not valid JSON ({exc}): restore it from the servers' units, or remove it and "
                           "deploy again (no version is collected while it is missing)") from None
    if not isinstance(record, dict):
        raise VersionError(f"{path} is not a JSON object: remove it and deploy again")
    record.setdefault("servers", {})
    record.setdefault("current", None)
    record.setdefault("previous", None)
    record.setdefault("history", [])
    return record


def record_served(record: dict[str, Any], host: str, version: str) -> bool:
    """``host`` serves ``version`` now (it passed its gates): the record updated in place; True when it changed.
    A version served for the first time becomes ``current``, and the one before ``previous``."""
    before = json.dumps(record, sort_keys=True)
    record["servers"][host] = version
    if record["current"] != version:
        record["previous"], record["current"] = record["current"], version
    if version in record["history"]:
        record["history"].remove(version)
    record["history"].append(version)
    return json.dumps(record, sort_keys=True) != before


def write_record(root: str, record: dict[str, Any]) -> None:
    write_json_atomic(os.path.join(root, RECORD), record)


def versions_on_disk(root: str) -> list[str]:
    """The version directories in ``root``, oldest first (by their directory's modification time, then name)."""
    found = [name for name in os.listdir(root) if is_version(name) and os.path.isdir(os.path.join(root, name))]
    return sorted(found, key=lambda name: (os.stat(os.path.join(root, name)).st_mtime, name))


def collectable(root: str, record: dict[str, Any], keep: int, protect: list[str] | None = None) -> list[str]:
    """The versions in ``root`` that may be removed: none that a server serves, nor current, previous or one in
    ``protect``, nor the newest ``keep`` (by the record's history, then the disk's order)."""
    if keep < 1:
        raise VersionError(f"keep must be 1 or more, not {keep}: the version being served is always kept")
    on_disk = versions_on_disk(root)
    order = [v for v in on_disk if v not in record["history"]] + [v for v in record["history"] if v in on_disk]
    kept = set(order[-keep:]) | set(record["servers"].values()) | {record["current"], record["previous"]}
    kept |= set(protect or [])
    return [v for v in order if v not in kept]


def stale_staging(root: str, now: float | None = None) -> list[str]:
    """Staging directories a writer left behind more than a day ago (a crashed export; a live one is minutes old)."""
    now = time.time() if now is None else now
    stale = []
    for name in os.listdir(root):
        path = os.path.join(root, name)
        if _STAGING.match(name) and os.path.isdir(path) and now - os.stat(path).st_mtime > STAGING_STALE_S:
            stale.append(path)
    return sorted(stale)
