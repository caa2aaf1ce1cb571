"""The eagle3_train role as a systemd job in a lab container, driven by a stand-in trainer."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import pct, recap, run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab"), pytest.mark.pipeline]
PLAYBOOK = Path(__file__).parent / "playbooks" / "train.yml"


def attempts(name: str) -> list[dict]:
    return json.loads(pct("exec", "129", "--", "cat", f"/srv/eagle3-test/{name}/state/attempts.json").stdout)


@pytest.fixture
def fresh(lab):
    names = []

    def make(name: str) -> str:
        pct("exec", "129", "--", "rm", "-rf", f"/srv/eagle3-test/{name}")
        names.append(name)
        return name

    yield make
    for name in names:  # the job's unit starts at boot: disabled, or a dangling link would stay behind
        pct("exec", "129", "--", "systemctl", "disable", "--now", f"eagle3-train-{name}", check=False)
        unit_file = f"/etc/systemd/system/eagle3-train-{name}.service"
        pct("exec", "129", "--", "rm", "-rf", f"/srv/eagle3-test/{name}", unit_file, check=False)


def test_out_of_memory_backs_off_and_the_result_is_reported(fresh):
    name = fresh("oom")
    proc = run_playbook(
        PLAYBOOK, "-e", f"train_test_name={name}", "-e", '{"train_test_env": {"FAKE_OOM_ABOVE": "16384"}}'
    )
    assert recap(proc.stdout)["ct129"]["failed"] == 0
    assert [(a["total_seq_len"], a["cause"]) for a in attempts(name)] == [
        (32768, "out_of_memory"),
        (24576, "out_of_memory"),
        (16384, "completed"),
    ]
    assert "- '32768: out_of_memory'" in proc.stdout and "tau: 2.176" in proc.stdout
    again = run_playbook(
        PLAYBOOK, "-e", f"train_test_name={name}", "-e", '{"train_test_env": {"FAKE_OOM_ABOVE": "16384"}}'
    )
    assert recap(again.stdout)["ct129"]["changed"] == 0  # finished: nothing restarts


def test_a_killed_job_restarts_and_resumes_from_the_last_complete_epoch(fresh):
    name = fresh("resume")
    env = '{"train_test_env": {"FAKE_EPOCH_SECONDS": "2"}, "train_test_epochs": 4}'
    start = run_playbook(PLAYBOOK, "-e", f"train_test_name={name}", "-e", env, "-e", "eagle3_train_wait=false")
    assert recap(start.stdout)["ct129"]["failed"] == 0
    # Started at boot too: a reboot resumes the job as a crash does.
    assert pct("exec", "129", "--", "systemctl", "is-enabled", f"eagle3-train-{name}").stdout.strip() == "enabled"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if pct("exec", "129", "--", "test", "-d", f"/srv/eagle3-test/{name}/save/3", check=False).returncode == 0:
            break
        time.sleep(0.2)
    time.sleep(0.5)  # epoch 3 is being written
    # The container's view of a crash: every process of the job killed at once.
    pct("exec", "129", "--", "systemctl", "kill", "-s", "KILL", f"eagle3-train-{name}")
    # systemd restarts the job by itself (Restart=on-failure, 5 s later)
    deadline = time.monotonic() + 30
    restarts = ""
    while time.monotonic() < deadline and restarts != "NRestarts=1":
        time.sleep(0.5)
        restarts = pct("exec", "129", "--", "systemctl", "show", "--property=NRestarts", f"eagle3-train-{name}").stdout
        restarts = restarts.strip()
    assert restarts == "NRestarts=1"
    proc = run_playbook(PLAYBOOK, "-e", f"train_test_name={name}", "-e", env)
    assert recap(proc.stdout)["ct129"]["failed"] == 0
    tried = attempts(name)
    assert len(tried) == 2 and tried[1]["resume_from_epoch"] == 2 and tried[1]["cause"] == "completed"
    assert tried[0]["cause"] == "interrupted"  # the kill took its launcher too; the next one records it
    listing = pct("exec", "129", "--", "ls", "-a", f"/srv/eagle3-test/{name}/save").stdout.split()
    assert {"1", "2", "3", "4"} <= set(listing) and any(n.startswith(".partial-3") for n in listing)


def test_a_running_job_whose_unit_changed_is_restarted_with_it_and_resumes(fresh):
    """A play that changes the job (here its environment; on a fleet, the trainers it spans) while the job runs
    restarts it with the new unit - it would otherwise go on with the command it was started with - and the job
    resumes from its newest complete epoch. Check mode says so and touches nothing."""
    name = fresh("changed")
    unit = f"eagle3-train-{name}"

    def main_pid() -> str:
        return pct("exec", "129", "--", "systemctl", "show", "-p", "MainPID", "--value", unit).stdout.strip()

    before = '{"train_test_env": {"FAKE_EPOCH_SECONDS": "4"}, "train_test_epochs": 20}'
    start = run_playbook(PLAYBOOK, "-e", f"train_test_name={name}", "-e", before, "-e", "eagle3_train_wait=false")
    assert recap(start.stdout)["ct129"]["failed"] == 0
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if pct("exec", "129", "--", "test", "-d", f"/srv/eagle3-test/{name}/save/2", check=False).returncode == 0:
            break
        time.sleep(0.2)
    pid = main_pid()
    after = '{"train_test_env": {"FAKE_EPOCH_SECONDS": "0.2"}, "train_test_epochs": 20}'
    check = run_playbook(PLAYBOOK, "--check", "-e", f"train_test_name={name}", "-e", after)
    assert re.search(r"TASK \[eagle3.ops.eagle3_train : Restart the running job with its changed unit.*\n"
                     r"changed: \[ct129\]", check.stdout), check.stdout[-3000:]  # fmt: skip
    assert main_pid() == pid and len(attempts(name)) == 1  # check mode restarted nothing
    proc = run_playbook(PLAYBOOK, "-e", f"train_test_name={name}", "-e", after)
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-3000:]
    # the unit systemd runs now is the new one (not only the file on disk)
    assert "FAKE_EPOCH_SECONDS=0.2" in pct("exec", "129", "--", "systemctl", "show", "-p", "Environment", unit).stdout
    tried = attempts(name)
    assert [a["cause"] for a in tried] == ["signal SIGTERM", "completed"], tried
    assert tried[1]["resume_from_epoch"] >= 2
