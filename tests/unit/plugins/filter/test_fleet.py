"""An inventory that names one container twice is refused by every fleet playbook before anything reaches a host."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.eagle3.ops.plugins.filter.fleet import vmid_conflicts

from tests.modules import ROOT

SENTENCE = ("t1, s1 all name VMID 150 (on nodes pve1, pve2): a VMID is one container in a Proxmox cluster, so give "
            "each host its own container's pct_vmid (and the node that container is on).")  # fmt: skip


def test_one_sentence_per_vmid_named_twice():
    hostvars = {
        "t1": {"pct_vmid": 150, "pct_node": "pve1"},
        "t2": {"pct_vmid": 151, "pct_node": "pve1"},
        "s1": {"proxmox_vmid": "150", "proxmox_node": "pve2"},  # community.proxmox's names count too
        "lab-host": {"ansible_connection": "local"},  # not a container
        "a": {"ansible_pct_vmid": 160, "ansible_host": "10.0.0.1"},
        "b": {"pct_vmid": 160, "ansible_host": "10.0.0.1"},  # one container under two names, one node
    }
    assert vmid_conflicts(hostvars, hostvars) == [
        SENTENCE,
        "a, b all name VMID 160 (on node 10.0.0.1:22): a VMID is one container in a Proxmox cluster, so give each "
        "host its own container's pct_vmid (and the node that container is on).",
    ]
    assert vmid_conflicts(["t1", "t2", "lab-host"], hostvars) == []
    nowhere = {"c": {"pct_vmid": 170}, "d": {"pct_vmid": 170}}  # a lab inventory's containers: no node named
    assert vmid_conflicts(nowhere, nowhere) == [
        "c, d all name VMID 170: a VMID is one container in a Proxmox cluster, so give each host its own container's "
        "pct_vmid (and the node that container is on)."
    ]


INVENTORY = """
all:
  children:
    containers:
      vars: {ansible_connection: eagle3.ops.pct, ansible_host: 127.0.0.1, ansible_port: 1}
      children:
        trainers:
          hosts:
            t1: {pct_vmid: 150, pct_node: pve1}
            t2: {pct_vmid: 150, pct_node: pve2}
        servers:
          hosts:
            s1: {pct_vmid: 160, pct_node: pve2}
            s2: {pct_vmid: 160, pct_node: pve2}
            s3: {pct_vmid: 161, pct_node: pve2}
"""
TRAINERS = ("t1, t2 all name VMID 150 (on nodes pve1, pve2): a VMID is one container in a Proxmox cluster, so give "
            "each host its own container's pct_vmid (and the node that container is on).")  # fmt: skip
SERVERS = ("s1, s2 all name VMID 160 (on node pve2): a VMID is one container in a Proxmox cluster, so give each host "
           "its own container's pct_vmid (and the node that container is on).")  # fmt: skip


@pytest.mark.parametrize(("playbook", "limit", "said"), [
    ("status.yml", "all", [TRAINERS, SERVERS]),
    ("cleanup.yml", "all", [TRAINERS, SERVERS]),
    ("train.yml", "all", [TRAINERS]),
    ("deploy.yml", "all", [SERVERS]),
    ("bench.yml", "all", [SERVERS]),
    ("deploy.yml", "s1,s3", None),  # --limit leaves distinct containers: the run goes on (and finds them unreachable)
])  # fmt: skip
def test_every_fleet_playbook_refuses_it_before_reaching_a_host(tmp_path: Path, playbook: str, limit: str, said):
    # The hosts' hop (port 1) answers nothing: a task that tried to reach one reports it unreachable.
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(INVENTORY)
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)}  # fmt: skip
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), playbook, "-l", limit]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = " ".join(proc.stdout.split())
    if said is None:
        assert proc.returncode == 4 and "UNREACHABLE" in out, out[-3000:]
        return
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " ".join(said) in out, out[-3000:]
    assert "unreachable=1" not in out and "UNREACHABLE" not in out


def test_provisioning_refuses_one_vmid_declared_on_two_nodes(tmp_path: Path):
    # proxmox_ct's own preflight (the role is also used without provision.yml), before any call to the API.
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("""
all:
  vars: {proxmox_api_host: 127.0.0.1, proxmox_api_port: 1, proxmox_api_user: root@pam, proxmox_api_token_id: x,
         proxmox_api_token_secret: y, proxmox_ct_template: "local:vztmpl/x.tar"}
  children:
    hypervisors:
      hosts:
        pve1: {ansible_host: 127.0.0.1, ansible_port: 1, proxmox_node: pve1}
        pve2: {ansible_host: 127.0.0.1, ansible_port: 1, proxmox_node: pve2}
    containers:
      hosts:
        a: {pct_vmid: 180, pct_node: pve1, proxmox_ct_gpus: [0]}
        b: {pct_vmid: 180, pct_node: pve2, proxmox_ct_gpus: [0]}
