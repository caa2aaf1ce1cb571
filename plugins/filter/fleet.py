"""Filters over the inventory of a fleet."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# The variables that name a container's VMID for the pct connection (plugins/connection/pct.py) and for
# community.proxmox's proxmox_pct_remote.
VMID_VARS = ("pct_vmid", "ansible_pct_vmid", "proxmox_vmid")
NODE_VARS = ("pct_node", "proxmox_node")


def _first(found: Mapping[str, Any], names: Iterable[str]) -> Any:
    return next((found[name] for name in names if found.get(name) not in (None, "")), None)


def vmid_conflicts(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """One sentence per VMID that more than one of ``hosts`` names (hosts without a VMID are not containers).

    A VMID is one container in a Proxmox cluster: two inventory hosts with the same VMID are one container reached
    twice (two runs of one task on it at once: two cleanups, two writers of its unit) or, on two nodes, a host whose
    container is not where the inventory says.
    """
    by_vmid: dict[str, list[tuple[str, str | None]]] = {}
    for host in hosts:
        found = hostvars[host]
        vmid = _first(found, VMID_VARS)
        if vmid is None:
            continue
        node = _first(found, NODE_VARS)
        if node is None and found.get("ansible_host"):  # the hypervisor it is reached through
            node = f"{found['ansible_host']}:{found.get('ansible_port') or 22}"
        by_vmid.setdefault(str(vmid).strip(), []).append((host, None if node is None else str(node)))
    sentences = []
    for vmid, named in by_vmid.items():
        if len(named) < 2:
            continue
        names = ", ".join(host for host, _node in named)
        nodes = sorted({node for _host, node in named if node is not None})
        where = "" if not nodes else f" (on node {nodes[0]})" if len(nodes) == 1 else f" (on nodes {', '.join(nodes)})"
        sentences.append(
            f"{names} all name VMID {vmid}{where}: a VMID is one container in a Proxmox cluster, so give each host "
            "its own container's pct_vmid (and the node that container is on)."
        )
    return sentences


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vmid_conflicts": vmid_conflicts}
