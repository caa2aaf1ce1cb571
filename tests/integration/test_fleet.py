"""The lab as a fleet (tests/lab-fleet): two Proxmox nodes, each with its own ssh hop (host key checked) and its own
pct, one cluster API over both, the shared storage in every container, and the lab's bridge between containers -
then the fleet-wide runs across both nodes, including a node that cannot be reached.

The fleet is a lab of its own (root, ports, keys, pct and bridge apart from the one-node test lab's): conftest's
fleet_lab brings it up and takes it down when the session of the worker that runs these tests ends, so they run
beside the one-node lab's tests in the other pytest-xdist worker."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import (
    FLEET_API_PORT,
    FLEET_INVENTORY,
    FLEET_PCT,
    FLEET_PORT,
    FLEET_ROOT,
    FLEET_STATE,
    ROOT,
    ansible_env,
    close_ssh_masters,
    flat,
    recap,
    record_figure,
    run_playbook,
    serving_keys,
)

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("fleet")]
FLEET = FLEET_INVENTORY
LAB_STATE, LAB_ROOT, PCT, LAB_PORT, LAB_API_PORT = FLEET_STATE, FLEET_ROOT, FLEET_PCT, FLEET_PORT, FLEET_API_PORT
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


@pytest.fixture(scope="module")
def fleet(fleet_lab):
    return fleet_lab["recap"]


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
    bridge = subprocess.run(["ip", "-br", "addr", "show", "dev", "eagle3fleet0"], capture_output=True, text=True,
                            check=True).stdout.split()  # fmt: skip
    assert bridge[:2] == ["eagle3fleet0", "UP"] and len(bridge) == 2  # no address on the host side


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
    assert status_table(status.stdout) == {"ct131": "pve-lab running", "ct132": "pve-lab2 running",
                                           "ct133": "pve-lab running", "ct134": "pve-lab2 running"}, \
        status.stdout  # fmt: skip


def status_table(stdout: str) -> dict[str, str]:
    """The node and state of each host in the table that status.yml prints after its recap ("pve-lab2 unreachable")."""
    lines = stdout[stdout.rindex("FLEET STATUS"):].splitlines()[1:]
    assert lines[0].split()[:3] == ["HOST", "NODE", "STATE"], lines[0]
    rows = [line.split() for line in lines[1:lines.index("")] if not line.startswith(("router", " "))]
    return {row[0]: f"{row[1]} {row[2]}" for row in rows}


def test_an_unreachable_node_is_named_and_the_others_finish(fleet, tmp_path):
    hop_pid = LAB_ROOT / "sshd-pve-lab2" / "sshd.pid"
    os.kill(int(hop_pid.read_text().split()[0]), signal.SIGTERM)
    close_ssh_masters(NODES.values())
    try:
        proc = run_playbook("cleanup.yml", env=fleet_env(), check=False)
        assert proc.returncode != 0
        result = recap(proc.stdout)
        assert result["ct132"]["unreachable"] == 1 and result["ct134"]["unreachable"] == 1
        assert result["ct131"]["failed"] == 0 and result["ct133"]["failed"] == 0
        for ct in ("ct132", "ct134"):
            assert f"{ct}: NOT CLEANED (unreachable on node pve-lab2, see above why)" in proc.stdout
        assert "ct131: holders=" in proc.stdout and "ct133: holders=" in proc.stdout
        status = run_playbook("status.yml", env=fleet_env(), check=False)
        assert status.returncode != 0
        # the silent containers' node named beside them
        assert status_table(status.stdout) == {"ct131": "pve-lab running", "ct132": "pve-lab2 unreachable",
                                               "ct133": "pve-lab running", "ct134": "pve-lab2 unreachable"}, \
            status.stdout[-3000:]  # fmt: skip
        # The cluster API sees the node offline (as PVE does); the dynamic inventory still lists its containers,
        # with the state unknown and a warning, so a run over it names them unreachable and reaches the others.
        listed, pinged = list_and_ping(dynamic_inventory(tmp_path))
        data = json.loads(listed.stdout)
        assert sorted(data["status_unknown"]["hosts"]) == ["ct132", "ct134"], listed.stdout[-3000:]
        assert data["_meta"]["hostvars"]["ct132"]["proxmox_node_online"] is False
        assert "node pve-lab2 is offline" in " ".join(listed.stderr.split()), listed.stderr[-2000:]
        assert pinged.returncode != 0 and pinged.stdout.count("SUCCESS") == 2, pinged.stdout[-3000:]
        assert "ct132 | UNREACHABLE!" in pinged.stdout and "ct134 | UNREACHABLE!" in pinged.stdout
    finally:
        run_playbook("lab.yml", "--tags", "lab_host_sshd", env=fleet_env(), timeout=900)  # the hop comes back
    assert hop_of("pve-lab2", "pct list").returncode == 0


def test_a_node_lost_while_its_holders_are_stopped_is_reported_unknown_not_untouched(fleet, job_marker):
    """Node 2 dies (its hop and every session through it, as when it loses power) while ct134's real pass waits out
    the grace of a worker that ignores SIGTERM: the stop may have run there, so the summary says so, with ssh's own
    reason asked anew (the shared master died without one), and the other hosts finish."""
    node_pct("pve-lab2", "exec", "134", "--", "env", f"EAGLE3_TEST_JOB={job_marker}", "lab-workload", "--gpus", "0",
             "--mib", "1000", "--ignore-term-ranks", "0")  # fmt: skip
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "cleanup.yml", "-e", "gpu_cleanup_grace=8"]
    play = subprocess.Popen(cmd, cwd=ROOT, env=fleet_env(), stdout=subprocess.PIPE, text=True)
    assert play.stdout is not None
    lines, killed = [], False
    try:
        for line in play.stdout:
            lines.append(line)
            if not killed and line.startswith("TASK [eagle3.ops.gpu_cleanup : Run gpu_cleanup (for real)]"):
                time.sleep(2)  # the module runs in ct134, in its grace
                hop = int((LAB_ROOT / "sshd-pve-lab2" / "sshd.pid").read_text().split()[0])
                sessions = subprocess.run(["pgrep", "--parent", str(hop)], capture_output=True, text=True,
                                          check=False).stdout.split()  # fmt: skip
                # The listener first: the sessions' deaths make the play ask ssh anew at once, and a listener
                # still up for that instant would take the new connection and reset it (the node is gone either
                # way, but the reason quoted is then "Connection reset", not "Connection refused").
                os.kill(hop, signal.SIGKILL)
                for pid in sessions:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
                killed = True
        out = "".join(lines)
        assert killed and play.wait(timeout=300) != 0, out[-4000:]
        assert recap(out)["ct134"]["unreachable"] == 1 and recap(out)["ct131"]["failed"] == 0, out[-4000:]
        assert re.search(r"ct134: UNKNOWN \(unreachable on node pve-lab2 while its [1-9]\d* holders were being "
                         r"stopped, see above why\): run the cleanup again once it answers", flat(out)), out[-4000:]
        assert f"a new connection says: ssh: connect to host 127.0.0.1 port {LAB_PORT + 1}: Connection refused" \
            in flat(out), out[-4000:]  # fmt: skip
        assert "ct131: holders=0" in out and "ct133: holders=0" in out
    finally:
        play.kill()
        play.wait()
        run_playbook("lab.yml", "--tags", "lab_host_sshd", env=fleet_env(), timeout=900)  # the hop comes back
    # Whatever the lost pass did, a cleanup once the node answers leaves ct134 free.
    again = run_playbook("cleanup.yml", env=fleet_env())
    assert re.search(r"ct134: holders=\d+ .* survivors=0 ", flat(again.stdout)), again.stdout[-3000:]


def dynamic_inventory(tmp_path: Path) -> dict[str, str]:
    """The environment of a run over the fleet lab through the proxmox_ct inventory plugin (the cluster API)."""
    cfg = tmp_path / "fleet.proxmox_ct.yml"
    cfg.write_text(json.dumps({
        "plugin": "eagle3.ops.proxmox_ct", "url": f"https://127.0.0.1:{LAB_API_PORT}", "token_id": "eagle3",
        "token_secret": (LAB_STATE / "pve-token").read_text().strip(), "validate_certs": str(LAB_STATE / "pve-ca.pem"),
        "node_addresses": {node: "127.0.0.1" for node in NODES}, "node_ports": NODES, "host_name": "vmid",
        "compose": {"ansible_ssh_private_key_file": f"'{LAB_STATE / 'id_ed25519'}'",
                    "ansible_ssh_common_args": f"'-o UserKnownHostsFile={LAB_STATE / 'known_hosts'} "
                                               "-o StrictHostKeyChecking=yes'",
                    "ansible_pct_executable": f"'{PCT}'"}}))  # fmt: skip
    return ansible_env(ANSIBLE_INVENTORY=str(cfg))


def list_and_ping(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    listed = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible-inventory"), "--list"], env=env, capture_output=True,
                            text=True, timeout=120, check=True)  # fmt: skip
    pinged = subprocess.run([str(ROOT / ".venv" / "bin" / "ansible"), "-m", "ansible.builtin.ping",
                             ",".join(f"ct{v}" for v in CONTAINERS)], env=env, capture_output=True, text=True,
                            timeout=300, check=False)  # fmt: skip
    return listed, pinged


def test_the_inventory_plugin_finds_every_container_of_the_cluster_and_reaches_it(fleet, tmp_path):
    listed, pinged = list_and_ping(dynamic_inventory(tmp_path))
    data = json.loads(listed.stdout)
    for vmid, node in CONTAINERS.items():
        assert f"ct{vmid}" in data[f"node_{node.replace('-', '_')}"]["hosts"]
        assert data["_meta"]["hostvars"][f"ct{vmid}"]["ansible_port"] == NODES[node]
    assert pinged.returncode == 0 and pinged.stdout.count("SUCCESS") == len(CONTAINERS), pinged.stdout[-3000:]


def test_provision_creates_a_container_on_the_node_the_inventory_names(fleet, tmp_path):
    import yaml

    from tests.integration.test_provision import inventory

    # (on Proxmox /etc/pve/lxc is the local node's directory; the lab names the node's directory itself)
    host = {"pct_vmid": 135, "pct_node": "pve-lab2", "ansible_port": NODES["pve-lab2"], "proxmox_ct_gpus": [0],
            "proxmox_ct_tags": ["trainer"],
            "proxmox_ct_conf_dir": str(LAB_ROOT / "pve" / "nodes" / "pve-lab2" / "lxc")}  # fmt: skip
    path = inventory(tmp_path, {"fleet-135": host}, state=LAB_STATE, root=LAB_ROOT, port=LAB_PORT,
                     api_port=LAB_API_PORT)  # fmt: skip
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


# --- Data and training across the fleet's trainers (ct131 on pve-lab, ct132 on pve-lab2, one shared store) ---
FLEET_RUN = "/srv/eagle3/runs/fleet-test"
TRAIN = ("-e", f"eagle3_run_dir={FLEET_RUN}", "-e", "eagle3_vllm_judge=false", "-e", "eagle3_train_epochs=3")
TRAINERS = {"ct131": ("pve-lab", 131), "ct132": ("pve-lab2", 132)}


def on_share(path: str) -> Path:
    """Where the lab keeps a path of the shared storage (/srv/eagle3 in every container)."""
    return LAB_ROOT / "share" / path.removeprefix("/srv/eagle3/")


def trainer(host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    node, vmid = TRAINERS[host]
    return node_pct(node, "exec", str(vmid), "--", *cmd, check=check)


def step_losses(*logs: Path) -> dict[int, float]:
    """speculators' per-step training loss by global step (global rank 0 logs it); later attempts win."""
    found: dict[int, float] = {}
    for log in logs:
        for loss, step in re.findall(r"train/loss=([-\d.e+]+),.*?global_step=(\d+)", log.read_text(), re.S):
            found[int(step)] = float(loss)
    return found


