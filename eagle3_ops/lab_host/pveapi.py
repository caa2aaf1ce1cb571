"""The lab's Proxmox VE API: the paths eagle3-ops calls, over HTTPS, backed by the lab's pct.

Answers like PVE 9 (``/api2/json``, ``{"data": ...}`` envelopes, API token auth with
``Authorization: PVEAPIToken=USER@REALM!TOKENID=SECRET``, long operations as tasks with UPIDs and
status/log endpoints). Containers are the lab's LXC containers: every change goes through the lab's
``pct``, so the CLI and the API see the same state. Permissions follow PVE where the project depends
on them: ``devN`` passthrough and bind mount points are refused for API tokens (root@pam only).

A node is online while its ssh hop runs (``--hop NODE=PIDFILE``: the lab's stand-in for a node's membership of
the cluster); a node without a hop named is always online. As on a PVE cluster, an offline node is ``offline`` in
``/nodes`` and ``/cluster/resources`` (``online: 0`` in ``/cluster/status``), its containers are listed from the
cluster's shared configuration with the status ``unknown``, and every ``/nodes/{node}/...`` call, which PVE proxies
to that node (``proxyto: node`` in the 9.1.3 schema), fails with pveproxy's ``595 No route to host``. A cluster
with half of its nodes or fewer online has no quorum: creating, destroying, reconfiguring or starting a container
fails with PVE's ``cluster not ready - no quorum?`` (its configuration file system is read-only then).

Every request is appended to ``$EAGLE3_LAB_ROOT/pve/api-requests.jsonl`` (method, path template,
parameter names and values) so tests can check it against the published API schema.

Standard library only. Run: ``pveapi.py --port 8006 --cert C --key K --tokens T``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pct  # noqa: E402  -- the lab's pct, installed beside this file
import pct_config  # noqa: E402

PCT = [sys.executable, os.path.join(HERE, "pct.py")]
TASKS: dict[str, dict[str, Any]] = {}
TASKS_LOCK = threading.Lock()
REQUEST_LOG_LOCK = threading.Lock()
ROOT_ONLY_WITH_TOKEN = re.compile(r"^dev\d+$")
HOPS: dict[str, str] = {}  # node -> the pid file of its ssh hop (--hop): the node is online while that process runs


class ApiError(Exception):
    def __init__(self, status: int, message: str, errors: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.errors = errors


def run_pct(node: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The node's pct, as the API daemon of that node would run it."""
    env = dict(os.environ, EAGLE3_LAB_NODE=node)
    return subprocess.run([*PCT, *args], capture_output=True, text=True, check=False, timeout=600, env=env)


def node_vmids(node: str) -> list[int]:
    try:
        names = os.listdir(pct_config.conf_dir(node))
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if re.fullmatch(r"\d+\.conf", n))


def upid(node: str, kind: str, ident: str, user: str) -> str:
    now = int(time.time())
    return f"UPID:{node}:{os.getpid():08X}:{threading.get_native_id():08X}:{now:08X}:{kind}:{ident}:{user}:"


def start_task(node: str, kind: str, ident: str, user: str, argv_list: list[list[str]]) -> str:
    """Run pct commands in a worker thread as one PVE task; its output becomes the task log."""
    task_id = upid(node, kind, ident, user)
    record: dict[str, Any] = {"upid": task_id, "node": node, "type": kind, "id": ident, "user": user,
                              "status": "running", "starttime": int(time.time()), "pid": os.getpid(), "pstart": 0,
                              "log": []}  # fmt: skip
    with TASKS_LOCK:
        TASKS[task_id] = record

    def work() -> None:
        status = "OK"
        for argv in argv_list:
            proc = run_pct(node, *argv)
            lines = (proc.stdout + proc.stderr).splitlines()
            with TASKS_LOCK:
                record["log"].extend(lines)
            if proc.returncode != 0:
                status = (proc.stderr.strip().splitlines() or [f"command 'pct {argv[0]}' failed"])[-1]
                break
        with TASKS_LOCK:
            record["log"].append("TASK OK" if status == "OK" else f"TASK ERROR: {status}")
            record["exitstatus"] = status
            record["status"] = "stopped"

    threading.Thread(target=work, daemon=True).start()
    return task_id


