"""The GPU emulation's accounting: memory follows live holders, orphans keep it, death frees it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.modules import ROOT
from tests.unit.conftest import processes_with_env

NVEMU = ROOT / "eagle3_ops" / "lab_host" / "nvemu.py"


@pytest.fixture
def gpus(tmp_path, monkeypatch):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_bytes(b"")
    env = {"NVEMU_DEV_DIR": str(dev), "NVEMU_CTX_DIR": str(tmp_path / "ctx")}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    yield env
    # Whatever this test started and left: exactly the processes carrying its own context directory.
    for pid in processes_with_env("NVEMU_CTX_DIR", env["NVEMU_CTX_DIR"]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def nvemu_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(NVEMU.parent)}


def smi(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(NVEMU), "smi", *args], capture_output=True, text=True, check=False)


def used() -> list[int]:
    out = smi("--query-gpu=memory.used", "--format=csv,noheader,nounits").stdout
    return [int(x) for x in out.split()]


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def test_idle_gpus_report_a_few_mib(gpus):
    assert used() == [3, 3]
    out = smi("--query-gpu=index,uuid,memory.total,power.draw,power.limit", "--format=csv")
    lines = out.stdout.splitlines()
    assert lines[0] == "index, uuid, memory.total [MiB], power.draw [W], power.limit [W]"
    assert lines[1].startswith("0, GPU-") and "97887 MiB" in lines[1] and "600.00 W" in lines[1]
    assert smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader").stdout == ""


def test_holder_memory_is_freed_when_it_dies_and_orphans_keep_it(gpus):
    code = (
        "import os, time, nvemu\n"
        "c = nvemu.alloc(1, 40000)\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(60)\n"
        "print(child, flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=nvemu_env())
    child = int(proc.stdout.readline())
    try:
        wait_for(lambda: used() == [3, 40003])
        apps = smi("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits").stdout
        assert apps.strip().endswith(f"{proc.pid}, 40000")
        proc.kill()
        proc.wait()
        time.sleep(0.2)
        # The forked child inherited the context: the memory stays, now attributed to the orphan.
        assert used() == [3, 40003]
        apps = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits").stdout
        assert apps.strip() == f"{child}, 40000"
    finally:
        os.kill(child, signal.SIGKILL)
    wait_for(lambda: used() == [3, 3])


def test_unknown_fields_and_missing_format(gpus):
    bad = smi("--query-gpu=index,nope", "--format=csv")
    assert bad.returncode == 2 and 'Field "nope" is not a valid field to query.' in bad.stdout
    nofmt = smi("--query-gpu=index")
    assert nofmt.returncode == 2
    assert (
        smi("-i", "7", "--query-gpu=index", "--format=csv").stdout.strip()
        == "No devices were found matching the ID '7'"
    )


def test_default_table_lists_processes(gpus):
    code = "import time, nvemu; nvemu.alloc(0, 1234); print('ok', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=nvemu_env())
    try:
        assert proc.stdout.readline().strip() == "ok"
        table = smi().stdout
        assert "NVIDIA-SMI" in table and "1237MiB / 97887MiB" in table and f"{proc.pid}" in table
    finally:
        proc.kill()
        proc.wait()


def test_workload_helper_reproduces_the_torchrun_picture(gpus, tmp_path):
    pidfile = tmp_path / "pids.json"
    out = subprocess.run(
        [
            sys.executable,
            str(NVEMU),
            "workload",
            "--mib",
            "5000",
            "--dataloader-workers",
            "1",
            "--ignore-term-ranks",
            "1",
            "--bystander",
            "--pidfile",
            str(pidfile),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    pids = json.loads(out.stdout)
    assert json.loads(pidfile.read_text()) == pids
    try:
        assert used() == [5003, 5003]
        os.kill(pids["agent"], signal.SIGTERM)
        time.sleep(1)
        # Rank 1 ignored SIGTERM; both ranks' DataLoader children survive as orphans.
        assert used() == [5003, 5003]
    finally:
        for pid in processes_with_env("NVEMU_CTX_DIR", gpus["NVEMU_CTX_DIR"]):
            if pid != pids["bystander"]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        os.kill(pids["bystander"], signal.SIGKILL)
    wait_for(lambda: used() == [3, 3])
