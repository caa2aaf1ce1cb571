"""The peer's environment for the benchmarks that time community.proxmox's proxmox_pct_remote connection.

That connection needs paramiko; eagle3-ops does not, and ansible-core imports paramiko (and with it invoke, asyncio
and unittest.mock) at the start of every run wherever it is installed (ansible.utils.ssh_functions): 80 ms of every
ansible-playbook run on this machine (measured 2026-12-06: 0.58 s against 0.50 s for a playbook with no task). So the
project's .venv goes without it, and the peer's runs find it in .venv-peer (requirements-peer.txt, installed here on
first use without dependencies: the rest comes from .venv) through PYTHONPATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "benchmarks" / "requirements-peer.txt"
TARGET = ROOT / ".venv-peer"
STAMP = TARGET / ".installed-requirements"


def install() -> Path:
    """.venv-peer with the pinned packages (installed when its stamp differs from the requirements), complete or
    absent: a failed install leaves no stamp, and the next run installs again."""
    wanted = REQUIREMENTS.read_text()
    if STAMP.is_file() and STAMP.read_text() == wanted:
        return TARGET
    STAMP.unlink(missing_ok=True)
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(TARGET), "-r",
            str(REQUIREMENTS)]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"installing the peer's packages ({REQUIREMENTS.name}) into {TARGET} failed: "
                         f"{proc.stderr.strip()[-2000:]}; check pip's index, or leave the peer out.")  # fmt: skip
    STAMP.write_text(wanted)
    return TARGET


def env(base: dict[str, str]) -> dict[str, str]:
    """``base`` with the peer's packages on PYTHONPATH (installed first when they are not)."""
    path = str(install())
    return {**base, "PYTHONPATH": os.pathsep.join(p for p in (path, base.get("PYTHONPATH", "")) if p)}
