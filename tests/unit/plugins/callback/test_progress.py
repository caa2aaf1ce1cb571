"""The progress stdout callback: a long wait shows one progress line per host (changed lines only), not a
"FAILED - RETRYING" line per poll; -vv restores the default."""

from __future__ import annotations

import json

import pytest

from tests.modules import init_collection_loader


@pytest.fixture
def callback(monkeypatch):
    init_collection_loader()
    from ansible.plugins.loader import callback_loader

    cb = callback_loader.get("eagle3.ops.progress")
    assert cb is not None, "eagle3.ops.progress is not found by its name"
    cb.set_options()
    cb._tty = False
    shown: list[str] = []
    monkeypatch.setattr(cb._display, "display", lambda msg, *a, **k: shown.append(msg))
    monkeypatch.setattr(cb._display, "verbosity", 0)
    cb.shown = shown
    return cb


def _retry(host: str, stdout: str, task: str = "Wait for the job, monitoring it"):
    """What the strategy hands a callback for one failed poll of an until loop (ansible-core's own classes)."""
    from ansible.executor.task_result import CallbackTaskResult
    from ansible.inventory.host import Host
    from ansible.playbook.task import Task

    return CallbackTaskResult(Host(host), Task(), {"stdout": stdout, "attempts": 1, "retries": 10}, {"name": task})


def test_a_wait_is_one_line_per_host_and_change(callback):
    sample = {"attempt": 1, "total_seq_len": 1024, "epoch": 2, "epochs": 5, "step": 7, "tokens_per_s": 900.0}
    for _ in range(3):  # three polls with the same sample: one line
        callback.v2_runner_retry(_retry("ct129", "ActiveState=active\n" + json.dumps(sample)))
    callback.v2_runner_retry(_retry("ct129", "ActiveState=active\n" + json.dumps({**sample, "epoch": 3})))
    regen = "ActiveState=active\n[regen] 40/160 (8.4/s)"
    callback.v2_runner_retry(_retry("ct130", regen, task="Wait for eagle3-data-regen"))
    assert len(callback.shown) == 3
    assert "[ct129] Wait for the job, monitoring it:" in callback.shown[0]
    assert "epoch 2/5 step 7 900 tok/s" in callback.shown[0]
    assert "epoch 3/5" in callback.shown[1]
    assert callback.shown[2].endswith("[regen] 40/160 (8.4/s)") and "FAILED" not in "".join(callback.shown)


def test_a_wait_without_progress_says_waiting(callback):
    callback.v2_runner_retry(_retry("ct129", "ActiveState=activating"))
    assert callback.shown == ["  [ct129] Wait for the job, monitoring it: waiting"]


def test_verbose_runs_keep_the_default_retry_lines(callback, monkeypatch):
    monkeypatch.setattr(callback._display, "verbosity", 2)
    callback.v2_runner_retry(_retry("ct129", "ActiveState=active"))
    assert callback.shown and "FAILED - RETRYING" in callback.shown[0]


def test_the_recap_is_followed_by_the_time_per_role_and_the_slowest_tasks(callback, monkeypatch):
    from ansible.executor.stats import AggregateStats

    clock = iter([1.0, 4.0, 4.5, 10.0, 11.0, 12.0, 12.0, 12.0])
    monkeypatch.setattr("time.monotonic", lambda: next(clock))
    callback._run_started = 0.0

    class Role:
        def __init__(self, name: str) -> None:
            self.name = name

        def get_name(self, include_role_fqcn: bool = True) -> str:
            return self.name

    def task(role: str | None, name: str):
        from ansible.playbook.task import Task

        t = Task()
        t._role = Role(role) if role else None
        t.name = name
        return t

    monkeypatch.setattr(type(callback).__mro__[1], "v2_playbook_on_task_start", lambda self, t, c: None)
    monkeypatch.setattr(type(callback).__mro__[1], "v2_playbook_on_stats", lambda self, s: None)
    callback.v2_playbook_on_task_start(task("eagle3.ops.gpu_facts", "Read"), False)  # 1.0
    callback.v2_playbook_on_task_start(task("eagle3.ops.eagle3_train", "Start"), False)  # 4.0: gpu_facts 3 s
    callback.v2_playbook_on_task_start(task(None, "Say"), False)  # 4.5: eagle3_train 0.5 s
    callback.v2_playbook_on_task_start(task("eagle3.ops.gpu_facts", "Read"), False)  # 10.0: play 5.5 s
    callback.v2_playbook_on_task_start(task(None, "End"), False)  # 11.0: the same gpu_facts task again, 1 s
    callback.v2_playbook_on_stats(AggregateStats())  # 12.0: play 1 s more
    lines = [line for line in callback.shown if line.startswith(("  ", "TIME", "SLOWEST"))]
    assert lines[0] == "TIME PER ROLE (wall, 12.0 s in all)"
    assert [line.split()[0] for line in lines[1:4]] == ["play", "eagle3.ops.gpu_facts", "eagle3.ops.eagle3_train"]
    assert "6.5 s" in lines[1] and "4.0 s" in lines[2] and "0.5 s" in lines[3]
    assert lines[4] == "SLOWEST TASKS"
    assert [line.split(None, 2)[::2] for line in lines[5:]] == [
        ["5.5", "Say"], ["4.0", "eagle3.ops.gpu_facts : Read"], ["1.0", "End"],
        ["0.5", "eagle3.ops.eagle3_train : Start"]]  # fmt: skip