def node_online(node: str) -> bool:
    """Whether the node's hop runs: its pid file names a live sshd (a node the API was given no hop for is online)."""
    pidfile = HOPS.get(node)
    if pidfile is None:
        return True
    try:
        with open(pidfile, encoding="ascii") as fh:
            pid = int(fh.read().split()[0])
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return b"sshd" in fh.read()
    except (OSError, ValueError, IndexError):
        return False


def check_node(node: str) -> None:
    """A /nodes/{node}/... call: PVE proxies it to the node, so an unknown node fails its lookup and an offline one
    fails the proxy's connection (pveproxy answers 595)."""
    if node not in pct_config.cluster_nodes():
        raise ApiError(500, f"hostname lookup '{node}' failed - failed to get address info for: {node}: "
                       "Name or service not known")  # fmt: skip
    if not node_online(node):
        raise ApiError(595, "No route to host")


def check_quorum() -> None:
    """A change to a guest (create, destroy, config, start): PVE refuses it while the cluster has no quorum, since its
    configuration file system is read-only then (more than half of the nodes' votes must be online)."""
    nodes = pct_config.cluster_nodes()
    if len(nodes) > 1 and not quorate([node_online(n) for n in nodes]):
        raise ApiError(500, "cluster not ready - no quorum?")


def quorate(online: list[bool]) -> bool:
    """Whether the nodes online (one vote each) are more than half of the cluster's."""
    return 2 * sum(online) > len(online)


def load(vmid: int, node: str) -> pct.CtConfig:
    try:
        return pct.load_config(vmid, node)
    except pct.PctError as exc:
        raise ApiError(500, str(exc)) from None


def config_dict(vmid: int, node: str) -> dict[str, Any]:
    conf = load(vmid, node)
    out: dict[str, Any] = {}
    for key, value in conf.options.items():
        out[key] = int(value) if re.fullmatch(r"-?\d+", value) and key not in ("tags", "hostname") else value
    if conf.description:
        out["description"] = conf.description
    if conf.lxc:
        out["lxc"] = [[k, v] for k, v in conf.lxc]
    with open(pct.conf_path(vmid, node), "rb") as fh:
        out["digest"] = hashlib.sha1(fh.read()).hexdigest()  # noqa: S324 -- PVE's config digest is SHA-1
    return out


def status_dict(vmid: int, node: str) -> dict[str, Any]:
    conf = load(vmid, node)
    pid = pct.init_pid(vmid)
    return {
        "vmid": vmid, "name": conf.options.get("hostname", ""), "status": "running" if pid else "stopped",
        "type": "lxc", "maxmem": int(conf.options.get("memory", "512")) * 1024 * 1024,
        "maxswap": int(conf.options.get("swap", "512")) * 1024 * 1024, "cpus": int(conf.options.get("cores", "1")),
        "tags": conf.options.get("tags", ""), "uptime": 0, "template": 0, **({"pid": pid} if pid else {}),
    }  # fmt: skip


