"""Filters for the fleet's status: one row per host from what eagle3_status read there."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def status_rows(hosts: Iterable[str], hostvars: Mapping[str, Any],
                key: str = "__eagle3_status") -> list[dict[str, Any]]:  # fmt: skip
    """Rows ``{host, gpus, training, serving, router}`` of the hosts whose ``key`` (eagle3_status's result) is set.

    One set_stats for the whole play instead of one per host: a fleet-wide status pays one task per container less.
    Hosts without a result (unreachable, failed) have no row.
    """
    rows = []
    for host in hosts:
        found = hostvars[host].get(key)
        if isinstance(found, Mapping) and not found.get("skipped"):
            rows.append({"host": host, "gpus": found.get("gpus") or [], "training": found.get("training"),
                         "serving": found.get("serving"), "router": found.get("router")})  # fmt: skip
    return rows


def status_nodes(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> dict[str, str]:
    """Each host's Proxmox node (``pct_node``), for every host of the play: those that could not be reached too, so
    that the table says which node a silent container is on. Hosts without one (not reached through pct) are left
    out."""
    return {host: str(node) for host in hosts if (node := hostvars[host].get("pct_node"))}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"status_rows": status_rows, "status_nodes": status_nodes}