def test_a_shared_role_s_task_counts_for_the_role_that_called_it(callback):
    from ansible.playbook.block import Block
    from ansible.playbook.task import Task

    class Role:
        def __init__(self, name: str) -> None:
            self.name = name

        def get_name(self, include_role_fqcn: bool = True) -> str:
            return self.name

    include = Task()
    include._role = Role("eagle3.ops.eagle3_train")  # eagle3_train's task that includes eagle3_common's unit_wait
    block = Block(parent_block=include)
    block._role = Role("eagle3.ops.eagle3_common")
    wait = Task(block=block)
    wait._role = Role("eagle3.ops.eagle3_common")
    assert callback._role_of(wait) == "eagle3.ops.eagle3_train"
    wait.name = "Wait for the job"
    callback._start(wait)  # and its time, among the slowest tasks, is named under the role that called it
    assert callback._current[1] == "eagle3.ops.eagle3_train > eagle3.ops.eagle3_common : Wait for the job"
    alone = Task()
    alone._role = Role("eagle3.ops.gpu_facts")
    assert callback._role_of(alone) == "eagle3.ops.gpu_facts"
    assert callback._role_of(Task()) == "play"


@pytest.fixture
def cli_args(monkeypatch):
    """The command line's arguments that the default recap reads (ansible-playbook sets them)."""
    from ansible import context
    from ansible.module_utils.common.collections import ImmutableDict

    monkeypatch.setattr(context, "CLIARGS", ImmutableDict(check=False))


def test_a_status_run_ends_with_the_fleet_table_naming_the_hosts_it_could_not_read(callback, cli_args):
    from ansible.executor.stats import AggregateStats

    stats = AggregateStats()
    for host in ("ct129", "ct130", "ct131", "ct132"):
        stats.increment("ok", host)
    stats.increment("dark", "ct131")
    stats.increment("failures", "ct132")
    gpu = {"memory_used": 3000, "memory_total": 97887, "power_draw": 100.0, "power_limit": 600.0, "utilization_gpu": 50}
    stats.update_custom_stats("eagle3_status", [
        {"host": "ct129", "gpus": [gpu] * 4, "training": None, "serving": None, "router": None},
        {"host": "ct130", "gpus": [gpu], "training": None,
         "serving": {"draft": "/srv/eagle3/drafts/d", "draft_tokens": 16, "accept_length": 3.1}, "router": None},
    ])  # fmt: skip
    stats.update_custom_stats("eagle3_status_nodes", {"ct129": "pve-lab", "ct130": "pve-lab", "ct131": "pve-lab2",
                                                      "ct132": "pve-lab2"})  # fmt: skip
    callback.v2_playbook_on_stats(stats)
    shown = "\n".join(callback.shown).splitlines()
    assert any(line.startswith("ct131") and "unreachable=1" in line for line in shown)  # the recap, then the table
    table = shown[shown.index("FLEET STATUS") + 1:]
    assert table[0].split()[:4] == ["HOST", "NODE", "STATE", "GPUS"]
    assert table[1].split()[:4] == ["ct129", "pve-lab", "running", "4"] and "11.7/382.4 GiB" in table[1]
    assert table[2].split()[:3] == ["ct130", "pve-lab", "running"] and table[2].rstrip().endswith("d x16 accept 3.10")
    assert table[3].split() == ["ct131", "pve-lab2", "unreachable", "-", "-", "-", "-", "-", "-"]
    assert table[4].split() == ["ct132", "pve-lab2", "failed", "-", "-", "-", "-", "-", "-"]


def test_a_run_that_read_no_status_prints_no_table(callback, cli_args):
    from ansible.executor.stats import AggregateStats

    stats = AggregateStats()
    stats.increment("ok", "ct129")
    stats.update_custom_stats("eagle3_outcomes", ["trained"])
    callback.v2_playbook_on_stats(stats)
    assert "FLEET STATUS" not in callback.shown
