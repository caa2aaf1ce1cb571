"""The roles' refusals of bad arguments, run by Ansible on the controller (no lab): each says its own sentence, and a
message carries no escape Jinja left in it (a backslash before an apostrophe in a folded scalar stays a backslash,
and a regular expression written with a doubled backslash matches nothing - both reached a release once)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, ansible_env, run_playbook

PLAY = """- name: One role's task file on the controller
  hosts: {hosts}
  connection: local
  gather_facts: false
  tasks:
    - name: The role's tasks
      ansible.builtin.import_role:
        name: eagle3.ops.{role}
        tasks_from: {tasks}
"""
INVENTORY = {"all": {"children": {"routers": {"hosts": {"rtr": {"ansible_host": "10.203.0.9"}}},
                                  "servers": {"hosts": {"srv": {}}}}}}  # fmt: skip
SMI = '#!/bin/sh\necho "0, GPU-1, NVIDIA H200, 900, 143771, 75.0, 700.0, 0"\n'


def run_tasks(tmp_path: Path, role: str, tasks: str, extra: dict, hosts: str = "srv"):
    """One task file of a role, run by Ansible on the controller with EXTRA over the lab's inventory shape."""
    (tmp_path / "play.yml").write_text(PLAY.format(hosts=hosts, role=role, tasks=tasks))
    (tmp_path / "hosts.json").write_text(json.dumps(INVENTORY))
    smi = tmp_path / "nvidia-smi"
    smi.write_text(SMI)
    smi.chmod(0o755)
    values = {"ansible_python_interpreter": sys.executable, "gpu_facts_nvidia_smi": str(smi),
              "eagle3_target_path": "/srv/target", **extra}  # fmt: skip
    return run_playbook(tmp_path / "play.yml", "-i", str(tmp_path / "hosts.json"), "-e", json.dumps(values),
                        check=False, env=ansible_env(ANSIBLE_INVENTORY=str(tmp_path / "hosts.json")),
                        timeout=120)  # fmt: skip


def refusal(tmp_path: Path, role: str, tasks: str, extra: dict, hosts: str = "srv") -> str:
    proc = run_tasks(tmp_path, role, tasks, extra, hosts)
    assert proc.returncode == 2, proc.stdout[-2000:]
    found = re.search(r"\[ERROR\]: Task failed: Action failed: (.*)", proc.stdout + proc.stderr)
    assert found, proc.stdout[-2000:]
    return found.group(1)


@pytest.mark.parametrize(("role", "tasks", "extra", "says"), [
    ("sglang_serve", "validate.yml", {"sglang_serve_engine": "reference", "speculative_topk": 4, "speculative_steps": 3,
                                      "draft_tokens": 8},
     "topk 4 asks for tree drafting, which the lab's reference engine does not implement (it drafts chains)"),
    ("sglang_serve", "validate.yml", {"sglang_serve_host": "127.0.0.1"},
     "srv binds its server to 127.0.0.1 (sglang_serve_host), which the router on rtr cannot reach: set "
     "sglang_serve_host to 0.0.0.0 or this host's address"),
    ("sglang_serve", "validate.yml", {"sglang_serve_engine": "vllm"},
     "sglang_serve_engine must be sglang or reference"),
    ("sglang_serve", "validate.yml", {"draft_tokens": 500}, "draft_tokens is 500; it must be between 2 and 64"),
    ("gpu_facts", "main.yml", {"gpu_facts_expected_count": 2},
     "srv shows 1 GPUs where 2 were expected: check the container's GPU passthrough"),
    ("gpu_facts", "main.yml", {"gpu_facts_require_idle": True}, "GPUs 0 of srv hold 900 MiB (free means at most 512"),
    ("gpu_facts", "main.yml", {"gpu_facts_require_idle": True, "gpu_facts_free_threshold_mib": -1},
     "gpu_facts_free_threshold_mib and gpu_facts_expected_count must be 0 or more (got -1 and None)."),
    ("sglang_router", "validate.yml", {"sglang_router_port": 30080, "sglang_router_health_check_interval": 0},
     "and sglang_router_health_check_interval at least 1 second (got 0)."),
    ("eagle3_train", "preflight.yml", {"eagle3_train_hosts": ["srv", "rtr"], "eagle3_train_leader_timeout": 4},
     "eagle3_train_leader_timeout is 4 s, but a node of a job over several trainers beats every 2 s"),
    # The router's host never got through the first play (here: it is in no play at all), and its port is closed.
    ("sglang_serve", "router_check.yml", {"eagle3_router_url": "http://127.0.0.1:9"},
     "srv cannot reach the router at http://127.0.0.1:9 (Status code was -1 and not [200]: Request failed: <urlopen "
     "error [Errno 111] Connection refused>): its host rtr did not get through the first play of this run (unreachable "
     "or failed there), so nothing was switched: bring it back, or put the router on a host that answers"),
    # A run limited to the servers (--limit) tells nothing of the router's host: the URL and the router are named.
    ("sglang_serve", "router_check.yml", {"eagle3_router_url": "http://127.0.0.1:9", "ansible_limit": "srv"},
     "Connection refused>): fix eagle3_router_url (or the router host's eagle3_address) and check that the router "
     "runs"),
], ids=["tree-on-reference", "loopback-behind-router", "engine", "draft-tokens", "gpu-count", "gpu-busy",
        "threshold", "router-health-interval", "node-timeout", "router-host-lost", "router-url"])  # fmt: skip
