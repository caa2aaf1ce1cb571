"""status_rows: one row per host that answered, through a real playbook run's set_stats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.eagle3.ops.plugins.filter.status import status_rows

from tests.modules import ROOT


def test_rows_of_the_hosts_that_answered():
    hostvars = {"a": {"__eagle3_status": {"gpus": [{"index": 0}], "training": None, "serving": {"draft_tokens": 5},
                                          "changed": False}},
                "b": {}, "c": {"__eagle3_status": {"skipped": True}}}  # fmt: skip
    assert status_rows(["a", "b", "c"], hostvars) == [
        {"host": "a", "gpus": [{"index": 0}], "training": None, "serving": {"draft_tokens": 5},
         "router": None}]  # fmt: skip


def test_one_set_stats_carries_every_host(tmp_path: Path):
    # The role's own pattern - register per host, one run_once set_stats - through ansible-playbook and its stats.
    play = tmp_path / "play.yml"
    rows = "{{ ansible_play_hosts | eagle3.ops.status_rows(hostvars) }}"
    play.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"__eagle3_status": {"gpus": [], "training": None, "serving": None}}},
        {"ansible.builtin.set_stats": {"data": {"eagle3_status": rows}, "per_host": False, "aggregate": True},
         "run_once": True},
    ]}]))  # fmt: skip
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_SHOW_CUSTOM_STATS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "json", "PATH": str(Path(sys.executable).parent)}  # fmt: skip
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "h1,h2,h3", "-c", "local", str(play)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = json.loads(proc.stdout)["global_custom_stats"]
    assert sorted(row["host"] for row in stats["eagle3_status"]) == ["h1", "h2", "h3"]
