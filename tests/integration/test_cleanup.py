"""cleanup.yml across the lab containers, with the workload helper's torchrun-like jobs."""

from __future__ import annotations

import time

import pytest

from tests.conftest import LAB_PORT, flat, lab_workload, pct, recap, run_playbook, smi, stop_marked

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]


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



def test_a_host_whose_cleanup_is_refused_is_named_and_the_others_are_cleaned(clean_lab):
    # The checkpoint guard refuses on ct129 (its required file is missing) and passes on ct130: the run goes on for
    # ct130, the summary names both, and only ct129 fails (the converged hosts' path ends without a task each).
    start_job(129, "0")
    start_job(130, "0")
    pct("exec", "130", "--", "sh", "-c", "mkdir -p /root/guard && echo '{}' > /root/guard/done.json")
    try:
        proc = run_playbook("cleanup.yml", "-e", '{"gpu_cleanup_require_paths": ["/root/guard/done.json"]}', "-e",
                            "gpu_cleanup_grace=2", check=False)  # fmt: skip
    finally:
        pct("exec", "130", "--", "rm", "-rf", "/root/guard")
    counts = recap(proc.stdout)
    assert counts["ct129"]["failed"] == 1 and counts["ct130"]["failed"] == 0, proc.stdout[-3000:]
    assert "ct129: FAILED Refusing to stop" in proc.stdout and "ct130: holders=" in proc.stdout
    assert memory(129)[0] >= 30000 and memory(130)[0] < 100

def test_a_stopped_container_is_reported_and_the_other_cleaned(clean_lab):
    start_job(129, "0-1")
    pct("stop", "130")
    proc = run_playbook("cleanup.yml", "-e", "gpu_cleanup_grace=1", check=False)
    assert proc.returncode != 0
    counts = recap(proc.stdout)
    assert counts["ct130"]["unreachable"] == 1 and counts["ct129"]["failed"] == 0
    assert "ct130: NOT CLEANED (unreachable on node pve-lab, see above why)" in proc.stdout
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



def _unit_state(vmid: int, unit: str) -> str:
    return pct("exec", str(vmid), "--", "systemctl", "is-active", unit, check=False).stdout.strip()


def test_a_job_under_a_unit_that_restarts_it_is_stopped_with_its_unit(clean_lab):
    unit = f"eagle3-trial-{MARKER[0][:8]}.service"
    pct("exec", "129", "--", "systemd-run", f"--unit={unit}", "-p", "Restart=always", "-p", "RestartSec=300ms",
        f"--setenv=EAGLE3_TEST_JOB={MARKER[0]}", "lab-workload", "--foreground", "--gpus", "0", "--mib", "30000",
        "--dataloader-workers", "1")  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while memory(129)[0] < 30000:
            assert time.monotonic() < deadline, "the unit's job never took its GPU"
            time.sleep(0.2)
        # Check mode names the unit and every process it would stop, and stops nothing.
        check = run_playbook("cleanup.yml", "--check", "-l", "trainers", "-e", "gpu_cleanup_grace=1")
        assert f"stop {unit} (Restart=always): its main process is the job" in flat(check.stdout)
        assert "[holder] GPU 0 30000 MiB" in check.stdout and "[root] no GPU" in check.stdout
        assert memory(129)[0] >= 30000 and _unit_state(129, unit) == "active"
        # Without stopping units, killing the job only makes systemd start it again: the run fails naming the unit.
        kept = run_playbook("cleanup.yml", "-l", "trainers", "-e", "gpu_cleanup_grace=1", "-e", "gpu_cleanup_timeout=4",
                            "-e", "gpu_cleanup_stop_unit=''", check=False)  # fmt: skip
        assert kept.returncode != 0
        assert f"for the unit {unit} (Restart=always): a restart" in flat(kept.stdout)
        assert "stop_unit: auto" in flat(kept.stdout)
        assert "ct129: FAILED" in kept.stdout
        # The default (auto) stops the unit first, then whatever is left, and verifies.
        proc = run_playbook("cleanup.yml", "-l", "trainers", "-e", "gpu_cleanup_grace=1")
        assert f"units={unit}" in flat(proc.stdout)
        time.sleep(1.5)  # longer than RestartSec: nothing comes back
        assert max(memory(129)) < 100
        assert _unit_state(129, unit) in ("inactive", "failed", "unknown")
    finally:
        pct("exec", "129", "--", "systemctl", "stop", unit, check=False)
        pct("exec", "129", "--", "systemctl", "reset-failed", unit, check=False)


def test_a_restart_loop_that_is_a_tmux_panes_command_is_the_job(clean_lab):
    loop = (f"while true; do env EAGLE3_TEST_JOB={MARKER[0]} lab-workload --foreground --gpus 1 --mib 20000 "
            "--dataloader-workers 0; done")
    session = f"trial{MARKER[0][:8]}"
    pct("exec", "129", "--", "tmux", "new-session", "-d", "-s", session, "bash", "-c", loop)
    try:
        deadline = time.monotonic() + 30
        while memory(129)[1] < 20000:
            assert time.monotonic() < deadline, "the pane's job never took its GPU"
            time.sleep(0.2)
        proc = run_playbook("cleanup.yml", "-l", "trainers", "-e", "gpu_cleanup_grace=1")
        assert "ct129: holders=1" in proc.stdout
        time.sleep(1.0)
        assert max(memory(129)) < 100
    finally:
        pct("exec", "129", "--", "tmux", "kill-session", "-t", session, check=False)
