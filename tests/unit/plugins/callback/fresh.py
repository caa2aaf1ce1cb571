"""A check of a callback in a fresh Python: ansible's configuration is process-wide, and the callbacks patch it (the
connection plugins' definitions, the template environment), so a test before in the same worker must not leak in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]


def run_fresh(code: str, *args: str, **env: str) -> dict:
    """Run CODE with ARGS in a new Python with the project's ansible.cfg and ENV; its last line, as JSON."""
    environ = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PYTHONPATH": str(ROOT), **env}
    environ.pop("EAGLE3_TEST_COLLECTIONS", None)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, env=environ, capture_output=True, text=True,
                         check=True, timeout=120)  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])
