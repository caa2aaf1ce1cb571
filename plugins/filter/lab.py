# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the local lab (roles/lab_host): its containers as the inventory describes them, where a node's hop
keeps its files, and what the lab's fingerprint
(eagle3.ops.stage_stamp's stage "lab") looks at on the lab host - each container's files from the build, and the
probes that say every daemon and container the build started still runs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# What the build puts into each container (roles/lab_host/tasks/container.yml), relative to its root.
CONTAINER_FILES = ("usr/local/lib/nvemu", "usr/bin/nvidia-smi", "usr/local/bin/lab-workload",
                   "etc/systemd/system.conf.d/eagle3-lab.conf")  # fmt: skip


def _number(value: Any) -> Any:
    # A whole number as an int; anything else as given, for the role's preflight to name.
    return int(value) if str(value).strip().isdigit() else value


def lab_containers(hosts: Sequence[str], hostvars: Mapping[str, Any], primary: str) -> list[dict[str, Any]]:
    """Each lab container as the build and the lab's fingerprint read it from the inventory: its host, VMID
    (pct_vmid), node (pct_node, else the lab host's ``primary``), GPUs (lab_gpu_count, else 0), hostname (lab_hostname,
    else ct<VMID>) and address on the lab's bridge (lab_ip, else '')."""
    containers = []
    for host in hosts:
        found = hostvars[host]
        vmid = found.get("pct_vmid")
        containers.append({
            "host": host, "vmid": None if vmid is None else _number(vmid),
            "node": str(found.get("pct_node") or primary), "gpus": _number(found.get("lab_gpu_count", 0)),
            "hostname": str(found.get("lab_hostname") or f"ct{vmid}"), "ip": str(found.get("lab_ip") or ""),
        })  # fmt: skip
    return containers


def lab_sshd_dir(node: str, root: str, primary: str) -> str:
    """The directory of a node's hop (sshd_config, host key, pid file): the first node keeps the one-node lab's."""
    return f"{root}/sshd" if node == primary else f"{root}/sshd-{node}"


def _daemon(name: str, pidfile: str, match: str, port: Any) -> list[dict[str, Any]]:
    # The same test the build's daemon.yml makes before it starts one (pgrep on the pid file), and its port listening.
    return [
        {"name": f"{name} runs", "argv": ["pgrep", "--pidfile", pidfile, "--full", match]},
        {"name": f"{name} listens on port {port}", "argv": ["ss", "-H", "-ltn", f"sport = :{port}"],
         "stdout": "LISTEN"},
    ]  # fmt: skip


def lab_probes(nodes: Sequence[Sequence[Any]], root: str, primary: str, api_port: Any, vmids: Sequence[Any],
               lxc_path: str, bridge: str = "") -> list[dict[str, Any]]:  # fmt: skip
    """stage_stamp probes: every node's hop and the API run and listen, every container runs, the bridge is there
    (``bridge`` empty: the lab has none)."""
    probes: list[dict[str, Any]] = []
    for node, port in nodes:
        hop = lab_sshd_dir(str(node), root, primary)
        probes += _daemon(f"the hop of {node} (lab sshd)", f"{hop}/sshd.pid", f"{hop}/sshd_config", port)
    probes += _daemon("the lab Proxmox API", f"{root}/pveapi/pveapi.pid", "pveapi.py", api_port)
    for vmid in vmids:
        probes.append({"name": f"CT {vmid} runs", "stdout": "^RUNNING$",
                       "argv": ["lxc-info", "-P", lxc_path, "-n", str(vmid), "-s", "-H"]})  # fmt: skip
    if bridge:
        probes.append({"name": f"the bridge {bridge} is there", "argv": ["ip", "-br", "link", "show", "dev", bridge]})
    return probes


def lab_container_paths(vmids: Sequence[Any], lxc_path: str) -> list[str]:
    """The files the build put in each container, as the lab host sees them: in the overlay's upper directory
    (delta0) or, for a container with a rootfs of its own, there (the one that does not exist is absent)."""
    tops = ("delta0", "rootfs")
    return [f"{lxc_path}/{vmid}/{top}/{name}" for vmid in vmids for top in tops for name in CONTAINER_FILES]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"lab_containers": lab_containers, "lab_sshd_dir": lab_sshd_dir, "lab_probes": lab_probes,
                "lab_container_paths": lab_container_paths}  # fmt: skip
