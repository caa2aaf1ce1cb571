# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
name: proxmox_ct
short_description: Proxmox LXC containers as hosts reached with the pct connection through their node
description:
  - Reads the cluster's nodes and LXC containers from the Proxmox VE API and yields one host per container,
    with C(ansible_connection=pct), C(pct_vmid), C(pct_node) and C(ansible_host) set to the address of the
    node that hosts it (from C(/cluster/status), or O(node_addresses)), so every container is reached through
    its own hypervisor in a multi-node cluster.
  - Groups from tags (O(tag_groups) maps a tag to a group name, e.g. C(trainer) to C(trainers)), from nodes
    (C(node_<name>)) and from status (C(status_running)); GPU count and the raw C(lxc.*) lines (repeated keys
    kept, in order) as host variables. Supports C(compose), C(groups), C(keyed_groups) and caching.
  - A container whose node is offline (C(online) 0 in C(/cluster/status); PVE lists its guests with the status
    C(unknown) and cannot proxy a call to it) is still a host, so that a fleet-wide run names it unreachable with
    its node rather than leave it out unseen; its configuration cannot be read, so it has C(proxmox_node_online)
    false, its tags from C(/cluster/resources), and no GPU or C(lxc) variables. The inventory warns which nodes
    are offline and which of their containers it lists or leaves out.
  - The configuration file must end in C(.proxmox_ct.yml) or C(.proxmox_ct.yaml).
author: eagle3-ops contributors (@eagle3-ops)
extends_documentation_fragment:
  - constructed
  - inventory_cache
