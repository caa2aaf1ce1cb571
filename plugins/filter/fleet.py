"""Filters over the inventory of a fleet."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

ROLES = Path(__file__).resolve().parents[2] / "roles"

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


def _plain(value: Any) -> Any:
    """A templated value as plain Python types (the validator's messages name the type it got)."""
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return value


@functools.lru_cache(maxsize=32)
def _role_specs(path: Path) -> Any:
    """A role's meta/argument_specs.yml, parsed once per process (with libyaml where PyYAML has it)."""
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506


def role_spec(role: str, entry: str = "main", roles: Path = ROLES) -> dict[str, Any]:
    """The options of one entry point of one of the collection's roles (its meta/argument_specs.yml)."""
    path = roles / role / "meta" / "argument_specs.yml"
    try:
        specs = _role_specs(path)["argument_specs"]
        return dict(specs[entry].get("options") or {})
    except (OSError, KeyError, TypeError, yaml.YAMLError) as exc:
        raise AnsibleFilterError(f"role_arg_problems: no argument spec {entry!r} for the role {role} ({exc}).") from exc


def role_arg_problems(hosts: Iterable[str], hostvars: Mapping[str, Any], role: str, current: Mapping[str, Any],
                      entry: str = "main") -> list[str]:  # fmt: skip
    """One sentence per problem with ``role``'s arguments on any of ``hosts``, checked on the controller in one task.

    A role's argument validation is a task per host, paid by every host of a fleet-wide run. The values a host may
    hold on its own come from the inventory (host and group variables), facts or extra variables: all in
    ``hostvars``. Everything else - role defaults, play variables - is what the task itself sees (``current``, the
    values of the role's variables for the host the task runs on). Each host is checked with its own values over
    ``current``, against the role's argument spec, as validate_argument_spec does. For fleet entry points whose
    role takes no parameters from the play (a parameter above the inventory's precedence would be read here as the
    inventory's value).
    """
    options = role_spec(role, entry)
    validator = ArgumentSpecValidator(options)
    base = {name: _plain(value) for name, value in current.items() if name in options}
    by_message: dict[str, list[str]] = {}
    verdicts: dict[str, list[str]] = {}  # most hosts hold the same values (none of their own): one validation each
    for host in hosts:
        found = hostvars[host]
        values = dict(base)
        for name in options:
            if name not in found:
                continue
            try:
                values[name] = _plain(found[name])
            except Exception as exc:  # a value that cannot be templated for this host
                by_message.setdefault(f"{name} cannot be resolved ({exc})", []).append(host)
        try:
            key = json.dumps(values, sort_keys=True)
        except (TypeError, ValueError):  # a value JSON cannot say: validated on its own
            key = ""
        if not key or key not in verdicts:
            verdicts[key] = list(validator.validate(values).error_messages)
        for message in verdicts[key]:
            by_message.setdefault(message, []).append(host)
    return [f"{', '.join(names)}: {role}: {message}; fix it in the inventory or the extra variables."
            for message, names in by_message.items()]  # fmt: skip


def fleet_problems(hosts: Iterable[str], hostvars: Mapping[str, Any], role: str = "",
                   current: Mapping[str, Any] | None = None, entry: str = "main") -> list[str]:  # fmt: skip
    """vmid_conflicts, then (with ``role``) role_arg_problems, over one read of each host's variables: every
    ``hostvars[host]`` is that host's variables computed anew, and a fleet-wide run pays for each read on the
    controller before its first host is reached."""
    hosts = list(hosts)
    read = {host: hostvars[host] for host in hosts}
    problems = vmid_conflicts(hosts, read)
    if role:
        problems += role_arg_problems(hosts, read, role, current or {}, entry)
    return problems


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"vmid_conflicts": vmid_conflicts, "role_arg_problems": role_arg_problems,
                "fleet_problems": fleet_problems}  # fmt: skip
