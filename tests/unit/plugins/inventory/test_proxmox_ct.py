"""The proxmox_ct inventory plugin on recorded multi-node API answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.modules import ROOT

os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))

from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import inventory_loader
from ansible_collections.eagle3.ops.plugins.module_utils._pve import PveClient

RECORDED = json.loads((ROOT / "tests" / "data" / "pve_multinode.json").read_text())


class Recorded:
    """Stands in for ProxmoxAPI: answers GETs from the recording."""

    def __call__(self, path: str):
        class Resource:
            def get(self, **params):
                return RECORDED[path.strip("/")]

        return Resource()


def build(tmp_path: Path, extra: str = "", api=None) -> InventoryManager:
    """The inventory from a configuration (plus extra) over recorded answers (or api, a stand-in of the same kind)."""
    cfg = tmp_path / "fleet.proxmox_ct.yml"
    cfg.write_text(
        "plugin: eagle3.ops.proxmox_ct\nurl: https://pve1.example.org:8006\ntoken_id: eagle3\ntoken_secret: x\n"
        "tag_groups: {trainer: trainers, server: servers}\n" + extra
    )
    plugin_cls = inventory_loader.get("eagle3.ops.proxmox_ct", class_only=True)
    original = plugin_cls._api
    plugin_cls._api = lambda self: PveClient(api or Recorded())
    try:
        return InventoryManager(loader=DataLoader(), sources=[str(cfg)])
    finally:
        plugin_cls._api = original


def test_multinode_hosts_reach_their_own_node(tmp_path):
    inv = build(tmp_path)
    hosts = {h.name: h.vars for h in inv.get_hosts()}
    assert sorted(hosts) == ["server-a", "trainer-a", "trainer-b"]  # stopped CT and the VM are left out
    assert hosts["trainer-a"]["ansible_host"] == "10.20.0.11"
    assert hosts["trainer-b"]["ansible_host"] == "10.20.0.12"
    assert hosts["trainer-b"]["pct_node"] == "pve2" and hosts["trainer-b"]["pct_vmid"] == 131
    assert all(v["ansible_connection"] == "eagle3.ops.pct" for v in hosts.values())


def test_groups_from_tags_nodes_and_status(tmp_path):
    inv = build(tmp_path)
    groups = {g: sorted(h.name for h in inv.groups[g].get_hosts()) for g in inv.groups}
    assert groups["trainers"] == ["trainer-a", "trainer-b"]
    assert groups["servers"] == ["server-a"]
    assert groups["gpu8"] == ["trainer-b"]
    assert groups["node_pve2"] == ["server-a", "trainer-b"]
    assert groups["status_running"] == ["server-a", "trainer-a", "trainer-b"]


def test_gpu_count_and_repeated_lxc_lines_kept(tmp_path):
    hosts = {h.name: h.vars for h in build(tmp_path).get_hosts()}
    assert hosts["trainer-a"]["proxmox_gpu_count"] == 4
    assert hosts["trainer-b"]["proxmox_gpu_count"] == 8
    assert hosts["server-a"]["proxmox_gpus"] == [4]
    lxc = hosts["trainer-a"]["proxmox_lxc"]
    assert [k for k, _ in lxc][:2] == ["lxc.cgroup2.devices.allow", "lxc.cgroup2.devices.allow"]
    assert lxc[1][1] == "c 509:* rwm" and len(lxc) == 7


def test_overrides_status_filter_and_compose(tmp_path):
    extra = (
        "node_addresses: {pve1: 192.0.2.1}\nstatus: []\nhost_name: vmid\nhypervisor_port: 2222\n"
        "compose:\n  gpus_x2: proxmox_gpu_count * 2\n"
        "keyed_groups:\n  - key: proxmox_gpu_count | string\n    prefix: gpus\n"
    )
    hosts = {h.name: h.vars for h in build(tmp_path, extra).get_hosts()}
    assert sorted(hosts) == ["ct129", "ct131", "ct140", "ct150"]
    assert hosts["ct129"]["ansible_host"] == "192.0.2.1" and hosts["ct129"]["ansible_port"] == 2222
    assert hosts["ct131"]["gpus_x2"] == 16
    inv = build(tmp_path, extra)
    assert sorted(h.name for h in inv.groups["gpus_8"].get_hosts()) == ["ct131"]


def test_each_node_can_have_its_own_ssh_port(tmp_path):
    inv = build(tmp_path, "hypervisor_port: 2200\nnode_ports: {pve2: 2222}\n")
    hosts = {h.name: h.vars for h in inv.get_hosts()}
    assert hosts["trainer-b"]["ansible_port"] == 2222 and hosts["trainer-a"]["ansible_port"] == 2200


def record_warnings(monkeypatch) -> list[str]:
    """The inventory plugins' warnings, each once (ansible's Display shows a repeated warning only once a process)."""
    from ansible.plugins import inventory as inventory_plugins

    seen: list[str] = []
    monkeypatch.setattr(inventory_plugins.display, "warning", lambda msg, *a, **k: seen.append(" ".join(msg.split())))
    return seen


class OfflineNode(Recorded):
    """The recording with node pve2 dead: /cluster/status says so (or, with announced=False, not yet) and the calls
    PVE proxies to it fail as pveproxy answers them (595)."""

    def __init__(self, announced: bool = True) -> None:
        self.announced = announced
        self.asked: list[str] = []

    def __call__(self, path: str):
        from proxmoxer.core import ResourceException

        key = path.strip("/")
        self.asked.append(key)
        announced = self.announced

        class Resource:
            def get(self, **params):
                if key.startswith("nodes/pve2/"):
                    raise ResourceException(595, "Errors during connection establishment", "No route to host")
                if key == "cluster/status" and announced:
                    return [dict(n, online=0) if n.get("name") == "pve2" else n for n in RECORDED[key]]
                if key == "cluster/resources" and announced:
                    return [dict(r, status="unknown") if r.get("node") == "pve2" and r["type"] == "lxc" else r
                            for r in RECORDED[key]]  # fmt: skip
                return RECORDED[key]

        return Resource()


@pytest.mark.parametrize("announced", [True, False], ids=["offline in cluster/status", "died since"])
def test_an_offline_nodes_containers_stay_hosts_with_state_unknown_and_a_warning(tmp_path, monkeypatch, announced):
    """A node that is down must not take the whole inventory with it: its containers stay hosts (so that a
    fleet-wide run names them unreachable), with what the cluster still knows (node, tags) and none of what only the
    node could say (GPUs, lxc lines); the others are as always, and a warning names the node and its containers."""
    api = OfflineNode(announced)
    warnings = record_warnings(monkeypatch)
    inv = build(tmp_path, api=api)
    hosts = {h.name: h.vars for h in inv.get_hosts()}
    assert sorted(hosts) == ["server-a", "trainer-a", "trainer-b"]
    assert hosts["trainer-b"]["proxmox_status"] == "unknown" and hosts["trainer-b"]["proxmox_node_online"] is False
    assert hosts["trainer-b"]["pct_node"] == "pve2" and hosts["trainer-b"]["ansible_host"] == "10.20.0.12"
    assert "proxmox_gpu_count" not in hosts["trainer-b"] and "proxmox_lxc" not in hosts["server-a"]
    assert hosts["trainer-a"]["proxmox_gpu_count"] == 4 and hosts["trainer-a"]["proxmox_node_online"] is True
    groups = {g: sorted(h.name for h in inv.groups[g].get_hosts()) for g in inv.groups}
    assert groups["trainers"] == ["trainer-a", "trainer-b"] and groups["gpu8"] == ["trainer-b"]
    assert groups["status_unknown"] == ["server-a", "trainer-b"] and groups["node_pve2"] == ["server-a", "trainer-b"]
    if announced:  # nothing is asked of a node the cluster reports offline
        assert not [p for p in api.asked if p.startswith("nodes/pve2/")]
    assert len(warnings) == 1
    assert "node pve2 is offline, so the state and configuration of CT 131, CT 140 on it cannot be read" in warnings[0]


def test_a_status_filter_without_unknown_leaves_an_offline_nodes_containers_out_and_says_how_to_keep_them(
        tmp_path, monkeypatch):  # fmt: skip
    warnings = record_warnings(monkeypatch)
    inv = build(tmp_path, "status: [running]\n", api=OfflineNode())
    assert sorted(h.name for h in inv.get_hosts()) == ["trainer-a"]
    assert len(warnings) == 1 and "add unknown to status to have runs name them unreachable" in warnings[0]
