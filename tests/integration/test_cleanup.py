"""cleanup.yml across the lab containers, with the workload helper's torchrun-like jobs."""

from __future__ import annotations

import pytest

from tests.conftest import LAB_PORT, lab_workload, pct, recap, run_playbook, smi, stop_marked

pytestmark = pytest.mark.lab


MARKER: list[str] = []  # the running test's marker (set by clean_lab)


def start_job(vmid: int, gpus: str, *extra: str) -> dict[str, int]:
    return lab_workload(vmid, MARKER[0], "--gpus", gpus, "--mib", "30000", "--dataloader-workers", "2", *extra)


def memory(vmid: int) -> list[int]:
    return [int(r[1]) for r in smi(vmid)]


@pytest.fixture
def clean_lab(lab, job_marker):
    MARKER[:] = [job_marker]
    yield
    for vmid in ("129", "130"):
        pct("start", vmid, check=False)
        stop_marked(vmid, job_marker)


def test_fleet_cleanup_check_mode_then_real_then_idempotent(clean_lab):
    job = start_job(129, "0-3", "--ignore-term-ranks", "1", "--bystander")
    start_job(130, "0")
    check = run_playbook("cleanup.yml", "--check", "-e", "gpu_cleanup_grace=2")
    assert recap(check.stdout)["ct129"]["failed"] == 0
    assert min(memory(129)) >= 30000 and memory(130)[0] >= 30000  # check mode touched nothing

    proc = run_playbook("cleanup.yml", "-e", "gpu_cleanup_grace=2")
    assert max(memory(129)) < 100 and memory(130)[0] < 100
    assert "ct129: holders=12 signalled=" in proc.stdout and "freed=120000 MiB" in proc.stdout
    assert "ct130: holders=3" in proc.stdout
    assert pct("exec", "129", "--", "kill", "-0", str(job["bystander"]), check=False).returncode == 0

    again = run_playbook("cleanup.yml", "-e", "gpu_cleanup_grace=2")
    counts = recap(again.stdout)
    assert counts["ct129"]["changed"] == 0 and counts["ct130"]["changed"] == 0
    assert "ct129: holders=0 signalled=0 killed=0 survivors=0 freed=0 MiB" in again.stdout


def test_a_stopped_container_is_reported_and_the_other_cleaned(clean_lab):
    start_job(129, "0-1")
    pct("stop", "130")
    proc = run_playbook("cleanup.yml", "-e", "gpu_cleanup_grace=1", check=False)
    assert proc.returncode != 0
    counts = recap(proc.stdout)
    assert counts["ct130"]["unreachable"] == 1 and counts["ct129"]["failed"] == 0
    assert "ct130: NOT CLEANED (unreachable, see above)" in proc.stdout
    assert f"CT 130 on node pve-lab (hypervisor 127.0.0.1:{LAB_PORT}) is not running" in proc.stdout
    assert max(memory(129)) < 100


def test_limit_narrows_the_fleet(clean_lab):
    start_job(129, "0")
    start_job(130, "0")
    run_playbook("cleanup.yml", "-l", "servers", "-e", "gpu_cleanup_grace=1")
    assert memory(130)[0] < 100
    assert memory(129)[0] >= 30000


def test_an_exporter_in_the_container_is_spared_as_an_observer(clean_lab):
    job = start_job(129, "0-1", "--observer")
    proc = run_playbook("cleanup.yml", "-l", "trainers", "-e", "gpu_cleanup_grace=1")
    assert max(memory(129)) < 100
    assert pct("exec", "129", "--", "kill", "-0", str(job["observer"]), check=False).returncode == 0
    assert "spared: observers=1" in proc.stdout
    pct("exec", "129", "--", "kill", str(job["observer"]))
