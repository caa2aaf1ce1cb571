# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's own digest: what a new release of it changes (its roles, plugins, playbooks and the payloads it
installs). Part of every stage's fingerprint (the stage_stamp action plugin); computed once per process."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

COLLECTION = Path(__file__).resolve().parents[2]
PARTS = ("roles", "plugins", "playbooks", "eagle3_ops/payloads")
_digest: list[str] = []


def collection_digest(root: Path = COLLECTION) -> str:
    """sha256 over the collection's files (names and bytes), computed once per process."""
    if _digest and root == COLLECTION:
        return _digest[0]
    sha = hashlib.sha256()
    for part in PARTS:
        for base, dirs, files in os.walk(root / part):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith((".pyc", ".pyo")):
                    continue
                path = Path(base, name)
                sha.update(str(path.relative_to(root)).encode() + b"\0")
                sha.update(path.read_bytes())
    value = sha.hexdigest()
    if root == COLLECTION:
        _digest.append(value)
    return value