def option_args(params: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in params.items():
        out += [f"--{key}", value]
    return out


def check_root_only(params: dict[str, str], user: str, token: bool) -> None:
    """devN and bind mounts of host paths need root@pam with a ticket; an API token is refused."""
    if not token and user == "root@pam":
        return
    for key, value in params.items():
        if ROOT_ONLY_WITH_TOKEN.match(key):
            raise ApiError(403, f"Permission check failed (changing device passthrough ({key}) is only allowed for "
                           "root@pam)")  # fmt: skip
        if re.fullmatch(r"mp\d+", key) and value.split(",", 1)[0].startswith("/"):
            raise ApiError(403, f"Permission check failed (only root@pam can set bind mount {key})")


def validate(params: dict[str, str], allowed: set[str], required: set[str]) -> None:
    errors = {}
    for key in params:
        base = re.sub(r"\d+$", "[n]", key) if re.fullmatch(r"[a-z]+\d+", key) else key
        if key not in allowed and base not in allowed:
            errors[key] = "property is not defined in schema and the schema does not allow additional properties"
    for key in required - set(params):
        errors[key] = "property is missing and it is not optional"
    for key in ("memory", "swap", "cores", "vmid"):
        if key in params and not re.fullmatch(r"\d+", params[key]):
            errors[key] = f"type check ('integer') failed - got '{params[key]}'"
    if "memory" in params and "memory" not in errors and int(params["memory"]) < 16:
        errors["memory"] = "value must have a minimum value of 16"
    if "vmid" in params and "vmid" not in errors and not 100 <= int(params["vmid"]) <= 999_999_999:
        errors["vmid"] = "invalid format - value does not look like a valid VM ID"
    if errors:
        raise ApiError(400, "Parameter verification failed.", errors)


CT_OPTIONS = {"arch", "cmode", "console", "cores", "cpulimit", "cpuunits", "debug", "description", "dev[n]",
              "features", "hostname", "memory", "mp[n]", "nameserver", "net[n]", "onboot", "ostype", "protection",
              "rootfs", "searchdomain", "startup", "swap", "tags", "timezone", "tty", "unprivileged"}  # fmt: skip


class Api:
    """Route table: (method, path regex) -> handler(params, user, token, **groups)."""

    def __init__(self) -> None:
        self.routes: list[tuple[str, re.Pattern[str], str, Any]] = []
        r = self.route
        r("POST", "/access/ticket", self.ticket)
        r("GET", "/version", self.version)
        r("GET", "/nodes", self.nodes)
        r("GET", "/cluster/status", self.cluster_status)
        r("GET", "/cluster/resources", self.cluster_resources)
        r("GET", "/nodes/{node}/lxc", self.lxc_list)
        r("POST", "/nodes/{node}/lxc", self.lxc_create)
        r("DELETE", "/nodes/{node}/lxc/{vmid}", self.lxc_destroy)
        r("GET", "/nodes/{node}/lxc/{vmid}/config", self.lxc_config)
        r("PUT", "/nodes/{node}/lxc/{vmid}/config", self.lxc_update)
        r("GET", "/nodes/{node}/lxc/{vmid}/status/current", self.lxc_status)
        for action in ("start", "stop", "shutdown", "reboot"):
            r("POST", f"/nodes/{{node}}/lxc/{{vmid}}/status/{action}", self.lxc_action(action))
        r("GET", "/nodes/{node}/tasks/{upid}/status", self.task_status)
        r("GET", "/nodes/{node}/tasks/{upid}/log", self.task_log)

    def route(self, method: str, template: str, handler: Any) -> None:
        pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
        self.routes.append((method, re.compile(f"^{pattern}$"), template, handler))

    def match(self, method: str, path: str) -> tuple[str, Any, dict[str, str]]:
        known_path = False
        for m, regex, template, handler in self.routes:
            found = regex.match(path)
            if found:
                known_path = True
                if m == method:
                    return template, handler, {k: urllib.parse.unquote(v) for k, v in found.groupdict().items()}
        if known_path:
            raise ApiError(501, f"Method '{method} /api2/json{path}' not implemented")
        raise ApiError(501, f"Method '{method} /api2/json{path}' not implemented")

    # -- handlers ----------------------------------------------------------------------------

    def ticket(self, params: dict[str, str], user: str, token: bool) -> Any:
        raise AssertionError("handled before authentication")  # see Handler._handle

    def version(self, params: dict[str, str], user: str, token: bool) -> Any:
        return {"version": "9.1.3", "release": "9.1", "repoid": "eagle3lab"}

    def nodes(self, params: dict[str, str], user: str, token: bool) -> Any:
        return [{"node": n, "status": "online", "type": "node", "id": f"node/{n}", "maxcpu": os.cpu_count() or 1,
                 "level": ""} if node_online(n) else {"node": n, "status": "offline", "type": "node", "id": f"node/{n}"}
                for n in pct_config.cluster_nodes()]  # fmt: skip

    def cluster_status(self, params: dict[str, str], user: str, token: bool) -> Any:
        nodes = pct_config.cluster_nodes()
        online = [node_online(n) for n in nodes]
        return ([{"type": "cluster", "id": "cluster", "name": "eagle3lab", "nodes": len(nodes),
                  "quorate": int(quorate(online)), "version": len(nodes)}] if len(nodes) > 1 else []) + [
            {"type": "node", "name": n, "id": f"node/{n}", "ip": "127.0.0.1", "local": int(n == pct.NODE),
             "online": int(up), "nodeid": i + 1 if len(nodes) > 1 else 0, "level": ""}
            for i, (n, up) in enumerate(zip(nodes, online, strict=True))]  # fmt: skip

    def cluster_resources(self, params: dict[str, str], user: str, token: bool) -> Any:
        kind = params.get("type")
        out: list[dict[str, Any]] = []
        online = {n: node_online(n) for n in pct_config.cluster_nodes()}
        if kind in (None, "node"):
            out += [{"id": f"node/{n}", "type": "node", "node": n, "status": "online" if up else "offline"}
                    for n, up in online.items()]  # fmt: skip
        if kind in (None, "vm"):
            for node, up in online.items():
                for vmid in node_vmids(node):
                    st = status_dict(vmid, node)
                    entry = {"id": f"lxc/{vmid}", "type": "lxc", "node": node, "vmid": vmid, "name": st["name"],
                             "status": st["status"], "tags": st["tags"], "maxmem": st["maxmem"],
                             "maxcpu": st["cpus"], "template": 0}  # fmt: skip
                    if not up:  # the shared configuration still names it; nothing reports its state
                        entry = {k: v for k, v in entry.items() if k not in ("maxmem", "maxcpu")}
                        entry["status"] = "unknown"
                    out.append(entry)
        return out

    def lxc_list(self, params: dict[str, str], user: str, token: bool, node: str) -> Any:
        check_node(node)
        return [status_dict(v, node) for v in node_vmids(node)]

    def lxc_create(self, params: dict[str, str], user: str, token: bool, node: str) -> Any:
        check_node(node)
        check_quorum()
        validate(params, CT_OPTIONS | {"vmid", "ostemplate", "start", "storage", "password", "pool", "unique",
                                       "ssh-public-keys", "node"}, {"vmid", "ostemplate"})  # fmt: skip
        check_root_only(params, user, token)
        params = dict(params)
        vmid = params.pop("vmid")
        owner = pct_config.node_of(int(vmid))
        if owner:
            raise ApiError(500, f"CT {vmid} already exists on node '{owner}'")
        template = params.pop("ostemplate")
        params.pop("node", None)
        for key in ("storage", "password", "pool", "unique", "ssh-public-keys"):
            params.pop(key, None)
        return start_task(node, "vzcreate", vmid, user, [["create", vmid, template, *option_args(params)]])

    def lxc_destroy(self, params: dict[str, str], user: str, token: bool, node: str, vmid: str) -> Any:
        check_node(node)
        check_quorum()
        load(int(vmid), node)
        args = ["destroy", vmid] + (["--force", "1"] if params.get("force") in ("1", "true") else [])
        return start_task(node, "vzdestroy", vmid, user, [args])

    def lxc_config(self, params: dict[str, str], user: str, token: bool, node: str, vmid: str) -> Any:
        check_node(node)
        return config_dict(int(vmid), node)

    def lxc_update(self, params: dict[str, str], user: str, token: bool, node: str, vmid: str) -> Any:
        check_node(node)
        validate(params, CT_OPTIONS | {"delete", "digest", "revert", "node", "vmid"}, set())
        check_root_only(params, user, token)
        params = {k: v for k, v in params.items() if k not in ("node", "vmid")}
        digest = params.pop("digest", None)
        if digest and digest != config_dict(int(vmid), node)["digest"]:
            raise ApiError(500, "detected modified configuration - file changed by other user? Try again.")
        if not params:
            return None
        check_quorum()
        proc = run_pct(node, "set", vmid, *option_args(params))
        if proc.returncode != 0:
            raise ApiError(500, proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "update failed")
        return None

    def lxc_status(self, params: dict[str, str], user: str, token: bool, node: str, vmid: str) -> Any:
        check_node(node)
        return status_dict(int(vmid), node)

    def lxc_action(self, action: str) -> Any:
        def handler(params: dict[str, str], user: str, token: bool, node: str, vmid: str) -> Any:
            check_node(node)
            load(int(vmid), node)
            if action in ("start", "reboot"):
                check_quorum()
            if action == "reboot":
                return start_task(node, "vzreboot", vmid, user, [["stop", vmid], ["start", vmid]])
            args = [action, vmid]
            if action == "shutdown" and params.get("forceStop") in ("1", "true"):
                args += ["--forceStop", "1"]
            if action == "shutdown" and "timeout" in params:
                args += ["--timeout", params["timeout"]]
            return start_task(node, f"vz{action}", vmid, user, [args])

        return handler

    def _task(self, node: str, task_id: str) -> dict[str, Any]:
        check_node(node)
        with TASKS_LOCK:
            task = TASKS.get(task_id)
            if task is None:
                raise ApiError(500, f"no such task '{task_id}'")
            return dict(task, log=list(task["log"]))

    def task_status(self, params: dict[str, str], user: str, token: bool, node: str, upid: str) -> Any:
        task = self._task(node, upid)
        return {k: v for k, v in task.items() if k != "log"}

    def task_log(self, params: dict[str, str], user: str, token: bool, node: str, upid: str) -> Any:
        task = self._task(node, upid)
        start = int(params.get("start", "0"))
        limit = int(params.get("limit", "50"))
        return [{"n": i + 1, "t": line} for i, line in enumerate(task["log"])][start : start + limit]


TICKETS: dict[str, tuple[str, str, float]] = {}  # ticket -> (user, csrf token, expiry)


def issue_ticket(user: str) -> dict[str, Any]:
    import secrets

    ticket = f"PVE:{user}:{int(time.time()):08X}::{secrets.token_hex(24)}"
    csrf = f"{int(time.time()):08X}:{secrets.token_hex(16)}"
    TICKETS[ticket] = (user, csrf, time.time() + 7200)
    return {"username": user, "ticket": ticket, "CSRFPreventionToken": csrf, "cap": {}}


def make_handler(api: Api, tokens: dict[str, str], request_log: str) -> type[BaseHTTPRequestHandler]:
    """``tokens`` maps USER@REALM!TOKENID to a token secret and USER@REALM to a password."""

    class Handler(BaseHTTPRequestHandler):
        server_version = "pve-api-daemon/3.0"
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet: the request log is JSONL
            return

        def _send(self, status: int, body: dict[str, Any], reason: str | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status, reason)
            self.send_header("Content-Type", "application/json;charset=UTF-8")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _auth(self, method: str) -> tuple[str, bool]:
            cookies = dict(c.strip().split("=", 1) for c in (self.headers.get("Cookie") or "").split(";") if "=" in c)
            ticket = urllib.parse.unquote(cookies.get("PVEAuthCookie", ""))
            if ticket:
                user, csrf, expiry = TICKETS.get(ticket, ("", "", 0.0))
                if not user or expiry < time.time():
                    raise ApiError(401, "authentication failure")
                if method != "GET" and self.headers.get("CSRFPreventionToken") != csrf:
                    raise ApiError(401, "Permission denied - invalid csrf token")
                return user, False
            header = self.headers.get("Authorization", "")
            m = re.fullmatch(r"PVEAPIToken[= ](?P<user>[^!]+@[^!]+)!(?P<token>[^=]+)=(?P<secret>\S+)", header.strip())
            if not m or tokens.get(f"{m['user']}!{m['token']}") != m["secret"]:
                raise ApiError(401, "authentication failure")
            return m["user"], True

        def _handle(self, method: str) -> None:
            parsed = urllib.parse.urlsplit(self.path)
            params: dict[str, str] = dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                raw = self.rfile.read(length).decode()
                if "json" in (self.headers.get("Content-Type") or ""):
                    params.update({k: str(v) for k, v in json.loads(raw).items()})
                else:
                    params.update(dict(urllib.parse.parse_qsl(raw, keep_blank_values=True)))
            path = parsed.path
            try:
                if not path.startswith("/api2/json/"):
                    raise ApiError(404, "Not Found")
                path = path[len("/api2/json") :].rstrip("/")
                template, handler, groups = api.match(method, path)
                with REQUEST_LOG_LOCK, open(request_log, "a", encoding="utf-8") as fh:
                    logged = {k: ("<secret>" if k == "password" else v) for k, v in {**params, **groups}.items()}
                    fh.write(json.dumps({"method": method, "path": template, "params": logged}) + "\n")
                if template == "/access/ticket":
                    user = params.get("username", "")
                    if "!" in user or not user or tokens.get(user) != params.get("password"):
                        raise ApiError(401, "authentication failure")
                    data = issue_ticket(user)
                else:
                    user, token = self._auth(method)
                    data = handler(params, user, token, **groups)
                self._send(200, {"data": data})
            except ApiError as exc:
                body: dict[str, Any] = {"data": None, "message": str(exc)}
                if exc.errors:
                    body["errors"] = exc.errors
                self._send(exc.status, body, reason=str(exc))
            except Exception as exc:  # an answer, never a hung client
                self._send(500, {"data": None, "message": str(exc)}, reason=str(exc).splitlines()[0][:200])

        def do_GET(self) -> None:
            self._handle("GET")

        def do_POST(self) -> None:
            self._handle("POST")

        def do_PUT(self) -> None:
            self._handle("PUT")

        def do_DELETE(self) -> None:
            self._handle("DELETE")

    return Handler


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="pveapi")
    ap.add_argument("--bind", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8006)
    ap.add_argument("--cert", required=True)
    ap.add_argument("--key", required=True)
    ap.add_argument("--tokens", required=True, help="JSON file: {'USER@REALM!TOKENID': 'SECRET'}")
    ap.add_argument("--pidfile")
    ap.add_argument("--daemon", action="store_true", help="detach: fork, new session, output to --log")
    ap.add_argument("--log", default=os.devnull)
    ap.add_argument("--hop", action="append", default=[], metavar="NODE=PIDFILE",
                    help="a node's ssh hop: the node is online while the sshd of this pid file runs")
    args = ap.parse_args(argv)
    for hop in args.hop:
        node, sep, pidfile = hop.partition("=")
        if not sep or not node or not pidfile:
            ap.error(f"--hop {hop!r}: give NODE=PIDFILE")
        HOPS[node] = pidfile
    with open(args.tokens, encoding="utf-8") as fh:
        tokens = json.load(fh)
    request_log = os.path.join(pct.LAB_ROOT, "pve", "api-requests.jsonl")
    os.makedirs(os.path.dirname(request_log), exist_ok=True)
    api = Api()
    server = ThreadingHTTPServer((args.bind, args.port), make_handler(api, tokens, request_log))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(args.cert, args.key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    if args.daemon:
        if os.fork():
            os._exit(0)  # the caller returns once the socket is bound
        os.setsid()
        log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
    if args.pidfile:
        with open(args.pidfile, "w") as fh:
            fh.write(f"{os.getpid()}\n")
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