@pytest.fixture(scope="module")
def fleet_run(fleet):
    shutil.rmtree(on_share(FLEET_RUN), ignore_errors=True)
    yield on_share(FLEET_RUN)
    for host in TRAINERS:  # the job's unit starts at boot: disabled, so that no later restart of a container runs it
        trainer(host, "systemctl", "stop", "eagle3-data-vllm", check=False)
        trainer(host, "systemctl", "disable", "--now", "eagle3-train", check=False)
    shutil.rmtree(on_share(FLEET_RUN), ignore_errors=True)


def test_hidden_states_shard_over_two_nodes_then_one_job_trains_over_both_and_resumes_after_a_node_dies(fleet_run):
    # 1. The data stage over both trainers: the first regenerates; each extracts its half into the one store.
    start = run_playbook("train.yml", *TRAIN, "-e", "eagle3_train_wait=false", env=fleet_env(), timeout=2400,
                         check=False)  # fmt: skip
    assert start.returncode == 0, start.stdout[-5000:]
    store = fleet_run / "data" / "hidden_states"
    shards = [json.loads((store / f"SHARD-{rank}-of-2.json").read_text()) for rank in (0, 1)]
    rows = len(list(store.glob("hs_*.safetensors")))
    assert (store / "COMPLETE.json").exists() and rows > 0
    assert [(s["rank"], s["world"], s["first"], s["samples"]) for s in shards] == [
        (0, 2, 0, rows // 2), (1, 2, rows // 2, rows - rows // 2)]  # fmt: skip
    for host in TRAINERS:  # each host wrote its own logs, none shared
        assert (fleet_run / "data" / "logs" / host / "hidden.log").stat().st_size > 0
    # 2. One torchrun job over both: c10d rendezvous at the first trainer's bridge address, one unit per host.
    units = {host: trainer(host, "systemctl", "cat", "eagle3-train").stdout for host in TRAINERS}
    for host, text in units.items():
        assert "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 10.203.0.31:29400" in text
        assert f"--local-addr {IPS[int(host[2:])]}" in text and "GLOO_SOCKET_IFNAME=eth0" in text
    assert "is_host=1" in units["ct131"] and f"--peer-state={FLEET_RUN}/train/state/node-1" in units["ct131"]
    assert "is_host=0" in units["ct132"] and f"--follow {FLEET_RUN}/train/state" in units["ct132"]
    # 3. Node 2's unit is killed once the first epoch is saved: the leader's ranks lose their peer, systemd restarts
    # both, and the job resumes from the newest complete epoch.
    save = fleet_run / "train" / "save"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (save / "0" / "training_state.json").exists():
        time.sleep(0.5)
    assert (save / "0" / "training_state.json").exists(), "the two-node job saved no epoch"
    trainer("ct132", "systemctl", "kill", "-s", "KILL", "eagle3-train")
    done = run_playbook("train.yml", *TRAIN, env=fleet_env(), timeout=1800, check=False)
    assert done.returncode == 0, done.stdout[-5000:]
    assert all(recap(done.stdout)[host]["failed"] == 0 for host in TRAINERS)
    state = fleet_run / "train" / "state"
    leader = json.loads((state / "attempts.json").read_text())
    follower = json.loads((state / "node-1" / "attempts.json").read_text())
    # gloo names the lost peer as closed or reset, depending on where the leader's read was when it died
    assert leader[0]["cause"] == "error" and re.search(r"Connection (closed|reset) by peer", leader[0]["log_tail"])
    assert leader[-1]["cause"] == "completed" and leader[-1]["resume_from_epoch"] is not None
    assert follower[-1]["n"] == leader[-1]["n"] and follower[-1]["cause"] == "completed"
    assert json.loads((state / "result.json").read_text())["best_epoch"] is not None
    # 4. The same training on one node (two ranks there, the same global batch) goes step for step the same way.
    one = run_playbook("train.yml", *TRAIN, "--limit", "ct131", "--tags", "train", "-e", "eagle3_train_nproc=2",
                       "-e", f"eagle3_train_dir={FLEET_RUN}/train-one", "-e", '{"eagle3_train_hosts": ["ct131"]}',
                       env=fleet_env(), timeout=1200, check=False)  # fmt: skip
    assert one.returncode == 0, one.stdout[-5000:]
    two_nodes = step_losses(*sorted(state.glob("attempt-*.log"), key=lambda p: int(p.stem.split("-")[1])))
    one_node = step_losses(fleet_run / "train-one" / "state" / "attempt-1.log")
    assert len(two_nodes) == len(one_node) > 10 and sorted(two_nodes) == sorted(one_node)
    assert all(abs(two_nodes[s] - one_node[s]) <= 0.01 for s in one_node), (two_nodes, one_node)


def restart_container(node: str, vmid: int) -> None:
    """Start a container that was killed, and wait until its systemd answers on its bus (lxc-start returns first)."""
    node_pct(node, "start", str(vmid), check=False)
    back = time.monotonic() + 120
    while time.monotonic() < back and node_pct(node, "exec", str(vmid), "--", "systemctl", "is-system-running",
                                               "--wait", check=False).stdout.strip() not in ("running", "degraded"):
        time.sleep(1)


def unit_state(host: str, unit: str) -> dict[str, str]:
    out = trainer(host, "systemctl", "show", "-p", "ActiveState", "-p", "Result", "-p", "ExecMainStatus", unit).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def when_stopped(host: str, unit: str) -> tuple[dict[str, str], float]:
    """The unit's state once it no longer runs (or after 120 s), and the seconds that took from now."""
    start = time.monotonic()
    while time.monotonic() - start < 120 and unit_state(host, unit)["ActiveState"] in (
            "active", "activating", "deactivating"):  # fmt: skip
        time.sleep(1)
    return unit_state(host, unit), time.monotonic() - start


def test_a_follower_whose_leader_node_dies_stops_and_the_leader_back_without_it_stops_naming_it(fleet_run):
    # A job over both trainers, started without waiting; then the leader's whole container goes down mid-attempt
    # (its ranks vanish without closing a connection, as when a node loses power): the follower must not wait for
    # gloo's own timeout nor for eagle3_train_timeout - it stops once the leader's heartbeat is silent.
    # The play waits for the job, as a user's does: the leader's host must come out of it UNREACHABLE in the
    # connection's sentence (not failed on its wait's own condition), and the follower's failure must name that node.
    run_dir = f"{FLEET_RUN}/train-dies"
    pool = ThreadPoolExecutor(1)
    play = pool.submit(run_playbook, "train.yml", *TRAIN, "--tags", "train", "-e", f"eagle3_train_dir={run_dir}", "-e",
                       "eagle3_train_leader_timeout=15", env=fleet_env(), timeout=1200, check=False)  # fmt: skip
    follower_attempts = on_share(run_dir) / "state" / "node-1" / "attempts.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not play.done() and '"running"' not in (
            follower_attempts.read_text() if follower_attempts.exists() else ""):  # fmt: skip
        time.sleep(0.5)
    joined = follower_attempts.read_text() if follower_attempts.exists() else ""
    assert '"running"' in joined, ("the follower joined no attempt", play.done() and play.result().stdout[-5000:])
    try:
        node_pct("pve-lab", "stop", "131")  # no clean shutdown: lxc-stop's immediate kill
        state, waited = when_stopped("ct132", "eagle3-train")
        proc = play.result(timeout=300)
        out = flat(proc.stdout)
        lost = recap(proc.stdout)["ct131"]
        assert lost["unreachable"] == 1 and lost["failed"] == 0, out[-5000:]
        assert re.search(r"fatal: \[ct131\]: UNREACHABLE! .*CT 131 on node pve-lab \(hypervisor [^)]*\) "
                         r"(stopped during the task|is not running)", out), out[-5000:]  # fmt: skip
        assert recap(proc.stdout)["ct132"]["failed"] == 1, out[-5000:]
        assert ("ct131, a node of this job, gave no sign of life for 15 s (its node down or cut off, or its unit "
                "stopped), so the job stopped without a result") in out, out[-5000:]  # fmt: skip
        # exit 4 is in RestartPreventExitStatus: the unit stays failed, the play's wait names it
        assert state["ActiveState"] == "failed" and state["ExecMainStatus"] == "4", state
        assert waited < 15 + 30, f"the follower stopped {waited:.0f} s after its leader's node (timeout 15 s)"
        log = trainer("ct132", "journalctl", "-u", "eagle3-train", "--no-pager", "-n", "40").stdout
        # (its ranks were stopped by the launcher, or had failed on the lost store already)
        assert "the leader (" in log and "has given no sign of life for 15 s" in log, log
        # Its record says so, naming the leader's node, whatever its ranks died of (the lost store, or the stop).
        left = json.loads(follower_attempts.read_text())[-1]
        assert left["cause"] == "node_gone" and left["node"] == "ct131", left
        # The leader's node comes back and its unit starts the job again (enabled: a node that comes back rejoins
        # its job), but the follower has given up: the leader's attempt would wait at a rendezvous ct132 never
        # joins, and systemd would start it into that wait again. It stops once ct132 is silent for the timeout.
        restart_container("pve-lab", 131)
        state, waited = when_stopped("ct131", "eagle3-train")
        assert state["ActiveState"] == "failed" and state["ExecMainStatus"] == "5", state
        assert waited < 15 + 30, f"the leader stopped {waited:.0f} s after its node came back (timeout 15 s)"
        tried = json.loads((on_share(run_dir) / "state" / "attempts.json").read_text())
        assert tried[-1]["cause"] == "node_gone" and tried[-1]["node"] == "ct132", tried
        assert tried[-2]["cause"] == "interrupted"  # the attempt its node's death ended
    finally:
        pool.shutdown(wait=True)
        # ct132 first: a failed unit stays loaded with its definition, which the next test's job must not inherit;
        # and it starts at boot, which a later test's restart of ct132 must not do.
        trainer("ct132", "systemctl", "reset-failed", "eagle3-train", check=False)
        trainer("ct132", "systemctl", "disable", "eagle3-train", check=False)
        restart_container("pve-lab", 131)
        # This test's job is over: the leader's unit is stopped, reset and disabled.
        trainer("ct131", "systemctl", "disable", "--now", "eagle3-train", check=False)
        trainer("ct131", "systemctl", "reset-failed", "eagle3-train", check=False)


def row_files(store: Path, rows: list[int] | range | None = None) -> dict[str, tuple[int, int]]:
    """The store's row files (all, or those of ROWS) by name: inode and mtime, to tell which a run rewrote."""
    paths = store.glob("hs_*.safetensors") if rows is None else (store / f"hs_{r}.safetensors" for r in rows)
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths if p.exists()}


