"""status_rows: one row per host that answered, through a real playbook run's set_stats."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ansible_collections.eagle3.ops.plugins.filter.status import status_nodes, status_rows

from tests.modules import ROOT


def test_rows_of_the_hosts_that_answered():
    hostvars = {"a": {"__eagle3_status": {"gpus": [{"index": 0}], "training": None, "serving": {"draft_tokens": 5},
                                          "changed": False}},
                "b": {}, "c": {"__eagle3_status": {"skipped": True}}}  # fmt: skip
    assert status_rows(["a", "b", "c"], hostvars) == [
        {"host": "a", "gpus": [{"index": 0}], "training": None, "serving": {"draft_tokens": 5},
         "router": None}]  # fmt: skip


def test_nodes_of_every_host_that_names_one():
    hostvars = {"a": {"pct_node": "pve-lab"}, "b": {"pct_node": "pve-lab2", "__eagle3_status": None}, "c": {}}
    assert status_nodes(["a", "b", "c"], hostvars) == {"a": "pve-lab", "b": "pve-lab2"}


def test_one_set_stats_carries_every_host(tmp_path: Path):
    # The role's own pattern - register per host, one run_once set_stats - through ansible-playbook and its stats.
    play = tmp_path / "play.yml"
    rows = "{{ ansible_play_hosts | eagle3.ops.status_rows(hostvars) }}"
    nodes = "{{ ansible_play_hosts_all | eagle3.ops.status_nodes(hostvars) }}"
    play.write_text(json.dumps([{"hosts": "all", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"pct_node": "node-{{ inventory_hostname }}"}},
        {"ansible.builtin.fail": {"msg": "h2 cannot be read"}, "when": "inventory_hostname == 'h2'"},
        {"ansible.builtin.set_fact": {"__eagle3_status": {"gpus": [], "training": None, "serving": None}}},
        {"ansible.builtin.set_stats": {"data": {"eagle3_status": rows, "eagle3_status_nodes": nodes},
                                       "per_host": False, "aggregate": True}, "run_once": True},
    ]}]))  # fmt: skip
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_SHOW_CUSTOM_STATS": "1",
           "ANSIBLE_STDOUT_CALLBACK": "json", "PATH": str(Path(sys.executable).parent)}  # fmt: skip
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", "h1,h2,h3", "-c", "local", str(play)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    stats = json.loads(proc.stdout)["global_custom_stats"]
    # The failed host has no row, but its node is still known (the table's row for it names the node).
    assert sorted(row["host"] for row in stats["eagle3_status"]) == ["h1", "h3"]
    assert stats["eagle3_status_nodes"] == {"h1": "node-h1", "h2": "node-h2", "h3": "node-h3"}
