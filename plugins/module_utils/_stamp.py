# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stage's fingerprint: digests of what it reads and writes, compared with the one kept after its last run.

Pure functions, no Ansible imports. A fingerprint is a flat map ``{key: digest}``: ``var:NAME`` and
``file:PATH`` come from the controller, ``stat:PATH`` and ``content:PATH`` from the host. Comparing two maps
names what changed, so a stage that runs again says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterable, Mapping
from typing import Any

# Directories are walked to this many entries at most: a store of millions of rows is fingerprinted by its
# manifest files, never by listing it (a path that exceeds this is refused, not silently truncated).
MAX_ENTRIES = 20000
SKIP_NAMES = frozenset({"__pycache__", ".git"})


def _transient(name: str) -> bool:
    """Lock files a writer creates and removes (eagle3_export's .eagle3-checkpoint.lock): no trace of a change."""
    return name.startswith(".") and name.endswith(".lock")


def digest(value: Any) -> str:
    """A stable digest of a JSON-able value (dict keys sorted)."""
    raw = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def file_digest(path: str) -> str:
    """The sha256 of a file's bytes, or ``absent``."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
    except FileNotFoundError:
        return "absent"
    return sha.hexdigest()


def _entry(path: str, st: os.stat_result) -> list[Any]:
    if stat.S_ISDIR(st.st_mode):
        # A directory's own mtime moves when a lock file comes and goes; its entries say what it holds.
        return [path, stat.S_IFMT(st.st_mode), st.st_ino]
    return [path, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino]


def tree_digest(root: str, max_entries: int = MAX_ENTRIES) -> str:
    """A digest of every entry under ``root`` (type, size, mtime, inode; contents not read), or ``absent``.

    Rewriting a file in place changes its mtime; replacing it changes its inode: both change the digest. A file
    added or removed changes the listing; a lock file that came and went (and the directory mtime it moved) does not.
    """
    try:
        top = os.lstat(root)
    except FileNotFoundError:
        return "absent"
    rows = [_entry(".", top)]
    if stat.S_ISDIR(top.st_mode):
        for base, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_NAMES)
            for name in [*dirs, *sorted(f for f in files if not _transient(f))]:
                full = os.path.join(base, name)
                try:
                    rows.append(_entry(os.path.relpath(full, root), os.lstat(full)))
                except FileNotFoundError:
                    continue  # removed while walking: the next run sees the difference
                if len(rows) > max_entries:
                    raise ValueError(f"{root} holds more than {max_entries} entries: fingerprint its manifest "
                                     "files instead of the whole directory")  # fmt: skip
    return digest(rows)


def host_digests(paths: Iterable[str], contents: Iterable[str]) -> dict[str, str]:
    out = {f"stat:{p}": tree_digest(p) for p in paths}
    out.update({f"content:{p}": file_digest(p) for p in contents})
    return out


def changed_keys(kept: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """Keys whose digest differs, appeared or disappeared, sorted."""
    return sorted(k for k in set(kept) | set(now) if kept.get(k) != now.get(k))


def describe(keys: list[str], limit: int = 4) -> str:
    """``draft_tokens, stat:/srv/x and 2 more`` - what changed, for a message."""
    names = [k[4:] if k.startswith("var:") else k for k in keys]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