def loads(path: Path) -> bool:
    from safetensors.numpy import load_file

    try:
        load_file(str(path))
    except Exception:  # cut short by the kill, in whatever way the reader notices
        return False
    return True


def test_a_shard_host_killed_mid_extraction_is_named_and_a_rerun_extracts_only_its_missing_rows(fleet_run):
    from eagle3_ops.payloads.training.hs_store import shard_rows

    store = fleet_run / "data" / "hidden_states"
    if not (store / "COMPLETE.json").exists():
        pytest.skip("needs the sharded store of the test before")
    total = len(list(store.glob("hs_*.safetensors")))
    mine = list(shard_rows(total, 2, 1))
    for row in mine:  # shard 1 to extract again, from nothing
        (store / f"hs_{row}.safetensors").unlink()
    (store / "SHARD-1-of-2.json").unlink()
    (store / "COMPLETE.json").unlink()
    first_logs = fleet_run / "data" / "logs" / "ct131"
    untouched = {p.name: p.stat().st_mtime_ns for p in first_logs.iterdir()}
    shard0 = row_files(store, shard_rows(total, 2, 0))
    # 1. The data stage; ct132's container is killed (no clean shutdown, as when its node loses power) once it has
    # written some of its rows. One request at a time, so that the kill lands mid-way.
    argv = [str(Path(sys.executable).parent / "ansible-playbook"), "train.yml", *TRAIN, "--tags", "data", "-e",
            "eagle3_data_extract_concurrency=1"]  # fmt: skip
    run = subprocess.Popen(argv, cwd=ROOT, env=fleet_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline, written = time.monotonic() + 900, []
        while time.monotonic() < deadline and run.poll() is None and not written:
            written = [r for r in mine if (store / f"hs_{r}.safetensors").exists()]
            time.sleep(0.2)
        assert written and len(written) < len(mine), f"ct132 wrote {len(written)} of its {len(mine)} rows"
        node_pct("pve-lab2", "stop", "132")
        out = run.communicate(timeout=900)[0]
    finally:
        if run.poll() is None:
            run.kill()
        restart_container("pve-lab2", 132)
    assert run.returncode != 0
    result = recap(out)
    assert result["ct132"]["failed"] + result["ct132"]["unreachable"] >= 1, out[-4000:]
    assert result["ct131"]["failed"] == 0, out[-4000:]
    assert not (store / "COMPLETE.json").exists() and not (store / "SHARD-1-of-2.json").exists()
    left = row_files(store, mine)
    assert 0 < len(left) < len(mine), f"{len(left)} of ct132's {len(mine)} rows were left"
    whole = {name for name in left if loads(store / name)}
    # 2. ct132 back: the rerun extracts exactly the rows the dead host had not finished, nothing of shard 0.
    again = run_playbook("train.yml", *TRAIN, "--tags", "data", env=fleet_env(), timeout=1800, check=False)
    assert again.returncode == 0, again.stdout[-5000:]
    after = row_files(store, mine)
    redone = {name for name in after if left.get(name) != after[name]}
    assert redone == {f"hs_{row}.safetensors" for row in mine} - whole, sorted(redone)
    assert row_files(store, shard_rows(total, 2, 0)) == shard0
    assert (store / "SHARD-1-of-2.json").exists() and (store / "COMPLETE.json").exists()
    # Shard 0 was complete: ct131 started no server and extracted nothing (its logs are as they were).
    assert {p.name: p.stat().st_mtime_ns for p in first_logs.iterdir()} == untouched


def both_hold_their_gpu() -> list[str]:
    """The pids that hold each trainer's GPU, once both nodes' ranks do (or as they are after 120 s)."""
    deadline = time.monotonic() + 120
    while True:
        held = [trainer(h, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout.strip()
                for h in TRAINERS]  # fmt: skip
        if all(held) or time.monotonic() > deadline:
            return held
        time.sleep(1)


def running_attempt(state: Path) -> int | None:
    tried = json.loads(state.read_text()) if state.exists() else []
    return tried[-1]["n"] if tried and tried[-1]["cause"] == "running" else None


def test_a_changed_multi_node_job_restarts_on_every_node_then_cleanup_of_one_trainer_stops_it_everywhere(fleet_run):
    train_dir = f"{FLEET_RUN}/train-cleanup"
    job = (*TRAIN, "--tags", "train", "-e", "eagle3_train_wait=false", "-e", f"eagle3_train_dir={train_dir}")
    run = run_playbook("train.yml", *job, "-e", "eagle3_train_epochs=50", env=fleet_env(), timeout=1200, check=False)
    assert run.returncode == 0, run.stdout[-4000:]

    # 1. The job changes while it runs (here its epochs; its units are up, its first attempt forming or under way):
    # every node's launcher is restarted with its new unit - a follower that went on with its old command would
    # never form an attempt with the leader's new one.
    def main_pid(host: str) -> str:
        return trainer(host, "systemctl", "show", "-p", "MainPID", "--value", "eagle3-train").stdout.strip()

    pids = {h: main_pid(h) for h in TRAINERS}
    state = on_share(train_dir) / "state"
    states = {"ct131": state / "attempts.json", "ct132": state / "node-1" / "attempts.json"}
    tried = len(json.loads(states["ct131"].read_text())) if states["ct131"].exists() else 0
    changed = run_playbook("train.yml", *job, "-e", "eagle3_train_epochs=60", env=fleet_env(), timeout=1200,
                           check=False)  # fmt: skip
    assert changed.returncode == 0, changed.stdout[-4000:]
    restart = r"TASK \[eagle3.ops.eagle3_train : Restart the running job with its changed unit.*\n"
    assert re.search(restart + r"changed: \[ct13[12]\]\nchanged: \[ct13[12]\]", changed.stdout), changed.stdout[-4000:]
    for host in TRAINERS:
        assert main_pid(host) not in ("0", pids[host]), f"{host}'s launcher was not restarted"
        running = trainer(host, "systemctl", "show", "-p", "ExecStart", "eagle3-train").stdout
        assert " --epochs 60 " in running, running  # what systemd runs now, not only the file on disk
    deadline = time.monotonic() + 180  # the new attempt forms over both nodes: the same attempt runs on each
    while time.monotonic() < deadline and not (
            running_attempt(states["ct131"]) is not None
            and running_attempt(states["ct131"]) == running_attempt(states["ct132"])):  # fmt: skip
        time.sleep(0.5)
    attempts = {h: json.loads(p.read_text()) for h, p in states.items()}
    assert running_attempt(states["ct131"]) == running_attempt(states["ct132"]) > tried, attempts
    assert all(both_hold_their_gpu()), "the restarted job's ranks never held both GPUs"

    # 2. Cleanup of one trainer stops the job on every node it spans.
    # The job's unit starts at boot on both nodes (a node that comes back rejoins it); its cleanup must undo that.
    assert all(trainer(h, "systemctl", "is-enabled", "eagle3-train").stdout.strip() == "enabled" for h in TRAINERS)
    proc = run_playbook("cleanup.yml", "--limit", "ct131", env=fleet_env(), timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "(item=eagle3-train.service on ct132)" in proc.stdout
    assert "and disable it: it starts at boot" in flat(proc.stdout)  # the dry run says so before the stop
    for host in TRAINERS:
        assert trainer(host, "systemctl", "is-active", "eagle3-train", check=False).stdout.strip() == "inactive"
        assert trainer(host, "systemctl", "is-enabled", "eagle3-train", check=False).stdout.strip() == "disabled"
        assert trainer(host, "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout.strip() == ""


def test_cleanup_stops_a_multi_node_job_here_when_its_other_node_is_dead(fleet_run):
    # The job runs over both trainers; ct132's container dies (its node's hop still answers). A cleanup of ct131 must
    # stop the job there - a delegated task that finds ct132 unreachable would otherwise take ct131 out of the run
    # before its own stop - and say that ct132's part was not told to stop.
    train_dir = f"{FLEET_RUN}/train-dead-peer"
    run = run_playbook("train.yml", *TRAIN, "--tags", "train", "-e", "eagle3_train_wait=false", "-e",
                       f"eagle3_train_dir={train_dir}", "-e", "eagle3_train_epochs=50", env=fleet_env(), timeout=1200,
                       check=False)  # fmt: skip
    assert run.returncode == 0, run.stdout[-4000:]
    assert all(both_hold_their_gpu()), "the job's ranks never held both GPUs"
    try:
        node_pct("pve-lab2", "stop", "132")  # no clean shutdown: lxc-stop's immediate kill
        proc = run_playbook("cleanup.yml", "--limit", "ct131", env=fleet_env(), timeout=600, check=False)
        out = flat(proc.stdout)
        here = recap(proc.stdout)["ct131"]
        assert here["unreachable"] == 0 and here["failed"] == 0, out[-4000:]
        assert re.search(r"ct131: holders=\d+ .* survivors=0 .*; eagle3-train.service NOT STOPPED on ct132 "
                         r"\(unreachable\)", out), out[-4000:]  # fmt: skip
        assert "WARNING: eagle3-train.service on ct132 could not be told to stop (ct132 is unreachable" in out
        assert trainer("ct131", "systemctl", "is-active", "eagle3-train", check=False).stdout.strip() == "inactive"
        assert trainer("ct131", "systemctl", "is-enabled", "eagle3-train", check=False).stdout.strip() == "disabled"
        assert trainer("ct131", "nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader").stdout.strip() == ""
    finally:
        restart_container("pve-lab2", 132)
        trainer("ct132", "systemctl", "disable", "--now", "eagle3-train", check=False)
        trainer("ct132", "systemctl", "reset-failed", "eagle3-train", check=False)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"ct132": {"eagle3_train_nproc": 3}},
         "The trainers of one job must each run as many processes, but they differ (ct131: 1, ct132: 3 processes"),
        ({"ct132": {"eagle3_address": "10.203.0.31"}},
         "Trainers share an address (ct131: 10.203.0.31, ct132: 10.203.0.31)"),
        ({"ct131": {"eagle3_train_rdzv_host": "10.203.0.99"}, "ct132": {"eagle3_train_rdzv_host": "10.203.0.99"}},
         "The rendezvous address 10.203.0.99 is no trainer"),  # (YAML output doubles the apostrophe)
        ({"ct132": {"eagle3_train_socket_ifname": "eth9"}}, "ct132 has no interface eth9 (eagle3_train_socket_ifname"),
    ],
)
def test_trainers_that_cannot_form_one_job_are_refused_before_anything_starts(fleet, tmp_path, extra, message):
    hosts = tmp_path / "extra.yml"
    hosts.write_text(json.dumps({"all": {"hosts": extra}}))
    train_dir = f"{FLEET_RUN}/train-refused"
    proc = run_playbook("train.yml", "-i", str(FLEET), "-i", str(hosts), *TRAIN, "--tags", "train", "-e",
                        f"eagle3_train_dir={train_dir}", env=fleet_env(), timeout=600, check=False)  # fmt: skip
    assert proc.returncode != 0
    assert message in " ".join(proc.stdout.split()), proc.stdout[-3000:]
    assert not on_share(train_dir).exists()  # refused before the job's directories, unit or start


