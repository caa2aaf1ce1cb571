#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: proxmox_ct
short_description: Create, update, start, stop and remove Proxmox LXC containers through the API, idempotently
description:
  - Declares one container (VMID, node, hostname, template, cores, memory, swap, rootfs, bind mounts, device
    passthrough, tags, features) and converges it through the Proxmox VE API with proxmoxer.
  - Every task (UPID) is waited on and its C(exitstatus) checked; a failed task fails the module with the
    tail of the task log instead of a timeout.
  - A second run with the same declaration changes nothing. Changed options are set with one config update;
    a change that only applies after a restart (mount points, devices, rootfs, features) restarts a running
    container only when O(restart=true), and is reported as C(restart_needed) otherwise.
  - Refuses to adopt a container whose hostname differs from the declared one (a VMID clash).
  - Raw C(lxc.*) lines cannot be set through the API; the proxmox_ct role writes them over the hypervisor
    ssh hop when C(devN) passthrough is not available to the credentials.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  api_host: {description: Address of a node's API., type: str, required: true}
  api_port: {description: API port., type: int, default: 8006}
  api_user: {description: User (with realm) that owns the token or password., type: str, default: root@pam}
  api_token_id: {description: API token id (the part after C(!))., type: str}
  api_token_secret: {description: API token secret., type: str}
  api_password: {description: Password (ticket auth); needed for root@pam-only options such as devN., type: str}
  validate_certs:
    description: V(true), V(false), or the path of a CA bundle to verify the API's certificate with.
    type: str
    default: "true"
  node: {description: The node that hosts the container., type: str, required: true}
  vmid: {description: Container ID., type: int, required: true}
  hostname: {description: Container hostname; must match an existing container's., type: str}
  ostemplate:
    description: Template volume for creation (e.g. C(local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst)).
    type: str
  rootfs: {description: Root filesystem on creation (e.g. C(local-lvm:64))., type: str}
  cores: {description: CPU cores., type: int}
  memory: {description: Memory in MiB., type: int}
  swap: {description: Swap in MiB., type: int}
  features: {description: Feature string (e.g. C(nesting=1))., type: str}
  description: {description: Notes shown in the UI., type: str}
  onboot: {description: Start with the node., type: bool}
  tags: {description: Tags; the inventory plugin turns them into groups., type: list, elements: str}
  mounts:
    description: Mount points C(mp0..), each a host directory (bind mount, root@pam only) or a storage volume.
    type: list
    elements: dict
    suboptions:
      host_path: {description: Host directory to bind., type: str}
      volume: {description: Storage volume (e.g. C(local-lvm:500))., type: str}
      mp: {description: Path inside the container., type: str, required: true}
      read_only: {description: Mount read-only., type: bool, default: false}
  devices:
    description: C(devN) passthrough entries (e.g. C(/dev/nvidia0)); root@pam with a password only.
    type: list
    elements: str
  state:
    description: V(started) and V(stopped) imply V(present); V(absent) stops and destroys the container.
    type: str
    choices: [present, started, stopped, absent]
    default: started
  restart:
    description: Restart a running container when a change needs it.
    type: bool
    default: false
  timeout:
    description: Seconds to wait for each task.
    type: int
    default: 300
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode: {support: full}
  diff_mode: {support: full}
  idempotent: {support: full}
"""

EXAMPLES = r"""
- name: A 4-GPU trainer with a dataset bind mount
  proxmox_ct:
    api_host: pve1.example.org
    api_token_id: eagle3
    api_token_secret: "{{ vault_proxmox_api_token_secret }}"
    node: pve1
    vmid: 129
    hostname: trainer
    ostemplate: local:vztmpl/debian-12-standard_12.7-1_amd64.tar.zst
    rootfs: local-lvm:64
    cores: 32
    memory: 262144
    tags: [trainer]
  no_log: false
"""

RETURN = r"""
created: {description: Whether the container was created., returned: always, type: bool}
updated: {description: Options set or deleted., returned: always, type: list, elements: str}
restart_needed:
  description: Options that take effect only after a restart that was not allowed.
  returned: always
  type: list
  elements: str
restarted: {description: Whether the container was restarted., returned: always, type: bool}
status: {description: Container status after the run., returned: always, type: str}
config:
  description: The container's configuration after the run (raw lxc lines under C(lxc)).
  returned: always
  type: dict
tasks: {description: UPIDs of the tasks run., returned: always, type: list, elements: str}
"""

import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._pve import (
    PveClient,
    PveError,
    diff_config,
    needs_restart,
    render_desired,
)

ARGUMENT_SPEC = {
    "api_host": {"type": "str", "required": True},
    "api_port": {"type": "int", "default": 8006},
    "api_user": {"type": "str", "default": "root@pam"},
    "api_token_id": {"type": "str"},
    "api_token_secret": {"type": "str", "no_log": True},
    "api_password": {"type": "str", "no_log": True},
    "validate_certs": {"type": "str", "default": "true"},
    "node": {"type": "str", "required": True},
    "vmid": {"type": "int", "required": True},
    "hostname": {"type": "str"},
    "ostemplate": {"type": "str"},
    "rootfs": {"type": "str"},
    "cores": {"type": "int"},
    "memory": {"type": "int"},
    "swap": {"type": "int"},
    "features": {"type": "str"},
    "description": {"type": "str"},
    "onboot": {"type": "bool"},
    "tags": {"type": "list", "elements": "str"},
    "mounts": {
        "type": "list",
        "elements": "dict",
        "options": {
            "host_path": {"type": "str"},
            "volume": {"type": "str"},
            "mp": {"type": "str", "required": True},
            "read_only": {"type": "bool", "default": False},
        },
    },
    "devices": {"type": "list", "elements": "str"},
    "state": {"type": "str", "default": "started", "choices": ["present", "started", "stopped", "absent"]},
    "restart": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 300},
}


def _lines(options: dict) -> str:
    return "".join(f"{k}: {v}\n" for k, v in sorted(options.items()))


class ProxmoxContainer:
    """Converge one container: a method per state, and the power state last."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.check = module.check_mode
        self.vmid, self.node = self.p["vmid"], self.p["node"]
        self.result: dict = {"changed": False, "created": False, "updated": [], "restart_needed": [],
                             "restarted": False, "status": "absent", "config": {}, "tasks": []}  # fmt: skip
        self._client: PveClient | None = None
        self.here: dict | None = None  # the container's cluster resource, when it exists

    @property
    def client(self) -> PveClient:
        if self._client is None:
            raise PveError("not connected to the Proxmox API yet")  # a bug in the call order, never user input
        return self._client

    def fail(self, msg: str) -> None:
        self.module.fail_json(msg=msg, **self.result)

    def validate(self) -> None:
        for m in self.p["mounts"] or []:
            if bool(m.get("host_path")) == bool(m.get("volume")):
                self.fail(f"Mount point {m['mp']} needs exactly one of host_path or volume.")

    @property
    def ct(self):
        return self.client.api.nodes(self.node).lxc(self.vmid)

    def task(self, what: str, fn, *args, **kwargs) -> None:
        self.client.run_task(self.node, what, fn, *args, **kwargs)
        self.result["tasks"] = list(self.client.tasks)

    def locate(self) -> None:
        """Connect, check the node, and find the VMID in the cluster (refusing one used elsewhere)."""
        p = self.p
        self._client = PveClient.connect(p["api_host"], p["api_port"], p["api_user"], p["api_token_id"],
                                         p["api_token_secret"], p["api_password"], p["validate_certs"],
                                         timeout=p["timeout"])  # fmt: skip
        listed = self.client.call("Listing the nodes", self.client.api.nodes.get)
        nodes = [n["node"] for n in listed]
        if self.node not in nodes:
            self.fail(f"Node {self.node!r} is not in the cluster (nodes: {', '.join(nodes)}): fix node.")
        online = [n["node"] for n in listed if n.get("status", "online") == "online"]
        if self.node not in online:  # PVE proxies every call about its containers to it: none would get through
            self.fail(f"Node {self.node!r} is offline in the cluster, so nothing on it can be read or changed: bring "
                      f"it back, or choose an online node ({', '.join(online) or 'none'}).")  # fmt: skip
        resources = self.client.call("Listing the guests", self.client.api.cluster.resources.get, type="vm")
        self.here = next((r for r in resources if int(r.get("vmid", -1)) == self.vmid), None)
        if self.here and self.here.get("node") != self.node:
            self.fail(f"VMID {self.vmid} is already used by {self.here.get('name', '?')} on node "
                      f"{self.here.get('node')}: pick another.")  # fmt: skip

    def run(self) -> None:
        self.locate()
        if self.p["state"] == "absent":
            self.absent()
            return
        if self.here:
            self.update()
        else:
            self.create()
        self.power()

    def absent(self) -> None:
        if not self.here:
            return
        self.result["changed"] = True
        if not self.check:
            if self.here.get("status") == "running":
                self.task(f"Stopping CT {self.vmid}", self.ct.status.stop.post)
            self.task(f"Destroying CT {self.vmid}", self.ct.delete)

    def create(self) -> None:
        desired = render_desired(self.p)
        if not self.p["ostemplate"]:
            self.fail(f"CT {self.vmid} does not exist and no ostemplate was given to create it.")
        self.result.update(changed=True, created=True, updated=sorted(desired))
        if self.module._diff:
            self.result["diff"] = {"before": "", "after": _lines(desired)}
        if self.check:
            return
        body = dict(desired, vmid=self.vmid, ostemplate=self.p["ostemplate"])
        if self.p["rootfs"]:
            body["rootfs"] = self.p["rootfs"]
        self.task(f"Creating CT {self.vmid}", self.client.api.nodes(self.node).lxc.post, **body)

    def update(self) -> None:
        current = self.client.call(f"Reading the config of CT {self.vmid}", self.ct.config.get)
        if self.p["hostname"] and current.get("hostname") not in (None, self.p["hostname"]):
            self.fail(f"VMID {self.vmid} on {self.node} is {current.get('hostname')!r}, not {self.p['hostname']!r}: "
                      "pick another VMID, or declare its hostname to adopt it.")  # fmt: skip
        managed = tuple(x for x, wanted in (("mp", self.p["mounts"]), ("dev", self.p["devices"])) if wanted is not None)
        changes, deletes = diff_config(current, render_desired(self.p), managed)
        if not changes and not deletes:
            return
        self.result["changed"] = True
        self.result["updated"] = sorted([*changes, *deletes])
        if self.module._diff:
            before = {k: str(current.get(k, "")) for k in self.result["updated"] if k in current}
            self.result["diff"] = {"before": _lines(before), "after": _lines(dict(changes))}
        if not self.check:
            body = dict(changes, digest=current.get("digest", ""))
            if deletes:
                body["delete"] = ",".join(deletes)
            self.client.call(f"Updating the config of CT {self.vmid}", self.ct.config.put, **body)
        here = self.here or {}
        pending = needs_restart(self.result["updated"]) if here.get("status") == "running" else []
        if pending and self.p["restart"] and self.p["state"] != "stopped":
            self.result["restarted"] = True
            if not self.check:
                self.task(f"Stopping CT {self.vmid} to apply {', '.join(pending)}", self.ct.status.stop.post)
                here["status"] = "stopped"
        elif pending:
            self.result["restart_needed"] = pending
            self.module.warn(f"CT {self.vmid} needs a restart to apply {', '.join(pending)}: set restart: true.")

    def power(self) -> None:
        """started or stopped as asked (present leaves the power state alone)."""
        if self.check:
            status = (self.here or {}).get("status", "stopped")
        else:
            status = self.client.call(f"Reading the status of CT {self.vmid}", self.ct.status.current.get)["status"]
        if self.p["state"] == "started" and status != "running":
            self.result["changed"] = True
            if not self.check:
                self.task(f"Starting CT {self.vmid}", self.ct.status.start.post)
            status = "running"
        elif self.p["state"] == "stopped" and status == "running":
            self.result["changed"] = True
            if not self.check:
                self.task(f"Stopping CT {self.vmid}", self.ct.status.shutdown.post, forceStop=1, timeout=60)
            status = "stopped"
        self.result["status"] = status
        if not self.check:
            self.result["config"] = self.client.call(f"Reading the config of CT {self.vmid}", self.ct.config.get)


def main() -> None:
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_one_of=[("api_token_id", "api_password")],
        required_together=[("api_token_id", "api_token_secret")],
        supports_check_mode=True,
    )
    container = ProxmoxContainer(module)
    container.validate()
    try:
        container.run()
    except PveError as exc:
        container.fail(str(exc))
    except Exception as exc:  # the unexpected gets a traceback
        module.fail_json(msg=f"proxmox_ct failed unexpectedly: {exc}", exception=traceback.format_exc(),
                         **container.result)
    module.exit_json(**container.result)


if __name__ == "__main__":
    main()