def test_a_bad_argument_is_refused_in_its_own_sentence(tmp_path, role, tasks, extra, says):
    message = refusal(tmp_path, role, tasks, extra)
    assert says in message, message
    assert "\\" not in message, message


def test_good_arguments_pass_the_same_checks(tmp_path):
    good = {"sglang_serve_host": "0.0.0.0", "draft_tokens": 10}  # noqa: S104 - a value checked, nothing binds
    proc = run_tasks(tmp_path, "sglang_serve", "validate.yml", good)
    assert proc.returncode == 0, proc.stdout[-2000:]


def test_no_task_file_escapes_an_apostrophe_or_doubles_a_backslash_in_a_folded_jinja_string():
    """The class of the two faults above, on every task and vars file: inside a Jinja expression of a folded (>-) or
    plain scalar, Ansible keeps a backslash as written."""
    bad = re.compile(r"\\'|\\\\\.")
    quoted = re.compile(r'^\s*(- )?([\w.]+: )?"')  # a YAML double-quoted scalar reads its escapes itself
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "roles").glob("*/*/*.yml"))
                 if p.parent.name in ("tasks", "vars", "defaults")
                 for n, line in enumerate(p.read_text().splitlines(), 1)
                 if bad.search(line) and not quoted.match(line)]  # fmt: skip
    assert offenders == [], offenders


def _fake_host(tmp_path: Path, userland: str, cuda: bool) -> dict[str, str]:
    """A host with an NVIDIA driver (570.86.15), a container userland of USERLAND and an interpreter whose torch says
    CUDA is or is not available: gpu_runtime's cuda.yml as deploy.yml runs it on a server."""
    driver = tmp_path / "driver-version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Thu Jan 30 2025\n")
    smi = tmp_path / "smi-userland"
    smi.write_text(f"#!/bin/sh\necho {userland}\n")
    python = tmp_path / "sglang-python"
    said = json.dumps({"torch": "2.13.0+cu128", "cuda_available": cuda})
    python.write_text(f"#!/bin/sh\necho '{said}'\n")
    for tool in (smi, python):
        tool.chmod(0o755)
    return {"gpu_runtime_driver_version_file": str(driver), "gpu_runtime_nvidia_smi": str(smi),
            "gpu_runtime_cuda_python": str(python), "gpu_runtime_cuda_pin": "sglang_runtime_torch"}  # fmt: skip


@pytest.mark.parametrize(("userland", "cuda", "says"), [
    ("570.86.15", False, "torch 2.13.0+cu128 in {python} sees no CUDA device on srv although the host has a driver: "
                         "pin a CUDA build of torch for that environment (sglang_runtime_torch)"),
    ("550.54.14", True, "The NVIDIA userland in srv (550.54.14) does not match the host driver (570.86.15)"),
], ids=["torch-without-cuda", "userland-mismatch"])  # fmt: skip
def test_a_servers_sglang_environment_is_checked_against_the_driver(tmp_path, userland, cuda, says):
    host = _fake_host(tmp_path, userland, cuda)
    message = refusal(tmp_path, "gpu_runtime", "cuda.yml", host)
    assert says.format(python=host["gpu_runtime_cuda_python"]) in message, message


def test_a_server_whose_torch_sees_the_gpus_passes_the_driver_check(tmp_path):
    proc = run_tasks(tmp_path, "gpu_runtime", "cuda.yml", _fake_host(tmp_path, "570.86.15", True))
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "Ask the environment's torch whether it sees CUDA" in proc.stdout
    assert "failed=0" in proc.stdout


def test_a_lost_router_host_is_named_not_the_server_reported_unreachable(tmp_path):
    # The server's step through the router's host (delegated there) finds that host unreachable (a closed loopback
    # port): the server fails naming the router's host, instead of coming out UNREACHABLE itself.
    (tmp_path / "hosts.json").write_text(json.dumps({"all": {"children": {
        "routers": {"hosts": {"rtr": {"ansible_host": "127.0.0.1", "ansible_port": 9, "ansible_connection": "ssh"}}},
        "servers": {"hosts": {"srv": {"ansible_connection": "local",
                                      "ansible_python_interpreter": sys.executable}}}}}}))  # fmt: skip
    (tmp_path / "play.yml").write_text("""- name: One server leaves the router
  hosts: srv
  gather_facts: false
  roles:
    - role: eagle3.ops.eagle3_defaults
  tasks:
    - name: The router role's worker step
      ansible.builtin.include_role:
        name: eagle3.ops.sglang_router
        tasks_from: worker.yml
      vars:
        sglang_router_worker_url: http://127.0.0.1:9
        sglang_router_worker_state: absent
""")
    proc = run_playbook(tmp_path / "play.yml", "-i", str(tmp_path / "hosts.json"), "-e", "eagle3_target_path=/srv/t",
                        check=False, env=ansible_env(ANSIBLE_INVENTORY=str(tmp_path / "hosts.json")), timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "srv                        : ok=2    changed=0    unreachable=0    failed=1" in proc.stdout, proc.stdout
    assert ("The router's host rtr cannot be reached to take srv out of the router (Task failed: Failed to connect "
            "to the host via ssh: ssh: connect to host 127.0.0.1 port 9: Connection refused): bring it back, then "
            "rerun deploy.yml.") in proc.stdout + proc.stderr, proc.stdout[-2000:]