# --- Serving a fleet: two servers (one per node) behind SGLang's router on ct131 ---

SERVERS = {"ct133": ("pve-lab", 133), "ct134": ("pve-lab2", 134)}
SERVE = ("-e", f"eagle3_run_dir={FLEET_RUN}", "-e", f"eagle3_draft_path={FLEET_RUN}/draft",
         "-e", f"eagle3_draft_source={FLEET_RUN}/train-serve/save/checkpoint_best")  # fmt: skip
ROUTER_URL = "http://10.203.0.31:30080"


def server(host: str, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    node, vmid = SERVERS[host]
    return node_pct(node, "exec", str(vmid), "--", *cmd, check=check)


ASK = r"""
import json, sys, urllib.error, urllib.request
method, url, key, body = sys.argv[1:5]
auth = {"Authorization": "Bearer " + key} if key else {}
req = urllib.request.Request(url, method=method, data=body.encode() or None,
                             headers={"Content-Type": "application/json", **auth})
try:
    with urllib.request.urlopen(req, timeout=20) as resp:
        print(json.dumps({"status": resp.status, "body": resp.read().decode()}))
except urllib.error.HTTPError as exc:
    print(json.dumps({"status": exc.code, "body": exc.read().decode()}))
"""


def in_container(host: str, method: str, url: str, key: str = "", body: str = "") -> dict:
    """One request from inside a container (the bridge is not routed to the lab host): its status and body."""
    node, vmid = (TRAINERS | SERVERS)[host]
    out = node_pct(node, "exec", str(vmid), "--", "python3", "-c", ASK, method, url, key, body).stdout
    return json.loads(out.strip().splitlines()[-1])


def in_container_json(host: str, url: str, key: str = "") -> dict:
    """GET url from inside a container as JSON (200 expected)."""
    got = in_container(host, "GET", url, key)
    assert got["status"] == 200, got
    return json.loads(got["body"])


def served_tokens(host: str) -> int | None:
    info = in_container_json(host, f"http://{IPS[int(host[2:])]}:30000/get_server_info", serving_keys(FLEET)["api"])
    return info["speculative_num_draft_tokens"]


def router_workers() -> dict[str, dict]:
    listed = in_container_json("ct131", ROUTER_URL + "/workers", serving_keys(FLEET)["admin"])
    return {w["url"]: w for w in listed["workers"]}


LAB_PROMPTS = ROOT / "eagle3_ops" / "payloads" / "lab_target" / "prompts.jsonl"  # the corpus the lab's data stage reads


def user_turn() -> str:
    """One user turn in the tiny target's chat template (lab_target's CHAT_TEMPLATE, as its server applies it), {} for
    the prompt."""
    import jinja2

    from eagle3_ops.payloads.lab_target.tiny_target import CHAT_TEMPLATE

    turn = [{"role": "user", "content": "{}"}]
    return jinja2.Environment(autoescape=False).from_string(CHAT_TEMPLATE).render(messages=turn,  # noqa: S701 - text
                                                                                  add_generation_prompt=True)


# The load's pace: several requests in every second of a rollout (a server's restart gap is seconds long), a canary's
# window of 12 requests on ct133 filled in a few seconds - not the servers' whole capacity (about 25 requests a second
# unpaced, both servers' CPU, which the deploy under test and the other workers' tests share on a 2-core machine).
LOAD_RATE = 6


class Load:
    """tests/integration/loadgen.py in ct131, through the router, for the length of a rollout, at LOAD_RATE requests a
    second."""

    def __init__(self, name: str) -> None:
        self.dir = on_share(f"{FLEET_RUN}/load-{name}")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir(parents=True)
        shutil.copy(ROOT / "tests" / "integration" / "loadgen.py", self.dir / "loadgen.py")
        shutil.copy(LAB_PROMPTS, self.dir / "prompts.jsonl")
        inside = f"{FLEET_RUN}/load-{name}"
        self.proc = subprocess.Popen(
            [PCT, "exec", "131", "--", "python3", f"{inside}/loadgen.py", "--url", "http://127.0.0.1:30080",
             "--concurrency", "2", "--rate", str(LOAD_RATE), "--stop", f"{inside}/stop",
             "--out", f"{inside}/records.json", "--key", serving_keys(FLEET)["api"], "--prompts",
             f"{inside}/prompts.jsonl", "--format", user_turn()],
            env=dict(os.environ, EAGLE3_LAB_NODE="pve-lab"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)  # fmt: skip

    def stop(self) -> list[dict]:
        (self.dir / "stop").touch()
        out, _ = self.proc.communicate(timeout=300)
        assert self.proc.returncode == 0, out
        return json.loads((self.dir / "records.json").read_text())


def rate(records: list[dict], t0: float, t1: float) -> float:
    """Requests completed per second between t0 and t1."""
    return sum(1 for r in records if t0 <= r["end"] < t1 and r["status"] == 200) / max(t1 - t0, 1e-9)


@pytest.fixture(scope="module")
def fleet_served(fleet_run):
    """Both servers serve a drafter at 3 draft tokens behind the router (the first deploy installs the servers'
    runtimes and the router; with nothing served yet there is no capacity to keep, so both servers form one batch,
    eagle3_rollout_batch=2, the rolling switch below takes them one at a time). The drafter: the fleet's data trained
    on ct131 for 15 epochs, as the one-node lab's is (the fleet tests' 3 epochs accept nothing and the accept-length
    gate refuses them)."""
    train = run_playbook("train.yml", *TRAIN, "--limit", "ct131", "-e", "eagle3_train_epochs=15", "-e",
                         f"eagle3_train_dir={FLEET_RUN}/train-serve", "-e", '{"eagle3_train_hosts": ["ct131"]}',
                         env=fleet_env(), timeout=1800, check=False)  # fmt: skip
    assert train.returncode == 0, train.stdout[-5000:]
    proc = run_playbook("deploy.yml", *SERVE, "-e", "draft_tokens=3", "-e", "eagle3_rollout_batch=2", env=fleet_env(),
                        timeout=2400, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:]
    # one batch of both servers: the play's tasks ran once for the two of them
    assert len(re.findall(r"PLAY \[Switch the servers one batch at a time\]", proc.stdout)) == 1, proc.stdout[-6000:]
    yield proc
    for host in SERVERS:
        server(host, "systemctl", "disable", "--now", "sglang", check=False)
    trainer("ct131", "systemctl", "disable", "--now", "sglang-router", check=False)


def test_the_router_routes_to_both_servers_and_status_shows_its_view(fleet_served):
    workers = router_workers()
    assert set(workers) == {"http://10.203.0.33:30000", "http://10.203.0.34:30000"}
    assert all(w["is_healthy"] for w in workers.values())
    assert [served_tokens(h) for h in SERVERS] == [3, 3]
    unit = trainer("ct131", "systemctl", "cat", "sglang-router").stdout
    keys = serving_keys(FLEET)
    assert "smg launch" in unit and not any(k in unit for k in keys.values())
    keyed = "--api-key ${EAGLE3_API_KEY} --control-plane-api-keys eagle3-ops:deployer:admin:${EAGLE3_ADMIN_API_KEY}"
    assert keyed in unit
    env_file = trainer("ct131", "stat", "-c", "%a %U", "/etc/eagle3-ops/sglang-router.env").stdout
    assert env_file.split() == ["600", "root"]
    assert "--worker-urls http://10.203.0.33:30000 http://10.203.0.34:30000" in unit
    assert "--health-check-interval-secs 10" in unit  # smg's own default (60 s) would list a dead server for minutes
    # eagle3-ops status: the setting each server runs and the router's view of them
    status = subprocess.run([sys.executable, "-m", "eagle3_ops.cli", "status", "-i", str(FLEET)], cwd=ROOT,
                            env=dict(fleet_env(), EAGLE3_OPS_RUNS=str(ROOT / "artifacts" / "test")),
                            capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
    assert status.returncode == 0, status.stdout + status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if line.startswith("ct13")}
    assert all(re.search(r"draft@[0-9a-f]{8} x3 accept \d", rows[h]) for h in SERVERS), status.stdout
    assert "router on ct131: 2 server(s)" in status.stdout
    assert re.search(r"http://10\.203\.0\.33:30000  healthy  ready", status.stdout), status.stdout


def test_a_container_on_the_bridge_without_the_keys_steers_nothing_and_is_served_nothing(fleet_served):
    """ct132 (a trainer on the other node, on the servers' bridge) tries the router's control plane and the servers'
    API without the keys, and with the wrong one: every call is refused, the router's workers are unchanged; with the
    keys (the api key for the data plane, the admin key for /workers) everything answers."""
    keys, before = serving_keys(FLEET), router_workers()
    some_id = next(iter(before.values()))["id"]
    tries = {
        "add a worker": ("POST", ROUTER_URL + "/workers", json.dumps({"url": "http://10.203.0.32:30000"})),
        "remove a worker": ("DELETE", f"{ROUTER_URL}/workers/{some_id}", ""),
        "list the workers": ("GET", ROUTER_URL + "/workers", ""),
        "generate through the router": ("POST", ROUTER_URL + "/generate", '{"text": "hi"}'),
        "generate on a server": ("POST", "http://10.203.0.33:30000/generate", '{"text": "hi"}'),
        "read a server's info": ("GET", "http://10.203.0.34:30000/get_server_info", ""),
    }
    for what, (method, url, body) in tries.items():
        for key in ("", "x" * 40):
            got = in_container("ct132", method, url, key, body)
            assert got["status"] in (401, 403), (what, key and "wrong key", got)
    # the data plane's key opens no control plane, the admin key no data plane
    assert in_container("ct132", "DELETE", f"{ROUTER_URL}/workers/{some_id}", keys["api"])["status"] == 401
    assert in_container("ct132", "POST", ROUTER_URL + "/generate", keys["admin"], '{"text": "hi"}')["status"] == 401
    assert router_workers().keys() == before.keys() and all(w["is_healthy"] for w in router_workers().values())
    served = in_container("ct132", "POST", ROUTER_URL + "/generate", keys["api"],
                          json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 4, "temperature": 0}}))
    assert served["status"] == 200 and json.loads(served["body"])["text"], served


