# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Proxmox VE API helpers shared by the proxmox_ct module and the inventory plugin (proxmoxer based).

Pure parts (desired-config rendering, diffing, which changes need a restart) take no API object, so
they are unit-testable; the API parts wait on every task and check its exit status, with the log.
"""

from __future__ import annotations

import re
import time
from typing import Any

# Options whose change on a running container only takes effect after a restart.
RESTART_KEYS = re.compile(r"^(mp\d+|dev\d+|rootfs|unprivileged|features|arch|ostype)$")


class PveError(Exception):
    """An API call or task that failed; the message names the call and what to do."""


def connect(
    host: str,
    port: int,
    user: str,
    token_id: str | None,
    token_secret: str | None,
    password: str | None,
    verify: bool | str,
    timeout: int = 30,
) -> Any:
    try:
        from proxmoxer import ProxmoxAPI
    except ImportError as exc:
        raise PveError("the proxmoxer Python package is missing on the controller: pip install proxmoxer") from exc
    kwargs: dict[str, Any] = {"port": port, "user": user, "verify_ssl": verify, "timeout": timeout}
    if token_id:
        kwargs.update(token_name=token_id, token_value=token_secret)
    elif password:
        kwargs["password"] = password
    else:
        raise PveError("give api_token_id and api_token_secret, or api_password")
    return ProxmoxAPI(host, backend="https", **kwargs)


def describe_error(exc: Exception, what: str) -> str:
    """One sentence for an API failure, whatever proxmoxer or requests raised."""
    text = str(exc)
    status = getattr(exc, "status_code", None)
    errors = getattr(exc, "errors", None)
    if status == 401 or ("401" in text and "authentication" in text.lower()):
        return f"{what}: the API refused the credentials (401 authentication failure): check the token id and secret"
    if status == 403:
        return f"{what}: permission denied ({getattr(exc, 'content', text)})"
    if errors:
        detail = "; ".join(f"{k}: {v}" for k, v in sorted(errors.items()))
        return f"{what}: the API rejected the parameters ({detail})"
    if "CERTIFICATE_VERIFY_FAILED" in text or "SSLError" in text:
        return f"{what}: TLS verification failed ({text.splitlines()[0][:160]}): point validate_certs at the node's CA"
    if "Connection refused" in text or "Max retries" in text:
        return f"{what}: cannot reach the API ({text.splitlines()[0][:160]}): check api_host and api_port"
    return f"{what}: {getattr(exc, 'content', None) or text}"


def wait_task(api: Any, node: str, upid: str, timeout: float, poll: float = 0.3) -> dict[str, Any]:
    """Wait for a task to stop and require exitstatus OK (or WARNINGS); fail with the task's log otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        status = api.nodes(node).tasks(upid).status.get()
        if status.get("status") == "stopped":
            break
        if time.monotonic() > deadline:
            raise PveError(f"task {upid} still runs after {timeout:.0f} s: raise timeout or look at it in the UI")
        time.sleep(poll)
    exit_status = status.get("exitstatus", "")
    if exit_status == "OK" or exit_status.startswith("WARNINGS"):
        return status
    log = api.nodes(node).tasks(upid).log.get(limit=50)
    tail = " | ".join(line.get("t", "") for line in log[-8:])
    raise PveError(f"task {status.get('type', '')} for {status.get('id', '')} failed: {exit_status} (log: {tail})")


def render_desired(params: dict[str, Any]) -> dict[str, str]:
    """The container options the module manages, as PVE config strings."""
    out: dict[str, str] = {}
    for key in ("hostname", "cores", "memory", "swap", "features", "description"):
        if params.get(key) is not None:
            out[key] = str(params[key])
    if params.get("onboot") is not None:
        out["onboot"] = "1" if params["onboot"] else "0"
    if params.get("tags"):
        out["tags"] = ";".join(sorted(params["tags"]))
    for i, m in enumerate(params.get("mounts") or []):
        source = m.get("host_path") or m.get("volume")
        value = f"{source},mp={m['mp']}"
        if m.get("read_only"):
            value += ",ro=1"
        out[f"mp{i}"] = value
    for i, dev in enumerate(params.get("devices") or []):
        out[f"dev{i}"] = dev
    return out


def normalise(key: str, value: Any) -> str:
    text = str(value)
    if key == "tags":
        return ";".join(sorted(t for t in re.split(r"[;, ]+", text) if t))
    return text


def diff_config(
    current: dict[str, Any], desired: dict[str, str], managed_prefixes: tuple[str, ...]
) -> tuple[dict[str, str], list[str]]:
    """(options to set, options to delete): indexed options of a managed family not desired any more are deleted."""
    changes = {k: v for k, v in desired.items() if normalise(k, current.get(k, "")) != normalise(k, v)}
    deletes = sorted(
        k for k in current if any(re.fullmatch(rf"{p}\d+", k) for p in managed_prefixes) and k not in desired
    )
    return changes, deletes


def needs_restart(changed: list[str]) -> list[str]:
    return [k for k in changed if RESTART_KEYS.match(k)]


def gpu_lines(indices: list[int], device_dir: str, uvm_major: int | None = None) -> list[tuple[str, str]]:
    """Raw lxc lines for GPU passthrough: cgroup allow lines and a bind mount per device node."""
    lines = [("lxc.cgroup2.devices.allow", "c 195:* rwm")]
    if uvm_major is not None:
        lines.append(("lxc.cgroup2.devices.allow", f"c {uvm_major}:* rwm"))
    nodes = [f"nvidia{i}" for i in indices] + ["nvidiactl", "nvidia-uvm"]
    lines += [
        ("lxc.mount.entry", f"{device_dir.rstrip('/')}/{n} dev/{n} none bind,optional,create=file") for n in nodes
    ]
    return lines
