"""lab_host's container GPU lines: the one-pass removal of the lines beyond a container's GPU count."""

from __future__ import annotations

import re

import jinja2
import pytest
import yaml

from tests.modules import ROOT

TASKS = yaml.safe_load((ROOT / "roles/lab_host/tasks/container.yml").read_text())
REMOVE = next(t for t in TASKS if t["name"].startswith("Remove GPU lines beyond"))["ansible.builtin.lineinfile"]


def _line(node: str) -> str:
    return f"lxc.mount.entry: /var/lib/eagle3-lab/gpu/129/{node} dev/{node} none bind,optional,create=file"


@pytest.mark.parametrize("gpus", [0, 1, 4, 10])
def test_the_lines_beyond_the_count_go_and_the_others_stay(gpus: int):
    assert REMOVE["state"] == "absent"
    regexp = jinja2.Environment(autoescape=True).from_string(REMOVE["regexp"]).render(lab_host_ct_gpus=gpus)
    nodes = [f"nvidia{i}" for i in (0, 1, 3, 4, 9, 10, 11, 15, 23)] + ["nvidiactl", "nvidia-uvm"]
    gone = [n for n in nodes if re.search(regexp, _line(n))]  # lineinfile's own match (re.search per line)
    assert gone == [f"nvidia{i}" for i in (0, 1, 3, 4, 9, 10, 11, 15, 23) if i >= gpus]
    assert not re.search(regexp, "lxc.mount.entry: /srv/share srv/eagle3 none bind")