def test_a_rolling_switch_under_load_fails_no_request(fleet_served):
    load = Load("switch")
    time.sleep(5)
    t0 = time.time()
    proc = run_playbook("deploy.yml", *SERVE, "-e", "draft_tokens=5", env=fleet_env(), timeout=1800, check=False)
    t1 = time.time()
    time.sleep(5)
    records = load.stop()
    assert proc.returncode == 0, proc.stdout[-6000:]
    failed = [r for r in records if r["status"] != 200]
    assert not failed, failed[:5]
    assert [served_tokens(h) for h in SERVERS] == [5, 5]
    assert all(w["is_healthy"] for w in router_workers().values()) and len(router_workers()) == 2
    # One server at a time: ct133 left, came back, then ct134 left.
    out = proc.stdout
    left = [m.start() for m in re.finditer(r"TASK \[eagle3\.ops\.sglang_router : Take the server out", out)]
    assert len(left) == 2, out[-4000:]
    before, during = rate(records, t0 - 5, t0), rate(records, t0, t1)
    print(f"rolling switch: {len(records)} requests paced at {LOAD_RATE}/s, 0 failed; {before:.2f} req/s served "
          f"before, {during:.2f} during over {t1 - t0:.0f} s")  # fmt: skip
    record_figure("rolling switch under load (keyed)", requests=len(records), failed=0, paced_rps=LOAD_RATE,
                  before_rps=round(before, 3), during_rps=round(during, 3), seconds=round(t1 - t0, 1))  # fmt: skip
    assert during > 0


