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


NODE_UNREACHABLE = 595  # pveproxy's answer when the node it proxies a call to does not answer (AnyEvent::HTTP's 595)


class PveError(Exception):
    """An API call or task that failed; the message names the call and what to do. ``status`` is the HTTP status
    the API answered with, when it answered."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status

    @property
    def node_unreachable(self) -> bool:
        """A call PVE proxied to a node that did not answer (pveproxy's 595: the node is down or cut off)."""
        return self.status == NODE_UNREACHABLE


def parse_validate_certs(value: Any) -> bool | str:
    """validate_certs as proxmoxer's verify_ssl: a boolean, or the path of a CA bundle (any spelling of yes/no)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip()
    truth = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
    return truth.get(text.lower(), text)


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


class PveClient:
    """The one Proxmox API client of the collection (the proxmox_ct module and inventory plugin use it).

    Every call goes through call(), which turns whatever proxmoxer or requests raised into one sentence;
    run_task() also waits on the task's UPID and requires its exit status to be OK.
    """

    def __init__(self, api: Any, timeout: float = 300) -> None:
        self.api = api
        self.timeout = timeout
        self.tasks: list[str] = []

    @classmethod
    def connect(cls, host: str, port: int, user: str, token_id: str | None, token_secret: str | None,
                password: str | None, validate_certs: Any, timeout: float = 300) -> PveClient:  # fmt: skip
        api = cls.call_static("Connecting to the Proxmox API", connect, host, port, user, token_id, token_secret,
                              password, parse_validate_certs(validate_certs))  # fmt: skip
        return cls(api, timeout)

    @staticmethod
    def call_static(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PveError:
            raise
        except Exception as exc:  # proxmoxer, requests: turned into one sentence
            raise PveError(describe_error(exc, what), getattr(exc, "status_code", None)) from exc

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.call_static(what, fn, *args, **kwargs)

    def get(self, path: str, **params: Any) -> Any:
        """GET an API path (e.g. cluster/resources), for readers such as the inventory plugin."""
        return self.call(f"GET {path}", self.api(path).get, **params)

    def run_task(self, node: str, what: str, fn: Any, *args: Any, **kwargs: Any) -> str:
        upid = self.call(what, fn, *args, **kwargs)
        self.tasks.append(upid)
        self.call(what, wait_task, self.api, node, upid, self.timeout)
        return upid


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
    if status == NODE_UNREACHABLE:
        reason = getattr(exc, "content", None) or "the node did not answer"
        return (f"{what}: the cluster cannot reach that node (595 {reason}): it is offline or cut off from the "
                "cluster; bring it back, or leave out its containers")
    if "no quorum" in text:  # pmxcfs is read-only without quorum: no guest can be created, changed or started
        return (f"{what}: the cluster has no quorum (more than half of its nodes must be online), so Proxmox refuses "
                "changes: bring its offline nodes back")
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
