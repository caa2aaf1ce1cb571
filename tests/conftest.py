"""Shared fixtures: the repository, the lab (brought up once per session), and runners."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
LAB_STATE = ROOT / ".lab"
LAB_PORT = 10022


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        }
    )
    env.update(extra)
    return env


def run_playbook(
    playbook: str | Path, *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: int = 1200
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook from the repository root, as a user runs it; JSON-lines-free plain output."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), *args]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env or ansible_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def recap(output: str) -> dict[str, dict[str, int]]:
    """Parse the PLAY RECAP block into {host: {ok, changed, unreachable, failed, ...}}."""
    result: dict[str, dict[str, int]] = {}
    seen = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            seen = True
            continue
        if seen and ":" in line and "=" in line:
            host, _, counts = line.partition(":")
            result[host.strip()] = {k: int(v) for k, v in (p.split("=") for p in counts.split())}
    return result


def hop(*remote: str, input_bytes: bytes | None = None, timeout: int = 120) -> subprocess.CompletedProcess[bytes]:
    """Run a command on the lab hypervisor through its ssh hop, host key checked."""
    cmd = [
        "ssh",
        "-p",
        str(LAB_PORT),
        "-i",
        str(LAB_STATE / "id_ed25519"),
        "-o",
        f"UserKnownHostsFile={LAB_STATE / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "root@127.0.0.1",
        *remote,
    ]
    return subprocess.run(cmd, input=input_bytes, capture_output=True, timeout=timeout, check=False)


def pct(*args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(["pct", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"pct {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def smi(vmid: int, query: str = "index,memory.used") -> list[list[str]]:
    out = pct("exec", str(vmid), "--", "nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits").stdout
    return [line.split(", ") for line in out.splitlines()]


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    if not shutil.which("lxc-start"):
        return "LXC is not installed (apt-get install lxc)"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[dict[str, object]]:
    """The lab, up (idempotently) for the whole session."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    proc = run_playbook("lab.yml")
    yield {"recap": recap(proc.stdout), "output": proc.stdout}


@pytest.fixture
def json_loads():
    return json.loads