def test_a_server_that_fails_its_gate_is_rolled_back_and_the_rollout_stops(fleet_served):
    units = {h: server(h, "cat", "/etc/systemd/system/sglang.service").stdout for h in SERVERS}
    load = Load("rollback")
    time.sleep(3)
    proc = run_playbook("deploy.yml", *SERVE, "-e", "draft_tokens=4", "-e", "sglang_serve_min_accept_length=50",
                        env=fleet_env(), timeout=1800, check=False)  # fmt: skip
    time.sleep(3)
    records = load.stop()
    assert proc.returncode != 0
    text = " ".join(proc.stdout.split())
    assert "ct133" in recap(proc.stdout) and recap(proc.stdout)["ct133"]["failed"] == 1, proc.stdout[-4000:]
    assert "Rolled back to the previous unit (previous service restored, healthy" in text
    assert "back behind the router" in text
    assert "ct134" not in recap(proc.stdout) or recap(proc.stdout)["ct134"]["changed"] == 0
    assert [r for r in records if r["status"] != 200] == []
    assert {h: server(h, "cat", "/etc/systemd/system/sglang.service").stdout for h in SERVERS} == units
    assert [served_tokens(h) for h in SERVERS] == [5, 5]
    assert len(router_workers()) == 2 and all(w["is_healthy"] for w in router_workers().values())


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def draft_record() -> dict:
    """The draft root's versions.json: the version each server serves, current and previous."""
    return json.loads(on_share(f"{FLEET_RUN}/draft/versions.json").read_text())


def unit_draft(host: str) -> str:
    unit = server(host, "cat", "/etc/systemd/system/sglang.service").stdout
    return re.search(r"--speculative-draft-model-path (\S+)", unit).group(1)


PROBE = ["Explain speculative decoding in two sentences.", "List the steps of checkpoint resumption briefly.",
         "Describe grouped query attention for a new engineer."]  # fmt: skip


def probe(host: str) -> list[tuple[str, int]]:
    """Three greedy requests straight to a server: each answer and its verify steps, which depend on the draft's
    weights (the text does not: decoding is lossless)."""
    out = []
    for prompt in PROBE:
        body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": 24, "temperature": 0}})
        url = f"http://{IPS[int(host[2:])]}:30000/generate"
        got = in_container(host, "POST", url, serving_keys(FLEET)["api"], body)
        assert got["status"] == 200, got
        answer = json.loads(got["body"])
        out.append((answer["text"], answer["meta_info"]["spec_verify_ct"]))
    return out


def healthy_behind_the_router(seconds: float = 180) -> None:
    """Every server answers its own /health again, and the router lists both healthy."""
    deadline = time.monotonic() + seconds
    for host in SERVERS:
        code = "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=5)"
        while server(host, "python3", "-c", code, f"http://{IPS[int(host[2:])]}:30000/health", check=False).returncode:
            assert time.monotonic() < deadline, f"{host} did not answer /health again"
            time.sleep(2)
    while True:
        with contextlib.suppress(AssertionError, json.JSONDecodeError):
            workers = router_workers()
            if len(workers) == 2 and all(w["is_healthy"] for w in workers.values()):
                return
        assert time.monotonic() < deadline, "the servers did not come back healthy behind the router"
        time.sleep(2)


