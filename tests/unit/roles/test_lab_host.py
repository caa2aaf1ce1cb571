"""Container GPU lines: the one-pass removal of the lines a container no longer has (lab_host and proxmox_ct)."""

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


CT_TASK = next(
    t
    for t in yaml.safe_load((ROOT / "roles/proxmox_ct/tasks/raw_gpu.yml").read_text())
    if t["name"] == "Remove GPU lines for GPUs no longer declared"
)


@pytest.mark.parametrize(
    ("gpus", "method"), [([], "raw"), ([0], "raw"), ([1, 3], "raw"), ([0, 2, 10], "raw"), ([0, 1], "dev")]
)
def test_proxmox_ct_removes_every_undeclared_gpus_line_in_one_pass(gpus: list[int], method: str):
    # The same one-pass removal in the product's role: any number (not only 0-15), and every numbered line once the
    # GPUs are passed in as devN entries instead.
    task = CT_TASK["ansible.builtin.lineinfile"]
    assert task["state"] == "absent" and "loop" not in CT_TASK
    env = jinja2.Environment(autoescape=True)
    kept = env.compile_expression(CT_TASK["vars"]["_proxmox_ct_kept"].strip("{} "))(
        proxmox_ct_gpus=gpus, _proxmox_ct_gpu_method=method
    )
    regexp = env.from_string(task["regexp"]).render(_proxmox_ct_kept=kept)
    numbers = (0, 1, 2, 3, 9, 10, 11, 15, 16, 23)
    nodes = [f"nvidia{i}" for i in numbers] + ["nvidiactl", "nvidia-uvm"]
    gone = [n for n in nodes if re.search(regexp, _line(n))]
    assert gone == [f"nvidia{i}" for i in numbers if method != "raw" or i not in gpus]