options:
  plugin:
    description: Token that marks this file as a configuration of this plugin.
    required: true
    choices: [eagle3.ops.proxmox_ct, proxmox_ct]
  url:
    description: API URL of any node, e.g. C(https://pve1.example.org:8006).
    type: str
    required: true
    env: [{name: PROXMOX_URL}]
  user:
    description: User with realm.
    type: str
    default: root@pam
    env: [{name: PROXMOX_USER}]
  token_id:
    description: API token id.
    type: str
    env: [{name: PROXMOX_TOKEN_ID}]
  token_secret:
    description: API token secret (prefer the environment variable or a vaulted value).
    type: str
    env: [{name: PROXMOX_TOKEN_SECRET}]
  validate_certs:
    description: V(true), V(false) or the path of a CA bundle.
    type: str
    default: "true"
    env: [{name: PROXMOX_VALIDATE_CERTS}]
  node_addresses:
    description: Node name to the address ssh should use, overriding the cluster's own.
    type: dict
    default: {}
  hypervisor_user:
    description: ssh user on the nodes (C(ansible_user) of the containers).
    type: str
    default: root
  hypervisor_port:
    description: ssh port of the nodes, when not 22.
    type: int
  node_ports:
    description:
      - Node name to its ssh port, for nodes whose hop listens elsewhere than O(hypervisor_port) (several nodes
        behind one address, as in the lab's fleet).
    type: dict
    default: {}
  status:
    description:
      - Only containers in these states (empty for all).
      - C(unknown) is the state of a container whose node is offline; leave it in so that runs name such
        containers as unreachable.
    type: list
    elements: str
    default: [running, unknown]
  tag_groups:
    description: Tag to group name; tags not listed become groups of the same name.
    type: dict
    default: {}
  host_name:
    description: How hosts are named, from C(name) (the container hostname) or C(vmid) (C(ct<vmid>)).
    type: str
    default: name
    choices: [name, vmid]
"""

EXAMPLES = r"""
# inventory/fleet.proxmox_ct.yml
plugin: eagle3.ops.proxmox_ct
url: https://pve1.example.org:8006
user: automation@pve
token_id: eagle3
validate_certs: /etc/ssl/certs/pve-ca.pem
tag_groups: {trainer: trainers, server: servers}
compose:
  ansible_python_interpreter: "'/usr/bin/python3'"
"""

import re
from typing import Any

from ansible.errors import AnsibleParserError
from ansible.plugins.inventory import BaseInventoryPlugin, Cacheable, Constructable
from ansible_collections.eagle3.ops.plugins.module_utils._pve import PveClient, PveError

GPU_LINE = re.compile(r"dev/nvidia(\d+)\b")


def gpu_indices(config: dict[str, Any]) -> list[int]:
    """GPUs passed in by devN entries or raw lxc.mount.entry lines."""
    found: set[int] = set()
    for key, value in config.items():
        if re.fullmatch(r"dev\d+", key):
            m = re.search(r"nvidia(\d+)\b", str(value))
            if m:
                found.add(int(m.group(1)))
    for key, value in config.get("lxc") or []:
        if key == "lxc.mount.entry":
            m = GPU_LINE.search(value)
            if m:
                found.add(int(m.group(1)))
    return sorted(found)


def safe_group(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name)


class InventoryModule(BaseInventoryPlugin, Constructable, Cacheable):
    NAME = "eagle3.ops.proxmox_ct"

    def verify_file(self, path: str) -> bool:
        return super().verify_file(path) and path.endswith((".proxmox_ct.yml", ".proxmox_ct.yaml"))

    # -- API access (a seam for tests: _get is replaced with recorded answers) --------------------

    def _api(self) -> Any:
        """The collection's Proxmox client (module_utils/_pve.py), as the proxmox_ct module uses it."""
        m = re.match(r"^https?://([^/:]+|\[[^\]]+\])(?::(\d+))?", self.get_option("url") or "")
        if not m:
            raise AnsibleParserError(f"proxmox_ct inventory: url {self.get_option('url')!r} is not https://HOST[:PORT]")
        try:
            return PveClient.connect(m.group(1).strip("[]"), int(m.group(2) or 8006), self.get_option("user"),
                                     self.get_option("token_id"), self.get_option("token_secret"), None,
                                     self.get_option("validate_certs"), timeout=30)  # fmt: skip
        except PveError as exc:
            raise AnsibleParserError(f"proxmox_ct inventory at {self.get_option('url')}: {exc}") from exc

    def _get(self, path: str, **params: Any) -> Any:
        try:
            return self._client.get(path, **params)
        except PveError as exc:
            raise AnsibleParserError(f"proxmox_ct inventory: {exc}") from exc

    def fetch(self) -> dict[str, Any]:
        """Everything the inventory needs, as plain data (what the cache stores).

        A container's configuration is asked of its node (PVE proxies the call), so none is asked of a node the
        cluster reports offline, and a node that stops answering meanwhile (pveproxy's 595) is taken as offline.
        """
        self._client = self._api() if not hasattr(self, "_client_override") else self._client_override
        nodes = [n for n in self._get("cluster/status") if n.get("type") == "node"]
        addresses = {n["name"]: n.get("ip") for n in nodes}
        offline = {n["name"] for n in nodes if not n.get("online", 1)}
        containers = []
        for res in self._get("cluster/resources", type="vm"):
            if res.get("type") != "lxc":
                continue
            config = None
            if res["node"] not in offline:
                try:
                    config = self._client.get(f"nodes/{res['node']}/lxc/{res['vmid']}/config")
                except PveError as exc:
                    if not exc.node_unreachable:
                        raise AnsibleParserError(f"proxmox_ct inventory: {exc}") from exc
                    offline.add(res["node"])
            if config is None:  # the cluster still names it; nothing tells its state
                res = dict(res, status="unknown")
            containers.append({"resource": res, "config": config})
        return {"addresses": addresses, "containers": containers, "offline": sorted(offline)}

    # -- building ---------------------------------------------------------------------------------

    def parse(self, inventory: Any, loader: Any, path: str, cache: bool = True) -> None:
        super().parse(inventory, loader, path, cache)
        self._read_config_data(path)
        cache_key = self.get_cache_key(path)
        use_cache = self.get_option("cache") and cache
        update_cache = self.get_option("cache") and not cache
        data = None
        if use_cache:
            try:
                data = self._cache[cache_key]
            except KeyError:
                update_cache = True
        if data is None:
            data = self.fetch()
        if update_cache:
            self._cache[cache_key] = data
        self.populate(data)

    def populate(self, data: dict[str, Any]) -> None:
        overrides = self.get_option("node_addresses") or {}
        wanted_status = set(self.get_option("status") or [])
        tag_groups = self.get_option("tag_groups") or {}
        strict = self.get_option("strict")
        offline = set(data.get("offline") or [])
        self._warn_offline(data, offline, wanted_status)
        for item in sorted(data["containers"], key=lambda c: int(c["resource"]["vmid"])):
            res, config = item["resource"], item["config"] or {}
            if wanted_status and res.get("status") not in wanted_status:
                continue
            vmid, node = int(res["vmid"]), res["node"]
            address = overrides.get(node) or data["addresses"].get(node) or node
            name = res.get("name") if self.get_option("host_name") == "name" and res.get("name") else f"ct{vmid}"
            host = self.inventory.add_host(name)
            tags = [t for t in re.split(r"[;, ]+", str(config.get("tags") or res.get("tags") or "")) if t]
            hostvars: dict[str, Any] = {
                "ansible_connection": "eagle3.ops.pct",
                "ansible_host": address,
                "ansible_user": self.get_option("hypervisor_user"),
                "pct_vmid": vmid,
                "pct_node": node,
                "proxmox_status": res.get("status"),
                "proxmox_node_online": node not in offline,
                "proxmox_tags": tags,
            }
            if item["config"] is not None:
                gpus = gpu_indices(config)
                hostvars.update({
                    "proxmox_gpu_count": len(gpus),
                    "proxmox_gpus": gpus,
                    "proxmox_lxc": [list(pair) for pair in config.get("lxc") or []],
                    "proxmox_config": {k: v for k, v in config.items() if k not in ("lxc", "digest")},
                })  # fmt: skip
            port = (self.get_option("node_ports") or {}).get(node) or self.get_option("hypervisor_port")
            if port:
                hostvars["ansible_port"] = int(port)
            for key, value in hostvars.items():
                self.inventory.set_variable(host, key, value)
            for tag in tags:
                group = self.inventory.add_group(safe_group(str(tag_groups.get(tag, tag))))
                self.inventory.add_child(group, host)
            self.inventory.add_child(self.inventory.add_group(safe_group(f"node_{node}")), host)
            self.inventory.add_child(self.inventory.add_group(safe_group(f"status_{res.get('status')}")), host)
            self.inventory.add_child(self.inventory.add_group("containers"), host)
            self._set_composite_vars(self.get_option("compose"), hostvars, host, strict=strict)
            self._add_host_to_composed_groups(self.get_option("groups"), hostvars, host, strict=strict)
            self._add_host_to_keyed_groups(self.get_option("keyed_groups"), hostvars, host, strict=strict)

    def _warn_offline(self, data: dict[str, Any], offline: set[str], wanted_status: set[str]) -> None:
        """One warning per offline node: which of its containers are hosts, and which the status filter leaves out."""
        for node in sorted(offline):
            names = sorted(int(c["resource"]["vmid"]) for c in data["containers"] if c["resource"]["node"] == node)
            left_out = bool(wanted_status) and "unknown" not in wanted_status
            what = ", ".join(f"CT {v}" for v in names) or "no container"
            self.display.warning(
                f"proxmox_ct inventory: node {node} is offline, so the state and configuration of {what} on it "
                + ("cannot be read, and the status option leaves them out: add unknown to status to have runs name "
                   "them unreachable." if left_out and names else
                   "cannot be read: they are listed with status unknown and no GPU or lxc variables, and runs will "
                   "name them unreachable until the node is back.")
            )  # fmt: skip