def test_a_new_draft_is_a_version_of_its_own_rolled_back_whole_and_an_older_source_served_again(fleet_served):
    """Another epoch of the serving run (older than the draft on disk) is exported as a new immutable version. With a
    gate it cannot pass, the first server restarts on it, fails, and is restored to the old version's unit: the old
    weights are served (the same answers and verify steps), also after a restart, and nothing of the old version or
    of the record changed. With a gate it passes, both servers move to it one at a time; the older source deployed
    again is its old version again, untouched; a rerun converges."""
    save = on_share(f"{FLEET_RUN}/train-serve/save")
    best = (save / "checkpoint_best").resolve()
    other = min((p for p in save.iterdir() if p.name.isdigit() and p.resolve() != best), key=lambda p: int(p.name))
    with_other = ("-e", f"eagle3_run_dir={FLEET_RUN}", "-e", f"eagle3_draft_path={FLEET_RUN}/draft",
                  "-e", f"eagle3_draft_source={FLEET_RUN}/train-serve/save/{other.name}", "-e", "draft_tokens=5")
    root = on_share(f"{FLEET_RUN}/draft")
    old = draft_record()["current"]
    old_path = f"{FLEET_RUN}/draft/{old}"
    assert draft_record()["servers"] == dict.fromkeys(SERVERS, old)
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, old_path)
    weights = sha256(root / old / "model.safetensors")
    before = {h: probe(h) for h in SERVERS}
    assert before["ct133"] == before["ct134"]

    failed = run_playbook("deploy.yml", *with_other, "-e", "sglang_serve_min_accept_length=50", env=fleet_env(),
                          timeout=1800, check=False)  # fmt: skip
    text = " ".join(failed.stdout.split())
    assert failed.returncode != 0 and recap(failed.stdout)["ct133"]["failed"] == 1, failed.stdout[-4000:]
    new = next(d.name for d in root.iterdir() if d.is_dir() and d.name not in (old,) and not d.name.startswith("."))
    assert "Rolled back to the previous unit (previous service restored, healthy" in text
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, old_path)
    assert sha256(root / old / "model.safetensors") == weights
    assert draft_record()["current"] == old and draft_record()["servers"] == dict.fromkeys(SERVERS, old)
    assert probe("ct133") == before["ct133"]
    server("ct133", "systemctl", "restart", "sglang")
    healthy_behind_the_router()
    assert probe("ct133") == before["ct133"]

    # (the first epoch may accept little: a gate every draft passes - the version is what this proves)
    promoted = run_playbook("deploy.yml", *with_other, "-e", "sglang_serve_min_accept_length=1.0", env=fleet_env(),
                            timeout=1800, check=False)  # fmt: skip
    assert promoted.returncode == 0, promoted.stdout[-4000:]
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, f"{FLEET_RUN}/draft/{new}")
    record = draft_record()
    assert (record["current"], record["previous"], record["servers"]) == (new, old, dict.fromkeys(SERVERS, new))
    after = {h: probe(h) for h in SERVERS}
    assert [t for t, _ in after["ct133"]] == [t for t, _ in before["ct133"]]  # lossless: the same text
    loaded = in_container_json("ct133", "http://10.203.0.33:30000/get_server_info", serving_keys(FLEET)["api"])
    assert loaded["speculative_draft_model_path"] == f"{FLEET_RUN}/draft/{new}"  # the engine loaded the new version
    left = [m.start() for m in re.finditer(r"TASK \[eagle3\.ops\.sglang_router : Take the server out", promoted.stdout)]
    assert len(left) == 2  # one server at a time

    back = run_playbook("deploy.yml", *SERVE, "-e", "draft_tokens=5", env=fleet_env(), timeout=1800, check=False)
    assert back.returncode == 0, back.stdout[-4000:]
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, old_path)
    assert sha256(root / old / "model.safetensors") == weights
    assert (draft_record()["current"], draft_record()["previous"]) == (old, new)
    assert {h: probe(h) for h in SERVERS} == before
    again = run_playbook("deploy.yml", *SERVE, "-e", "draft_tokens=5", env=fleet_env(), timeout=900, check=False)
    assert again.returncode == 0 and all(recap(again.stdout)[h]["changed"] == 0 for h in SERVERS), again.stdout[-3000:]


def test_a_canary_draft_is_judged_by_its_live_accept_length_under_real_traffic(fleet_served):
    """-e draft_canary=true under load through the router: a draft that drafts nothing right (the serving run's first
    epoch with its lm_head negated: it proposes what it rates least likely) on ct133 alone, compared with ct134 (the
    best epoch) over the same traffic, is rolled back, naming both figures, and ct134 is never touched; with both
    servers on the first epoch, the best epoch's canary is promoted and reaches ct134 too. No request fails either
    way. (The tiny lab's first epoch drafts within the canary's 5 % of its best, and a zeroed head proposes the most
    frequent token, which the tiny target emits often: neither is a worse draft there.)"""
    save = on_share(f"{FLEET_RUN}/train-serve/save")
    best = (save / "checkpoint_best").resolve()
    first = min((p for p in save.iterdir() if p.name.isdigit() and p.resolve() != best), key=lambda p: int(p.name))
    worse = on_share(f"{FLEET_RUN}/worse-draft")
    shutil.rmtree(worse, ignore_errors=True)
    shutil.copytree(first, worse)
    negate_lm_head(worse)
    worse_draft = ("-e", f"eagle3_run_dir={FLEET_RUN}", "-e", f"eagle3_draft_path={FLEET_RUN}/draft",
                   "-e", f"eagle3_draft_source={FLEET_RUN}/worse-draft")
    first_epoch = ("-e", f"eagle3_run_dir={FLEET_RUN}", "-e", f"eagle3_draft_path={FLEET_RUN}/draft",
                   "-e", f"eagle3_draft_source={FLEET_RUN}/train-serve/save/{first.name}")
    # a small window for the lab's traffic; every draft passes the gate (a draft that guesses nothing still verifies
    # one token a step), so only the canary decides
    canary = ("-e", "draft_canary=true", "-e", "eagle3_canary_requests=12", "-e", "eagle3_canary_min_requests=6",
              "-e", "sglang_serve_min_accept_length=0.5", "-e", "draft_tokens=5")
    best_draft = unit_draft("ct134")
    ct134_unit = server("ct134", "cat", "/etc/systemd/system/sglang.service").stdout

    proc, text, took, records = deploy_under_load("canary-worse", *worse_draft, *canary)
    assert proc.returncode != 0 and recap(proc.stdout)["ct133"]["failed"] == 1, (canary_said(text), proc.stdout[-4000:])
    said = re.search(r"Canary ct133 with (\S+): accept length ([\d.]+) against the others' ([\d.]+) \(-[\d.]+ %\), "
                     r"more than 5 % below over (\d+) request\(s\)", text)  # fmt: skip
    assert said and said.group(1) != best_draft and float(said.group(2)) < float(said.group(3)), text[-3000:]
    assert int(said.group(4)) >= 6
    window = re.search(r"in ([\d.]+) s - rolled back", text)
    record_figure("canary rolled back", canary=float(said.group(2)), others=float(said.group(3)),
                  requests=int(said.group(4)), window_s=float(window.group(1)) if window else None,
                  deploy_s=round(took, 1), load_requests=len(records))  # fmt: skip
    assert f"it serves the draft of the others, {best_draft}, again" in text
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, best_draft)
    assert server("ct134", "cat", "/etc/systemd/system/sglang.service").stdout == ct134_unit
    assert [r for r in records if r["status"] != 200] == []
    healthy_behind_the_router()

    both = run_playbook("deploy.yml", *first_epoch, "-e", "draft_tokens=5", "-e", "sglang_serve_min_accept_length=1.0",
                        env=fleet_env(), timeout=1800, check=False)  # fmt: skip
    assert both.returncode == 0, both.stdout[-4000:]
    first_draft = unit_draft("ct134")
    assert first_draft != best_draft and unit_draft("ct133") == first_draft

    proc, text, took, records = deploy_under_load("canary-better", *SERVE, *canary)
    assert proc.returncode == 0, (canary_said(text), proc.stdout[-4000:])
    said = re.search(rf"Canary ct133 with {re.escape(best_draft)}: accept length ([\d.]+) against the others' "
                     r"([\d.]+) \([-+][\d.]+ %\), not more than 5 % below over (\d+) request\(s\) in ([\d.]+) s - "
                     r"promoted", text)  # fmt: skip
    assert said and float(said.group(1)) >= float(said.group(2)), text[-3000:]
    record_figure("canary promoted", canary=float(said.group(1)), others=float(said.group(2)),
                  requests=int(said.group(3)), window_s=float(said.group(4)), deploy_s=round(took, 1),
                  load_requests=len(records))  # fmt: skip
    assert {h: unit_draft(h) for h in SERVERS} == dict.fromkeys(SERVERS, best_draft)
    assert [r for r in records if r["status"] != 200] == []
    assert [served_tokens(h) for h in SERVERS] == [5, 5]