""")
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
           "ANSIBLE_LOCAL_TEMP": str(tmp_path / "tmp"), "HOME": str(tmp_path)}  # fmt: skip
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inventory), "provision.yml"]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    out = " ".join(proc.stdout.split())
    assert proc.returncode == 2, out[-3000:]
    assert "a, b all name VMID 180 (on nodes pve1, pve2): a VMID is one container in a Proxmox cluster" in out
    assert "Converge the container" not in out


def test_a_roles_arguments_are_checked_for_every_host_in_one_pass():
    from ansible_collections.eagle3.ops.plugins.filter.fleet import role_arg_problems

    # what the task sees (the role's defaults) for every host, and each host's own inventory values over it
    current = {"gpu_cleanup_grace": 10, "gpu_cleanup_timeout": 30, "gpu_cleanup_gpus": [], "not_an_option": "x"}
    hostvars = {"a": {"gpu_cleanup_grace": "soon"}, "b": {"gpu_cleanup_grace": "later", "pct_vmid": 1},
                "c": {"gpu_cleanup_timeout": 5}, "d": {}}  # fmt: skip
    problems = role_arg_problems(["a", "b", "c", "d"], hostvars, "gpu_cleanup", current)
    assert len(problems) == 1
    assert problems[0].startswith("a, b: gpu_cleanup: argument 'gpu_cleanup_grace' is of type str")
    assert "<class 'str'>" in problems[0] and problems[0].endswith("fix it in the inventory or the extra variables.")
    assert role_arg_problems(["c", "d"], hostvars, "gpu_cleanup", current) == []
    # a value the task itself sees wrong (a default, an extra variable) is every host's problem
    wrong = role_arg_problems(["c", "d"], hostvars, "gpu_cleanup", {**current, "gpu_cleanup_force": "maybe"})
    assert wrong[0].startswith("c, d: gpu_cleanup: argument 'gpu_cleanup_force' is of type str")
    with pytest.raises(Exception, match="no argument spec 'main' for the role no_such_role"):
        role_arg_problems(["d"], hostvars, "no_such_role", current)


def test_a_fleet_check_reads_each_host_once_and_validates_each_set_of_values_once(monkeypatch):
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
    from ansible_collections.eagle3.ops.plugins.filter.fleet import fleet_problems

    class Counted(dict):
        """hostvars as ansible-core gives them: each read of a host is its variables computed anew."""

        def __init__(self, hosts: dict) -> None:
            super().__init__(hosts)
            self.reads: list[str] = []

        def __getitem__(self, host: str):
            self.reads.append(host)
            return super().__getitem__(host)

    hosts = {f"h{i}": {"pct_vmid": 100 + i, "pct_node": "pve1"} for i in range(8)}
    hosts["h6"]["pct_vmid"] = 101  # one container under two names
    hosts["h7"]["gpu_cleanup_grace"] = "soon"  # one host's own wrong value
    hostvars = Counted(hosts)
    validations: list[dict] = []
    validate = ArgumentSpecValidator.validate
    monkeypatch.setattr(ArgumentSpecValidator, "validate", lambda self, values: validations.append(values) or
                        validate(self, values))  # fmt: skip
    current = {"gpu_cleanup_grace": 10, "gpu_cleanup_timeout": 30}
    problems = fleet_problems(list(hostvars), hostvars, "gpu_cleanup", current)
    assert sorted(hostvars.reads) == sorted(hosts)  # once each, for both checks
    assert problems[0].startswith("h1, h6 all name VMID 101 (on node pve1)")
    assert problems[1].startswith("h7: gpu_cleanup: argument 'gpu_cleanup_grace' is of type str")
    assert len(problems) == 2
    assert len(validations) == 2  # seven hosts with the role's values, one with its own
    # without a role: the inventory check alone (status.yml's)
    assert fleet_problems(["h0", "h1", "h6"], hostvars) == [problems[0]]
