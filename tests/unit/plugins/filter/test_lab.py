"""The lab's fingerprint probes: a live daemon (its pid file and port) holds, a dead one or a missing container does
not, and each hop's directory is the one the build writes (roles/lab_host/tasks/sshd_node.yml)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest
from ansible_collections.eagle3.ops.plugins.filter.lab import (
    lab_container_paths,
    lab_containers,
    lab_probes,
    lab_sshd_dir,
)
from ansible_collections.eagle3.ops.plugins.module_utils._stamp import failed_probe

from tests.modules import ROOT


def test_a_container_takes_its_node_gpus_name_and_address_from_the_inventory_or_the_defaults():
    hostvars = {
        "trainer": {"pct_vmid": "129", "lab_gpu_count": 2, "pct_node": "pve-lab2", "lab_hostname": "trainer",
                    "lab_ip": "10.203.0.10"},
        "bare": {"pct_vmid": 131},
        "typo": {"pct_vmid": "12x", "lab_gpu_count": "two"},
    }  # fmt: skip
    assert lab_containers(["trainer", "bare", "typo"], hostvars, "pve-lab") == [
        {"host": "trainer", "vmid": 129, "node": "pve-lab2", "gpus": 2, "hostname": "trainer", "ip": "10.203.0.10"},
        {"host": "bare", "vmid": 131, "node": "pve-lab", "gpus": 0, "hostname": "ct131", "ip": ""},
        # Left as given for the role's preflight to name (it checks pct_vmid and lab_gpu_count first).
        {"host": "typo", "vmid": "12x", "node": "pve-lab", "gpus": "two", "hostname": "ct12x", "ip": ""},
    ]


def test_each_node_has_its_own_hop_directory_and_the_first_keeps_the_one_node_labs():
    assert lab_sshd_dir("pve-lab", "/var/lib/l", "pve-lab") == "/var/lib/l/sshd"
    assert lab_sshd_dir("pve-lab2", "/var/lib/l", "pve-lab") == "/var/lib/l/sshd-pve-lab2"
    daemon = (ROOT / "roles" / "lab_host" / "tasks" / "sshd_node.yml").read_text()
    assert 'pidfile: "{{ _lab_host_sshd_dir }}/sshd.pid"' in daemon and "eagle3.ops.lab_sshd_dir" in (
        ROOT / "roles" / "lab_host" / "vars" / "main.yml").read_text()  # fmt: skip


def test_a_container_is_looked_at_in_its_overlay_and_in_a_rootfs_of_its_own():
    paths = lab_container_paths([129], "/var/lib/lxc")
    assert "/var/lib/lxc/129/delta0/usr/bin/nvidia-smi" in paths
    assert "/var/lib/lxc/129/rootfs/usr/bin/nvidia-smi" in paths
    built = (ROOT / "roles" / "lab_host" / "tasks" / "container.yml").read_text()
    for name in ("/usr/bin/nvidia-smi", "/usr/local/bin/lab-workload", "/etc/systemd/system.conf.d/eagle3-lab.conf"):
        assert name in built, name  # the files the build writes into a container


@pytest.mark.skipif(not shutil.which("ss") or not shutil.which("pgrep"), reason="needs iproute2's ss and procps")
def test_the_probes_hold_for_a_live_daemon_and_name_a_dead_one(tmp_path):
    root = tmp_path / "lab"
    hop = root / "sshd"
    hop.mkdir(parents=True)
    (root / "pveapi").mkdir()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    # A stand-in daemon whose command line names its config, as the hop's sshd does (-f .../sshd_config).
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{hop}/sshd_config"])
    try:
        (hop / "sshd.pid").write_text(f"{proc.pid}\n")
        probes = lab_probes([["pve-lab", port]], str(root), "pve-lab", port, [], "/var/lib/lxc")
        assert [p["name"] for p in probes] == [
            "the hop of pve-lab (lab sshd) runs", f"the hop of pve-lab (lab sshd) listens on port {port}",
            "the lab Proxmox API runs", f"the lab Proxmox API listens on port {port}"]  # fmt: skip
        assert failed_probe(probes[:2]) == ""
        assert failed_probe(probes).startswith("the lab Proxmox API runs does not hold (pgrep exited ")
    finally:
        proc.kill()
        proc.wait()
        sock.close()
    assert failed_probe(probes[:2]).startswith("the hop of pve-lab (lab sshd) runs does not hold (pgrep exited 1")
    (hop / "sshd.pid").unlink()  # a daemon that stopped cleanly removes its pid file: pgrep's error, not its usage hint
    assert failed_probe(probes[:1]) == ("the hop of pve-lab (lab sshd) runs does not hold "
                                        "(pgrep exited 1: pgrep: pidfile not valid)")
    assert failed_probe(probes[1:2]) == (f"the hop of pve-lab (lab sshd) listens on port {port} does not hold "
                                         "(ss printed 'nothing')")


@pytest.mark.skipif(not shutil.which("lxc-info"), reason="needs LXC")
def test_a_container_that_does_not_exist_does_not_hold(tmp_path):
    probes = lab_probes([], str(tmp_path), "pve-lab", 1, [987654], str(tmp_path / "lxc"), "eagle3-no-bridge")
    container, bridge = probes[-2:]
    assert failed_probe([container]).startswith("CT 987654 runs does not hold (lxc-info exited ")
    assert failed_probe([bridge]).startswith("the bridge eagle3-no-bridge is there does not hold (ip exited ")
