"""Fixtures of the unit tests: emulated GPU device nodes on this host (no lab needed)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

NVEMU = Path(__file__).resolve().parents[2] / "eagle3_ops" / "lab_host" / "nvemu.py"


def processes_with_env(name: str, value: str) -> list[int]:
    """PIDs whose environment has NAME=VALUE: the processes one test started, and nothing else."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if wanted in fh.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.fixture
def gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict]:
    """Four emulated GPUs in a directory of this test's own; its workloads are stopped afterwards."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_bytes(b"")
    ctx = str(tmp_path / "ctx")
    monkeypatch.setenv("NVEMU_DEV_DIR", str(dev))
    monkeypatch.setenv("NVEMU_CTX_DIR", ctx)
    started: list[int] = []
    yield {"dev": str(dev), "smi": f"{sys.executable} {NVEMU} smi", "started": started}
    # Exactly this test's processes: they inherited its NVEMU_CTX_DIR (a path no other test shares).
    for pid in [*processes_with_env("NVEMU_CTX_DIR", ctx), *started]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
