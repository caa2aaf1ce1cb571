"""The lab as a fleet (tests/lab-fleet): two Proxmox nodes, each with its own ssh hop (host key checked) and its own
pct, one cluster API over both, the shared storage in every container, and the lab's bridge between containers -
then the fleet-wide runs across both nodes, including a node that cannot be reached."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from tests.conftest import (
    LAB_API_PORT,
    LAB_PORT,
    LAB_ROOT,
    LAB_STATE,
    PCT,
    ROOT,
    ansible_env,
    recap,
    run_playbook,  # fmt: skip
)

pytestmark = pytest.mark.lab
FLEET = ROOT / "tests" / "lab-fleet"
NODES = {"pve-lab": LAB_PORT, "pve-lab2": LAB_PORT + 1}
CONTAINERS = {131: "pve-lab", 132: "pve-lab2", 133: "pve-lab", 134: "pve-lab2"}
IPS = {131: "10.203.0.31", 132: "10.203.0.32", 133: "10.203.0.33", 134: "10.203.0.34"}


def fleet_env() -> dict[str, str]:
    return ansible_env(ANSIBLE_INVENTORY=str(FLEET))


def node_pct(node: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PCT, *args], capture_output=True, text=True, timeout=120, check=False,
                          env=dict(os.environ, EAGLE3_LAB_NODE=node))  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(f"pct {' '.join(args)} on {node} failed ({proc.returncode}): {proc.stderr}")
    return proc


def hop_of(node: str, *remote: str) -> subprocess.CompletedProcess[str]:
    argv = ["ssh", "-p", str(NODES[node]), "-i", str(LAB_STATE / "id_ed25519"), "-o",
            f"UserKnownHostsFile={LAB_STATE / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
            "-o", "IdentitiesOnly=yes", "-o", "ControlMaster=no", "root@127.0.0.1", *remote]  # fmt: skip
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def close_ssh_masters() -> None:
    """Ansible's ControlPersist masters would keep a session to a stopped hop alive; a new run opens new ones."""
    cp = os.path.expanduser("~/.ansible/cp")
    for name in os.listdir(cp) if os.path.isdir(cp) else []:
        subprocess.run(["ssh", "-o", f"ControlPath={os.path.join(cp, name)}", "-O", "exit", "x"], capture_output=True,
                       timeout=10, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def fleet(lab):
    proc = run_playbook("lab.yml", env=fleet_env(), timeout=1500)
    yield recap(proc.stdout)
    for vmid, node in CONTAINERS.items():
        node_pct(node, "destroy", str(vmid), "--force", "1", check=False)
    hop_pid = LAB_ROOT / "sshd-pve-lab2" / "sshd.pid"
    if hop_pid.exists():
        os.kill(int(hop_pid.read_text().split()[0]), signal.SIGTERM)
    close_ssh_masters()
    # back to the single-node lab: the API answers for pve-lab alone, known_hosts holds its one hop
    run_playbook("lab.yml", timeout=900)


def test_each_node_has_its_hop_and_its_pct(fleet):
    known = (LAB_STATE / "known_hosts").read_text().splitlines()
    assert sorted(line.split()[0] for line in known) == [f"[127.0.0.1]:{LAB_PORT}", f"[127.0.0.1]:{LAB_PORT + 1}"]
    assert len({line.split()[2] for line in known}) == 2  # a host key of its own per node
    for node in NODES:
        out = hop_of(node, "pct list").stdout
        listed = {int(line.split()[0]) for line in out.splitlines()[1:]}
        assert {v for v, n in CONTAINERS.items() if n == node} <= listed, out
        assert not {v for v, n in CONTAINERS.items() if n != node} & listed, out
    # a container is found only on its own node, as `pct exec` on the wrong Proxmox node fails
    wrong = node_pct("pve-lab", "exec", "132", "--", "true", check=False)
    assert wrong.returncode == 255 and "nodes/pve-lab/lxc/132.conf' does not exist" in wrong.stderr


def test_one_cluster_api_answers_for_both_nodes(fleet):
    import ssl
    import urllib.request

    token = (LAB_STATE / "pve-token").read_text().strip()
    ctx = ssl.create_default_context(cafile=str(LAB_STATE / "pve-ca.pem"))

    def get(path: str):
        req = urllib.request.Request(f"https://127.0.0.1:{LAB_API_PORT}/api2/json{path}",
                                     headers={"Authorization": f"PVEAPIToken=root@pam!eagle3={token}"})  # fmt: skip
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310 -- the lab's own API
            return json.loads(resp.read())["data"]

    assert [n["node"] for n in get("/nodes")] == ["pve-lab", "pve-lab2"]
    where = {r["vmid"]: (r["node"], r["status"]) for r in get("/cluster/resources?type=vm")}
    for vmid, node in CONTAINERS.items():
        assert where[vmid] == (node, "running")
    assert [c["vmid"] for c in get("/nodes/pve-lab2/lxc")] == [132, 134]


def test_containers_reach_each_other_across_nodes_and_nothing_else(fleet):
    listener = subprocess.Popen([PCT, "exec", "131", "--", "python3", "-c",
                                 "import socket; s = socket.socket(); s.bind(('10.203.0.31', 7777)); s.listen(1); "
                                 "c, a = s.accept(); print(a[0])"], stdout=subprocess.PIPE, text=True,
                                env=dict(os.environ, EAGLE3_LAB_NODE="pve-lab"))  # fmt: skip
    try:
        time.sleep(1.5)
        node_pct("pve-lab2", "exec", "132", "--", "python3", "-c",
                 "import socket; socket.create_connection(('10.203.0.31', 7777), timeout=5).close()")  # fmt: skip
        assert listener.communicate(timeout=20)[0].strip() == IPS[132]
    finally:
        listener.kill()
    routes = node_pct("pve-lab2", "exec", "132", "--", "ip", "route").stdout
    assert "default" not in routes and routes.split()[0] == "10.203.0.0/24"
    bridge = subprocess.run(["ip", "-br", "addr", "show", "dev", "eagle3test0"], capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    assert bridge[:2] == ["eagle3test0", "UP"] and len(bridge) == 2  # no address on the host side


def test_fleet_cleanup_and_status_cover_both_nodes(fleet, job_marker):
    started = node_pct("pve-lab2", "exec", "134", "--", "env", f"EAGLE3_TEST_JOB={job_marker}", "lab-workload",
                       "--gpus", "0", "--mib", "3000").stdout  # fmt: skip
    assert json.loads(started)
    proc = run_playbook("cleanup.yml", env=fleet_env(), check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    summary = [line for line in proc.stdout.splitlines() if "holders=" in line]
    assert sorted(line.split(":")[0].strip(" -'") for line in summary) == ["ct131", "ct132", "ct133", "ct134"]
    busy = [line.strip(" -'") for line in summary if line.strip(" -'").startswith("ct134:")]
    assert busy and "holders=0" not in busy[0] and "freed=3000 MiB" in busy[0], summary  # node 2's job went
    assert all("holders=0" in line for line in summary if "ct134" not in line), summary
    status = run_playbook("status.yml", env=fleet_env(), check=False)
    assert status.returncode == 0 and set(recap(status.stdout)) >= {"ct131", "ct132", "ct133", "ct134"}


def test_an_unreachable_node_is_named_and_the_others_finish(fleet):
    hop_pid = LAB_ROOT / "sshd-pve-lab2" / "sshd.pid"
    os.kill(int(hop_pid.read_text().split()[0]), signal.SIGTERM)
    close_ssh_masters()
    try:
        proc = run_playbook("cleanup.yml", env=fleet_env(), check=False)
        assert proc.returncode != 0
        result = recap(proc.stdout)
        assert result["ct132"]["unreachable"] == 1 and result["ct134"]["unreachable"] == 1
        assert result["ct131"]["failed"] == 0 and result["ct133"]["failed"] == 0
        for ct in ("ct132", "ct134"):
            assert f"{ct}: NOT CLEANED (unreachable on node pve-lab2, see above why)" in proc.stdout
        assert "ct131: holders=" in proc.stdout and "ct133: holders=" in proc.stdout
    finally:
        run_playbook("lab.yml", "--tags", "lab_host_sshd", env=fleet_env(), timeout=900)  # the hop comes back
    assert hop_of("pve-lab2", "pct list").returncode == 0


def test_the_inventory_plugin_finds_every_container_of_the_cluster_and_reaches_it(fleet, tmp_path):
    cfg = tmp_path / "fleet.proxmox_ct.yml"
    cfg.write_text(json.dumps({
        "plugin": "eagle3.ops.proxmox_ct", "url": f"https://127.0.0.1:{LAB_API_PORT}", "token_id": "eagle3",
        "token_secret": (LAB_STATE / "pve-token").read_text().strip(), "validate_certs": str(LAB_STATE / "pve-ca.pem"),
        "node_addresses": {node: "127.0.0.1" for node in NODES}, "node_ports": NODES, "host_name": "vmid",
        "compose": {"ansible_ssh_private_key_file": f"'{LAB_STATE / 'id_ed25519'}'",
                    "ansible_ssh_common_args": f"'-o UserKnownHostsFile={LAB_STATE / 'known_hosts'} "
                                               "-o StrictHostKeyChecking=yes'",
                    "ansible_pct_executable": f"'{PCT}'"}}))  # fmt: skip
    env = ansible_env(ANSIBLE_INVENTORY=str(cfg))
    listed = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-inventory"), "--list"], env=env, capture_output=True,
                            text=True, timeout=120, check=True)  # fmt: skip
    data = json.loads(listed.stdout)
    for vmid, node in CONTAINERS.items():
        assert f"ct{vmid}" in data[f"node_{node.replace('-', '_')}"]["hosts"]
        assert data["_meta"]["hostvars"][f"ct{vmid}"]["ansible_port"] == NODES[node]
    pinged = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible"), "-m", "ansible.builtin.ping",
                             ",".join(f"ct{v}" for v in CONTAINERS)], env=env, capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    assert pinged.returncode == 0 and pinged.stdout.count("SUCCESS") == len(CONTAINERS), pinged.stdout[-3000:]


def test_provision_creates_a_container_on_the_node_the_inventory_names(fleet, tmp_path):
    import yaml

    from tests.integration.test_provision import inventory

    # (on Proxmox /etc/pve/lxc is the local node's directory; the lab names the node's directory itself)
    host = {"pct_vmid": 135, "pct_node": "pve-lab2", "ansible_port": NODES["pve-lab2"], "proxmox_ct_gpus": [0],
            "proxmox_ct_tags": ["trainer"],
            "proxmox_ct_conf_dir": str(LAB_ROOT / "pve" / "nodes" / "pve-lab2" / "lxc")}  # fmt: skip
    path = inventory(tmp_path, {"fleet-135": host})
    data = yaml.safe_load(path.read_text())
    data["all"]["children"]["hypervisors"]["hosts"]["pve-lab2"] = {
        **data["all"]["children"]["hypervisors"]["hosts"]["pve-lab"], "ansible_port": NODES["pve-lab2"],
        "proxmox_node": "pve-lab2"}  # fmt: skip
    path.write_text(yaml.safe_dump(data))
    try:
        proc = run_playbook("provision.yml", "-i", str(path), check=False)
        assert proc.returncode == 0, proc.stdout[-4000:]
        assert "via raw lxc lines on pve-lab2" in proc.stdout
        assert (LAB_ROOT / "pve" / "nodes" / "pve-lab2" / "lxc" / "135.conf").exists()
        assert not (LAB_ROOT / "pve" / "nodes" / "pve-lab" / "lxc" / "135.conf").exists()
        assert "135" in hop_of("pve-lab2", "pct list").stdout and "135" not in hop_of("pve-lab", "pct list").stdout
        assert node_pct("pve-lab2", "exec", "135", "--", "test", "-c", "/dev/nvidia0").returncode == 0
    finally:
        node_pct("pve-lab2", "destroy", "135", "--force", "1", check=False)
