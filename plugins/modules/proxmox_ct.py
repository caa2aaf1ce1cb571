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
    PveError,
    connect,
    describe_error,
    diff_config,
    needs_restart,
    render_desired,
    wait_task,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
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
        },
        required_one_of=[("api_token_id", "api_password")],
        required_together=[("api_token_id", "api_token_secret")],
        supports_check_mode=True,
    )
    p = module.params
    vmid, node = p["vmid"], p["node"]
    result: dict = {"changed": False, "created": False, "updated": [], "restart_needed": [], "restarted": False,
                    "status": "absent", "config": {}, "tasks": []}  # fmt: skip
    verify: bool | str = {"true": True, "yes": True, "false": False, "no": False}.get(
        p["validate_certs"].lower(), p["validate_certs"]
    )
    for m in p["mounts"] or []:
        if bool(m.get("host_path")) == bool(m.get("volume")):
            module.fail_json(msg=f"Mount point {m['mp']} needs exactly one of host_path or volume.", **result)

    def call(what: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except PveError:
            raise
        except Exception as exc:  # proxmoxer, requests: turned into one sentence
            raise PveError(describe_error(exc, what)) from exc

    def run_task(what: str, fn, *args, **kwargs) -> None:
        upid = call(what, fn, *args, **kwargs)
        result["tasks"].append(upid)
        call(what, wait_task, api, node, upid, p["timeout"])

    try:
        api = call(
            "Connecting to the Proxmox API",
            connect,
            p["api_host"],
            p["api_port"],
            p["api_user"],
            p["api_token_id"],
            p["api_token_secret"],
            p["api_password"],
            verify,
        )
        nodes = [n["node"] for n in call("Listing the nodes", api.nodes.get)]
        if node not in nodes:
            module.fail_json(
                msg=f"Node {node!r} is not in the cluster (nodes: {', '.join(nodes)}): fix node.", **result
            )
        resources = call("Listing the guests", api.cluster.resources.get, type="vm")
        here = next((r for r in resources if int(r.get("vmid", -1)) == vmid), None)
        if here and here.get("node") != node:
            module.fail_json(
                msg=f"VMID {vmid} is already used by {here.get('name', '?')} on node {here.get('node')}: pick another.",
                **result,
            )
        ct = api.nodes(node).lxc(vmid)
        desired = render_desired(p)

        if p["state"] == "absent":
            if here:
                result["changed"] = True
                if not module.check_mode:
                    if here.get("status") == "running":
                        run_task(f"Stopping CT {vmid}", ct.status.stop.post)
                    run_task(f"Destroying CT {vmid}", ct.delete)
            module.exit_json(**result)

        if not here:
            if not p["ostemplate"]:
                module.fail_json(msg=f"CT {vmid} does not exist and no ostemplate was given to create it.", **result)
            result.update(changed=True, created=True, updated=sorted(desired))
            if module._diff:
                result["diff"] = {"before": "", "after": "".join(f"{k}: {v}\n" for k, v in sorted(desired.items()))}
            if module.check_mode:
                module.exit_json(**result)
            create = dict(desired, vmid=vmid, ostemplate=p["ostemplate"])
            if p["rootfs"]:
                create["rootfs"] = p["rootfs"]
            run_task(f"Creating CT {vmid}", api.nodes(node).lxc.post, **create)
        else:
            current = call(f"Reading the config of CT {vmid}", ct.config.get)
            if p["hostname"] and current.get("hostname") not in (None, p["hostname"]):
                module.fail_json(
                    msg=f"VMID {vmid} on {node} is {current.get('hostname')!r}, not {p['hostname']!r}: pick another "
                    "VMID, or declare its hostname to adopt it.",
                    **result,
                )
            managed = tuple(x for x, wanted in (("mp", p["mounts"]), ("dev", p["devices"])) if wanted is not None)
            changes, deletes = diff_config(current, desired, managed)
            if changes or deletes:
                result["changed"] = True
                result["updated"] = sorted([*changes, *deletes])
                if module._diff:
                    before = {k: str(current.get(k, "")) for k in result["updated"] if k in current}
                    after = dict(changes)
                    result["diff"] = {
                        "before": "".join(f"{k}: {v}\n" for k, v in sorted(before.items())),
                        "after": "".join(f"{k}: {v}\n" for k, v in sorted(after.items())),
                    }
                if not module.check_mode:
                    body = dict(changes, digest=current.get("digest", ""))
                    if deletes:
                        body["delete"] = ",".join(deletes)
                    call(f"Updating the config of CT {vmid}", ct.config.put, **body)
                running = here.get("status") == "running"
                pending = needs_restart(result["updated"]) if running else []
                if pending and p["restart"] and p["state"] != "stopped":
                    result["restarted"] = True
                    if not module.check_mode:
                        run_task(f"Stopping CT {vmid} to apply {', '.join(pending)}", ct.status.stop.post)
                        here["status"] = "stopped"
                elif pending:
                    result["restart_needed"] = pending
                    module.warn(f"CT {vmid} needs a restart to apply {', '.join(pending)}: set restart: true.")

        status = "stopped" if module.check_mode and not here else (
            call(f"Reading the status of CT {vmid}", ct.status.current.get)["status"]
            if not module.check_mode else (here or {}).get("status", "stopped")
        )  # fmt: skip
        if p["state"] == "started" and status != "running":
            result["changed"] = True
            if not module.check_mode:
                run_task(f"Starting CT {vmid}", ct.status.start.post)
            status = "running"
        elif p["state"] == "stopped" and status == "running":
            result["changed"] = True
            if not module.check_mode:
                run_task(f"Stopping CT {vmid}", ct.status.shutdown.post, forceStop=1, timeout=60)
            status = "stopped"
        result["status"] = status
        if not module.check_mode:
            result["config"] = call(f"Reading the config of CT {vmid}", ct.config.get)
    except PveError as exc:
        module.fail_json(msg=str(exc), **result)
    except Exception as exc:  # the unexpected gets a traceback
        module.fail_json(msg=f"proxmox_ct failed unexpectedly: {exc}", exception=traceback.format_exc(), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
