"""gpu_cleanup against real process trees holding emulated GPU device nodes (no lab needed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
from safetensors.numpy import save_file

from tests.modules import run_module
from tests.unit.conftest import NVEMU


def workload(gpus, *args: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, str(NVEMU), "workload", *args], capture_output=True, text=True, check=True, timeout=30
    )
    return json.loads(out.stdout)


def used() -> list[int]:
    out = subprocess.run(
        [sys.executable, str(NVEMU), "smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(x) for x in out.split()]


def cleanup(env, capsys, check=False, **args):
    full = {"nvidia_smi": env["smi"], "device_dir": env["dev"], "grace": 2, "timeout": 10, **args}
    return run_module("gpu_cleanup", full, check=check, capsys=capsys)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_torchrun_tree_is_cleaned_and_bystander_survives(gpus, capsys):
    pids = workload(gpus, "--mib", "20000", "--dataloader-workers", "2", "--bystander")
    assert used() == [20003] * 4
    res = cleanup(gpus, capsys)
    assert res["changed"] and not res.get("failed"), res.get("msg")
    assert used() == [3] * 4
    assert [r["pid"] for r in res["roots"]] == [pids["agent"]]
    assert len(res["holders"]) == 4 * 3  # workers and their DataLoader children
    assert res["freed_mib"] == 4 * 20000
    assert res["killed"] == []  # everything left on SIGTERM
    assert alive(pids["bystander"]) and not alive(pids["agent"])
    os.kill(pids["bystander"], signal.SIGKILL)


def test_a_worker_ignoring_sigterm_is_killed_after_grace(gpus, capsys):
    workload(gpus, "--gpus", "0-1", "--mib", "1000", "--dataloader-workers", "1", "--ignore-term-ranks", "1")
    start = time.monotonic()
    res = cleanup(gpus, capsys, grace=1.5)
    assert not res.get("failed"), res.get("msg")
    assert res["killed"], res
    assert time.monotonic() - start >= 1.5
    killed_cmds = {h["pid"]: h["cmdline"] for h in res["holders"]}
    assert all("--ignore-term" in killed_cmds[p] for p in res["killed"] if p in killed_cmds)
    assert used()[:2] == [3, 3]


def test_allow_listed_daemon_and_non_selected_gpus_survive(gpus, capsys):
    daemon = subprocess.Popen(
        [
            "bash",
            "-c",
            f"exec -a nvidia-persistenced {sys.executable} -c "
            f"\"import os,time; fd=os.open('{gpus['dev']}/nvidia0', os.O_RDWR); time.sleep(120)\"",
        ]
    )
    gpus["started"].append(daemon.pid)
    job_a = workload(gpus, "--gpus", "0-1", "--mib", "500", "--dataloader-workers", "0", "--tag", "job-a")
    job_b = workload(gpus, "--gpus", "2-3", "--mib", "500", "--dataloader-workers", "0", "--tag", "job-b")
    time.sleep(0.3)
    res = cleanup(gpus, capsys, gpus=["0", "1"])
    assert not res.get("failed"), res.get("msg")
    assert [r["pid"] for r in res["roots"]] == [job_a["agent"]]  # job A's agent goes first
    time.sleep(1.0)  # long enough for job B's agent to notice a dead worker, had one of its own been hit
    mem = used()
    assert mem[:2] == [3, 3] and mem[2:] == [503, 503]
    assert alive(daemon.pid) and alive(job_b["agent"])
    assert any(s["pid"] == daemon.pid for s in res["spared"])


def test_check_mode_changes_nothing_and_second_run_is_unchanged(gpus, capsys):
    workload(gpus, "--gpus", "0", "--mib", "700", "--dataloader-workers", "1")
    res = cleanup(gpus, capsys, check=True)
    assert res["changed"] and len(res["signalled"]) == 3  # agent, worker, its DataLoader child
    assert used()[0] == 703
    assert cleanup(gpus, capsys)["changed"]
    again = cleanup(gpus, capsys)
    assert again["changed"] is False and again["holders"] == []


def test_checkpoint_guard(gpus, capsys, tmp_path):
    workload(gpus, "--gpus", "0", "--mib", "700", "--dataloader-workers", "0")
    final = tmp_path / "4" / "model.safetensors"
    res = cleanup(gpus, capsys, require_paths=[str(final), str(tmp_path / "4" / "config.json")])
    assert res["failed"] and f"{final} does not exist" in res["msg"] and "force: true" in res["msg"]
    assert used()[0] == 703
    final.parent.mkdir()
    save_file({"w": np.ones(1000, np.float32)}, str(final))
    final.write_bytes(final.read_bytes()[:-100])  # a checkpoint still being written
    (tmp_path / "4" / "config.json").write_text('{"ok": tr')
    res = cleanup(gpus, capsys, require_paths=[str(final), str(tmp_path / "4" / "config.json")])
    assert res["failed"] and "past the data section" in res["msg"] and "is not complete JSON" in res["msg"]
    assert used()[0] == 703
    # Optional guards: a path whose directory exists still refuses; one in a directory never made guards nothing.
    res = cleanup(gpus, capsys, require_paths=[str(final)], require_paths_optional=True)
    assert res["failed"] and "past the data section" in res["msg"]
    res = cleanup(gpus, capsys, require_paths=[str(final)], force=True)
    assert res["changed"] and used()[0] == 3
    workload(gpus, "--gpus", "0", "--mib", "700", "--dataloader-workers", "0")
    res = cleanup(gpus, capsys, require_paths=[str(tmp_path / "9" / "model.safetensors")], require_paths_optional=True)
    assert not res.get("failed"), res.get("msg")
    assert res["changed"] and used()[0] == 3


def test_match_limits_the_selection(gpus, capsys):
    workload(gpus, "--gpus", "0", "--mib", "100", "--dataloader-workers", "0", "--tag", "job-a")
    workload(gpus, "--gpus", "1", "--mib", "200", "--dataloader-workers", "0", "--tag", "job-b")
    res = cleanup(gpus, capsys, match=["--tag job-b"])
    assert not res.get("failed"), res.get("msg")
    assert used()[:2] == [103, 3]


def test_bad_arguments(gpus, capsys):
    res = cleanup(gpus, capsys, gpus=["GPU-nope"])
    assert res["failed"] and "neither an index nor the UUID" in res["msg"]
    res = cleanup(gpus, capsys, include_non_gpu=True)
    assert res["failed"] and "include_non_gpu needs match patterns" in res["msg"]
    # The role has no check of its own for these: the module refuses them before it scans or signals anything,
    # in check mode (the role's dry run) as in a real pass.
    pid = workload(gpus, "--mib", "1000")["agent"]
    try:
        for bad, says in (({"grace": -1}, "grace must be 0 or more seconds"),
                          ({"timeout": -0.5}, "timeout must be 0 or more seconds"),
                          ({"free_threshold_mib": -1}, "free_threshold_mib must be 0 or more MiB")):  # fmt: skip
            for check in (True, False):
                res = cleanup(gpus, capsys, check=check, **bad)
                assert res["failed"] and says in res["msg"] and res["signalled"] == [], res
                assert alive(pid)
    finally:
        assert not cleanup(gpus, capsys).get("failed")  # the whole tree, as a real pass stops it


def test_an_agent_that_also_runs_spared_gpus_is_not_a_root():
    from ansible_collections.eagle3.ops.plugins.module_utils._gpu import Proc, select

    procs = {
        1: Proc(1, 0, 1, 1, "S", 1, "systemd", "/sbin/init"),
        10: Proc(10, 1, 10, 10, "S", 5, "python3", "torchrun train.py"),
        11: Proc(11, 10, 11, 11, "S", 6, "python3", "worker 0", gpus={0}),
        12: Proc(12, 10, 12, 12, "S", 7, "python3", "worker 2", gpus={2}),
        13: Proc(13, 1, 13, 13, "S", 8, "python3", "monitor.py"),
    }
    part = select(procs, {0}, [], [], False, me=999)
    assert [p.pid for p in part.holders] == [11] and part.roots == []
    assert [p.pid for p in part.spared] == [12]
    whole = select(procs, None, [], [], False, me=999)
    assert [p.pid for p in whole.holders] == [11, 12] and [p.pid for p in whole.roots] == [10]
    assert 13 not in {p.pid for p in whole.holders}  # holds no GPU: never selected


def test_systemd_spans_are_read_in_seconds_and_a_multi_node_unit_names_its_hosts(tmp_path):
    from ansible_collections.eagle3.ops.plugins.module_utils._gpu import systemd_seconds, unit_facts

    fake = tmp_path / "systemctl"
    fake.write_text("#!/bin/sh\nprintf 'MainPID=41\\nRestart=on-failure\\nActiveState=active\\n"
                    "Environment=PYTHONPATH=/opt/p EAGLE3_TRAIN_HOSTS=ct131,ct132 COLUMNS=200\\n"
                    "TimeoutStopUSec=2min\\n'\n")  # fmt: skip
    fake.chmod(0o755)
    facts = unit_facts("eagle3-train", systemctl=str(fake))
    assert facts is not None and facts["MainPID"] == 41 and facts["spans"] == ["ct131", "ct132"]
    assert facts["stop_timeout"] == 120

    assert systemd_seconds("2min") == 120 and systemd_seconds("1min 30s") == 90 and systemd_seconds("500ms") == 0.5
    assert systemd_seconds("1h 2min") == 3720 and systemd_seconds("45") == 45
    assert systemd_seconds("infinity") is None and systemd_seconds("") is None
    assert systemd_seconds("3 fortnights") is None


def test_a_unit_that_starts_at_boot_is_disabled_before_it_is_stopped(gpus, capsys, tmp_path, monkeypatch):
    # A systemctl of the test's own (first on PATH) that logs each call and says the unit runs and is enabled.
    calls = tmp_path / "calls"
    fake = tmp_path / "bin" / "systemctl"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\necho \"$*\" >> {calls}\n"
                    "case \"$1\" in show) printf 'MainPID=0\\nRestart=on-failure\\nActiveState=active\\n"
                    "UnitFileState=enabled\\nTimeoutStopUSec=2min\\n';; esac\nexit 0\n")  # fmt: skip
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    workload(gpus, "--gpus", "0", "--mib", "700", "--dataloader-workers", "0")
    dry = cleanup(gpus, capsys, check=True, stop_unit="eagle3-train")
    assert dry["units"][0]["boot"] is True and dry["units"][0]["action"] == "stop"
    assert not any(line.split()[0] in ("disable", "stop") for line in calls.read_text().splitlines())
    res = cleanup(gpus, capsys, stop_unit="eagle3-train")
    assert res["changed"] and not res.get("failed"), res.get("msg")
    done = [line for line in calls.read_text().splitlines() if line.split()[0] in ("disable", "stop")]
    assert done == ["disable --quiet eagle3-train", "stop eagle3-train"]
    assert res["units"][0] | {"action": "stopped", "disabled": True} == res["units"][0]
    from ansible_collections.eagle3.ops.plugins.filter.gpu import gpu_unit_line

    assert gpu_unit_line(res["units"][0]) == ("stopped eagle3-train: named by stop_unit, and disabled: it started at "
                                              "boot")  # fmt: skip
    assert gpu_unit_line(dry["units"][0]).endswith(", and disable it: it starts at boot")