def deploy_under_load(name: str, *args: str) -> tuple[subprocess.CompletedProcess[str], str, float, list[dict]]:
    """deploy.yml with ARGS while the load generator NAME runs through the router: the run, its output on one line
    (YAML's quoted quote in the callback's output undone), the seconds it took and the load's records."""
    load = Load(name)
    started = time.monotonic()
    proc = run_playbook("deploy.yml", *args, env=fleet_env(), timeout=1800, check=False)
    took = time.monotonic() - started
    return proc, " ".join(proc.stdout.split()).replace("''", "'"), took, load.stop()


def canary_said(text: str) -> list[str]:
    """What the canary's deploy said about it (its sentence, with the figures), for a failure's message."""
    return re.findall(r"Canary ct\d+ .*?(?:promoted|rolled back|goes on)\.", text)


def negate_lm_head(checkpoint: Path) -> None:
    """Negate the draft's lm_head in place in a speculators checkpoint's safetensors (the sign bit of each bf16, f16 or
    f32 value): it proposes the token its training rated least likely. (A zeroed head is no worse draft here: its
    argmax is draft id 0, the most frequent token, which the tiny target emits often.)"""
    for path in checkpoint.glob("*.safetensors"):
        with open(path, "r+b") as fh:
            size = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(size))
            for key, meta in header.items():
                if key.endswith("lm_head.weight"):
                    width = {"BF16": 2, "F16": 2, "F32": 4}[meta["dtype"]]
                    start, end = meta["data_offsets"]
                    fh.seek(8 + size + start)
                    data = bytearray(fh.read(end - start))
                    data[width - 1 :: width] = bytes(b ^ 0x80 for b in data[width - 1 :: width])
                    fh.seek(8 + size + start)
                    fh.write(data)


def refused_before_restart(message: str, *args: str) -> None:
    """deploy.yml with ARGS fails saying MESSAGE, and no server's unit changed."""

    def units() -> dict[str, str]:
        return {h: server(h, "stat", "-c", "%Y", "/etc/systemd/system/sglang.service").stdout for h in SERVERS}

    before = units()
    proc = run_playbook("deploy.yml", *SERVE, *args, env=fleet_env(), timeout=900, check=False)
    assert proc.returncode != 0
    assert message in " ".join(proc.stdout.split()).replace("''", "'"), proc.stdout[-3000:]
    assert units() == before


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "eagle3_router_url=http://10.203.0.99:30080"],
         "ct133, ct134 cannot reach the router at http://10.203.0.99:30080"),
        (["-e", "sglang_serve_host=127.0.0.1"],
         "ct133 binds its server to 127.0.0.1 (sglang_serve_host), which the router on ct131 cannot reach"),
    ],
)
def test_a_router_the_servers_cannot_use_is_refused_before_anything_restarts(fleet_served, extra, message):
    served = [served_tokens(h) for h in SERVERS]
    refused_before_restart(message, "-e", "draft_tokens=6", *extra)
    assert [served_tokens(h) for h in SERVERS] == served and None not in served


AUTO = ("-e", "draft_tokens=auto", "-e", "eagle3_auto_prompts=/srv/eagle3/prompts/lab-prompts.jsonl", "-e",
        '{"eagle3_auto_space": [3, 5]}', "-e", "eagle3_auto_num_prompts=8",
        "-e", "eagle3_auto_concurrency=2")  # fmt: skip


def test_draft_tokens_auto_benchmarks_chooses_deploys_and_keeps_its_choice(fleet_served):
    reports = LAB_STATE / "reports"
    shutil.rmtree(reports / "auto", ignore_errors=True)
    first = run_playbook("deploy.yml", *SERVE, *AUTO, "-e", "eagle3_auto_max_tokens=32", env=fleet_env(), timeout=2400,
                         check=False)  # fmt: skip
    assert first.returncode == 0, first.stdout[-6000:]
    kept = json.loads(next((reports / "auto").glob("choice-*.json")).read_text())
    choice, report = kept["choice"], Path(kept["report"])
    table = (report / "bench.md").read_text()
    assert (report / "bench.png").stat().st_size > 0 and "(chosen)" in table and choice["sentence"] in table
    # The pick is the sweep's best output throughput at concurrency 2, or no speculation if none beat the baseline.
    points = [p for p in json.loads((report / "bench.json").read_text())["points"] if p["max_concurrency"] == 2]
    assert sorted(p["label"] for p in points) == ["3", "5", "baseline"]
    best = max((p for p in points if p["draft_tokens"]), key=lambda p: p["output_throughput"])
    base = next(p for p in points if p["draft_tokens"] is None)
    want = best["draft_tokens"] if best["output_throughput"] > base["output_throughput"] else None
    assert choice["draft_tokens"] == want and choice["speculative"] is (want is not None)
    assert [served_tokens(h) for h in SERVERS] == [want, want]
    assert len(router_workers()) == 2 and all(w["is_healthy"] for w in router_workers().values())
    # The same draft, target and workload again: every server's fingerprint matches, nothing runs at all.
    again = run_playbook("deploy.yml", *SERVE, *AUTO, "-e", "eagle3_auto_max_tokens=32", env=fleet_env(),
                         timeout=600, check=False)  # fmt: skip
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(f"deploy on {h}: nothing to do" in " ".join(again.stdout.split()) for h in SERVERS), again.stdout[-3000:]
    assert "Measure the configuration" not in again.stdout
    # Forced past the fingerprints: the choice is kept, nothing is benchmarked or restarted.
    forced = run_playbook("deploy.yml", *SERVE, *AUTO, "-e", "eagle3_auto_max_tokens=32", "-e", "eagle3_force=true",
                          env=fleet_env(), timeout=1200, check=False)  # fmt: skip
    assert forced.returncode == 0, forced.stdout[-4000:]
    assert "nothing benchmarked" in forced.stdout and "Measure the configuration" not in forced.stdout
    assert all(c["changed"] == 0 for c in recap(forced.stdout).values()), forced.stdout[-3000:]
    # Another workload (fewer prompts per setting) has no kept choice: check mode says it would benchmark again.
    other = run_playbook("deploy.yml", "--check", *SERVE, *AUTO, "-e", "eagle3_auto_max_tokens=32", "-e",
                         "eagle3_auto_num_prompts=4", env=fleet_env(), timeout=1200, check=False)  # fmt: skip
    assert other.returncode == 0, other.stdout[-4000:]
    assert "Would benchmark the baseline and 2 settings on ct133" in " ".join(other.stdout.split())
    assert "Measure the configuration" not in other.stdout
    assert [served_tokens(h) for h in SERVERS] == [want, want]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["-e", "eagle3_auto_prompts=", "-e", "spec_bench_prompts="],
         "draft_tokens=auto benchmarks the workload the servers will see, but no prompts are given"),
        (["-e", '{"eagle3_auto_space": [5, {"draft_tokens": 8, "steps": 3}]}'],
         "search space entry 2 ({'draft_tokens': 8, 'steps': 3}): chain drafting (topk 1) verifies steps + 1 tokens"),
        (["-e", '{"eagle3_auto_space": [{"draft_tokens": 8, "topk": 2, "steps": 3}]}'],
         "the lab's reference engine drafts chains only"),
    ],
)
def test_draft_tokens_auto_refuses_bad_input_before_anything_restarts(fleet_served, extra, message):
    refused_before_restart(message, *AUTO, *extra)
