"""A ``pct``-compatible CLI for the local lab: Proxmox's container tool over plain LXC.

Implements the subset of ``pct`` that eagle3-ops uses -- list, status, start, stop, shutdown, create,
destroy, config, set, exec, push, pull -- with Proxmox's argument forms, messages and exit codes:
a failed command prints one line on stderr and exits 255, as PVE::CLIHandler does.

Container state lives where Proxmox keeps it, scaled down to a lab root:
``$EAGLE3_LAB_ROOT/pve/nodes/<node>/lxc/<vmid>.conf`` is the source of truth (the file that takes raw
``lxc.*`` lines), and ``/var/lib/lxc/<vmid>/config`` is generated from it at every start, like
pve-container does. Standard library only: this file is installed on the lab host as ``pct``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

LAB_ROOT = os.environ.get("EAGLE3_LAB_ROOT", "/var/lib/eagle3-lab")
NODE = os.environ.get("EAGLE3_LAB_NODE", "pve-lab")
LXC_PATH = os.environ.get("EAGLE3_LAB_LXC_PATH", "/var/lib/lxc")
VZTMPL_DIR = os.environ.get("EAGLE3_LAB_VZTMPL", "/var/cache/eagle3-lab/vztmpl")
CLONE_NEWNS = 0x00020000

# Options `pct create` / `pct set` accept, with their PVE schema types (subset of
# /nodes/{node}/lxc POST and /nodes/{node}/lxc/{vmid}/config PUT).
OPTION_TYPES: dict[str, str] = {
    "arch": "string",
    "cmode": "string",
    "cores": "integer",
    "cpulimit": "number",
    "cpuunits": "integer",
    "description": "string",
    "features": "string",
    "hostname": "string",
    "memory": "integer",
    "nameserver": "string",
    "onboot": "boolean",
    "ostype": "string",
    "protection": "boolean",
    "rootfs": "string",
    "searchdomain": "string",
    "startup": "string",
    "swap": "integer",
    "tags": "string",
    "timezone": "string",
    "unprivileged": "boolean",
}
INDEXED_OPTIONS = ("net", "mp", "dev", "unused")
CREATE_ONLY = {"unprivileged"}


class PctError(Exception):
    """A failure reported the way PVE's CLI handler does: message on stderr, exit 255."""

    def __init__(self, message: str, usage: str | None = None) -> None:
        super().__init__(message)
        self.usage = usage


def _param_error(name: str, problem: str, usage: str) -> PctError:
    return PctError(f"400 Parameter verification failed.\n{name}: {problem}", usage)


# --------------------------------------------------------------------------------------------
# configuration files
# --------------------------------------------------------------------------------------------


@dataclass
class CtConfig:
    """A parsed ``<vmid>.conf``: ordered options, raw ``lxc.*`` pairs (repeats kept), description."""

    options: dict[str, str] = field(default_factory=dict)
    lxc: list[tuple[str, str]] = field(default_factory=list)
    description: str = ""

    @classmethod
    def parse(cls, text: str) -> CtConfig:
        conf = cls()
        desc: list[str] = []
        for line in text.splitlines():
            if line.startswith("#"):
                desc.append(_unescape(line[1:]))
                continue
            if not line.strip():
                continue
            if line.startswith("["):  # snapshot sections: the lab takes none
                break
            key, _unused, value = line.partition(":")
            key, value = key.strip(), value.strip()
            if key.startswith("lxc."):
                conf.lxc.append((key, value))
            else:
                conf.options[key] = value
        conf.description = "\n".join(desc)
        return conf

    def render(self) -> str:
        lines = [f"#{_escape(d)}" for d in self.description.split("\n")] if self.description else []
        lines += [f"{k}: {v}" for k, v in sorted(self.options.items())]
        lines += [f"{k}: {v}" for k, v in self.lxc]
        return "\n".join(lines) + "\n"


def _escape(text: str) -> str:
    return re.sub(r"[%\x00-\x1f]", lambda m: f"%{ord(m.group()):02X}", text)


def _unescape(text: str) -> str:
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), text)


def conf_dir() -> str:
    return os.path.join(LAB_ROOT, "pve", "nodes", NODE, "lxc")


def conf_path(vmid: int) -> str:
    return os.path.join(conf_dir(), f"{vmid}.conf")


def load_config(vmid: int) -> CtConfig:
    path = conf_path(vmid)
    try:
        with open(path, encoding="utf-8") as fh:
            return CtConfig.parse(fh.read())
    except FileNotFoundError:
        raise PctError(f"Configuration file 'nodes/{NODE}/lxc/{vmid}.conf' does not exist") from None


def write_config(vmid: int, conf: CtConfig) -> None:
    os.makedirs(conf_dir(), exist_ok=True)
    path = conf_path(vmid)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(conf.render())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def config_lock(vmid: int, timeout: float = 10.0) -> Iterator[None]:
    """flock the container's config like PVE::LXC::Config->lock_config, with its timeout message."""
    lock_dir = os.path.join(LAB_ROOT, "lock")
    os.makedirs(lock_dir, exist_ok=True)
    with open(os.path.join(lock_dir, f"pve-config-{vmid}.lock"), "a") as fh:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise PctError(f"can't lock file '/run/lock/lxc/pve-config-{vmid}.lock' - got timeout") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# --------------------------------------------------------------------------------------------
# LXC plumbing
# --------------------------------------------------------------------------------------------


def ct_dir(vmid: int) -> str:
    return os.path.join(LXC_PATH, str(vmid))


def rootfs_dir(vmid: int) -> str:
    return os.path.join(ct_dir(vmid), "rootfs")


def init_pid(vmid: int) -> int | None:
    """PID of the container's init on the host, or None when it is not running."""
    proc = subprocess.run(
        ["lxc-info", "-P", LXC_PATH, "-n", str(vmid), "-p", "-H"],
        capture_output=True,
        text=True,
        check=False,
    )
    text = proc.stdout.strip()
    return int(text) if proc.returncode == 0 and text.isdigit() else None


def is_running(vmid: int) -> bool:
    return init_pid(vmid) is not None


def render_lxc_config(vmid: int, conf: CtConfig) -> str:
    """The LXC config pve-container would generate at start, for a privileged dir-backed container."""
    hostname = conf.options.get("hostname", f"CT{vmid}")
    lines = [
        "# generated by the eagle3-ops lab pct from "
        f"nodes/{NODE}/lxc/{vmid}.conf at every start; edit that file instead",
        # Proxmox includes debian.common.conf, which Debian ships in lxc-templates; the lab needs only what
        # it derives from: common.conf (package lxc itself) and its one Debian line (consoles not in /dev/lxc).
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.tty.dir =",
        f"lxc.arch = {'amd64' if conf.options.get('arch', 'amd64') == 'amd64' else conf.options['arch']}",
        f"lxc.uts.name = {hostname}",
        f"lxc.rootfs.path = dir:{rootfs_dir(vmid)}",
        # The lab host has no bridge: containers get loopback only; the hypervisor path (pct exec)
        # is how everything reaches them, which is exactly what eagle3-ops relies on.
        "lxc.net.0.type = empty",
        "lxc.apparmor.profile = unconfined",
        "lxc.tty.max = 2",
        "lxc.pty.max = 1024",
    ]
    lines += mount_point_lines(vmid, conf)
    lines += [f"{k} = {v}" for k, v in conf.lxc]
    return "\n".join(lines) + "\n"


def _field(text: str, bare_key: str) -> tuple[str, str]:
    """One ``key=value`` field of a Proxmox property string; a bare value is the property's default key."""
    key, sep, value = text.partition("=")
    return (key, value) if sep else (bare_key, text)


def mount_point_lines(vmid: int, conf: CtConfig) -> list[str]:
    """LXC lines for mpN (bind mounts / lab volumes) and devN (device passthrough).

    mpN: ``/host/dir,mp=/path[,ro=1]`` binds a host directory; ``STORAGE:SIZE,mp=/path`` gets a lab
    volume directory under the lab root. devN: ``[path=]/dev/x[,uid=,gid=,mode=]`` binds the device
    node. Real PVE mounts devN at the same path inside; the lab's emulated GPU nodes live outside
    /dev, so the lab binds them to ``/dev/<name>``.
    """
    lines = []
    for key in sorted(conf.options):
        value = conf.options[key]
        if re.fullmatch(r"mp\d+", key):
            fields = dict(_field(f, "volume") for f in value.split(","))
            volume, target = fields.get("volume", ""), fields.get("mp", "")
            if not target.startswith("/"):
                continue
            if not volume.startswith("/"):
                volume = os.path.join(LAB_ROOT, "volumes", f"vm-{vmid}-{key}")
                os.makedirs(volume, exist_ok=True)
            opts = "bind,create=dir" + (",ro" if fields.get("ro") in ("1", "true") else "")
            lines.append(f"lxc.mount.entry = {volume} {target.lstrip('/')} none {opts} 0 0")
        elif re.fullmatch(r"dev\d+", key):
            fields = dict(_field(f, "path") for f in value.split(","))
            path = fields.get("path", "")
            if path.startswith("/"):
                lines.append(f"lxc.mount.entry = {path} dev/{os.path.basename(path)} none bind,optional,create=file")
    return lines


def setup_guest(vmid: int, conf: CtConfig) -> None:
    """What pve-container's setup does at start for the parts the lab uses: hostname and hosts."""
    root = rootfs_dir(vmid)
    hostname = conf.options.get("hostname", f"CT{vmid}")
    etc = os.path.join(root, "etc")
    # Refuse to follow symlinks the guest may have planted: these writes happen host-side.
    for name, content in (
        ("hostname", f"{hostname}\n"),
        ("hosts", f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n::1 localhost ip6-localhost ip6-loopback\n"),
    ):
        path = os.path.join(etc, name)
        if os.path.islink(path):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(content)


# --------------------------------------------------------------------------------------------
# argument parsing in PVE's style: positional args, then -opt/--opt value pairs
# --------------------------------------------------------------------------------------------


@dataclass
class Command:
    name: str
    positional: list[str]
    usage: str
    handler: Callable[[list[str], dict[str, str], list[str]], int]
    options: dict[str, str] = field(default_factory=dict)  # name -> type
    extra_args: bool = False


def parse_args(cmd: Command, argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    pos: list[str] = []
    opts: dict[str, str] = {}
    extra: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" and cmd.extra_args:
            extra = argv[i + 1 :]
            break
        if arg.startswith("-") and len(arg) > 1 and not arg.lstrip("-").isdigit():
            name = arg.lstrip("-")
            value: str | None = None
            if "=" in name:
                name, value = name.split("=", 1)
            otype = _option_type(cmd, name)
            if otype is None:
                raise _param_error(
                    name,
                    "property is not defined in schema and the schema does not allow additional properties",
                    cmd.usage,
                )
            if value is None:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if otype == "boolean" and (
                    nxt is None or nxt not in ("0", "1", "yes", "no", "true", "false", "on", "off")
                ):
                    value = "1"
                elif nxt is None:
                    raise _param_error(name, "missing value", cmd.usage)
                else:
                    value = nxt
                    i += 1
            if name in opts and name != "delete":
                raise _param_error(name, "duplicate parameter", cmd.usage)
            opts[name] = _check_type(name, otype, value, cmd.usage)
        elif cmd.extra_args and len(pos) == len(cmd.positional):
            extra = argv[i:]
            break
        else:
            pos.append(arg)
        i += 1
    if len(pos) < len(cmd.positional):
        missing = cmd.positional[len(pos)]
        raise _param_error(missing, "property is missing and it is not optional", cmd.usage)
    if len(pos) > len(cmd.positional):
        raise PctError("400 too many arguments", cmd.usage)
    return pos, opts, extra


def _option_type(cmd: Command, name: str) -> str | None:
    if name in cmd.options:
        return cmd.options[name]
    if cmd.options.get("*") == "ct-options":
        if name in OPTION_TYPES:
            return OPTION_TYPES[name]
        m = re.fullmatch(r"([a-z]+)(\d+)", name)
        if m and m.group(1) in INDEXED_OPTIONS and int(m.group(2)) < 256:
            return "string"
    return None


def _check_type(name: str, otype: str, value: str, usage: str) -> str:
    if otype == "integer" and not re.fullmatch(r"-?\d+", value):
        raise _param_error(name, f"type check ('integer') failed - got '{value}'", usage)
    if otype == "number" and not re.fullmatch(r"-?\d+(\.\d+)?", value):
        raise _param_error(name, f"type check ('number') failed - got '{value}'", usage)
    if otype == "boolean":
        table = {"1": "1", "yes": "1", "true": "1", "on": "1", "0": "0", "no": "0", "false": "0", "off": "0"}
        if value.lower() not in table:
            raise _param_error(name, f"type check ('boolean') failed - got '{value}'", usage)
        return table[value.lower()]
    return value


def parse_vmid(text: str, usage: str) -> int:
    if not re.fullmatch(r"[1-9]\d*", text) or not 100 <= int(text) <= 999_999_999:
        raise _param_error("vmid", "invalid format - value does not look like a valid VM ID", usage)
    return int(text)


# --------------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------------


def all_vmids() -> list[int]:
    try:
        names = os.listdir(conf_dir())
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if re.fullmatch(r"\d+\.conf", n))


def cmd_list(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    rows = []
    for vmid in all_vmids():
        conf = load_config(vmid)
        state = "running" if is_running(vmid) else "stopped"
        rows.append((vmid, state, conf.options.get("lock", ""), conf.options.get("hostname", "")))
    if rows:
        fmt = "%-10s %-10s %-12s %-20s"
        print((fmt % ("VMID", "Status", "Lock", "Name")).rstrip())
        for row in rows:
            print((fmt % row).rstrip())
    return 0


def cmd_status(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["status"])
    conf = load_config(vmid)
    pid = init_pid(vmid)
    if opts.get("verbose") == "1":
        stat = {
            "status": "running" if pid else "stopped",
            "vmid": str(vmid),
            "name": conf.options.get("hostname", ""),
            "cpus": conf.options.get("cores", "1"),
            "maxmem": str(int(conf.options.get("memory", "512")) * 1024 * 1024),
            "maxswap": str(int(conf.options.get("swap", "512")) * 1024 * 1024),
            "type": "lxc",
        }
        if pid:
            stat["pid"] = str(pid)
        for key in sorted(stat):
            print(f"{key}: {stat[key]}")
    else:
        print(f"status: {'running' if pid else 'stopped'}")
    return 0


def _start(vmid: int, conf: CtConfig) -> None:
    with open(os.path.join(ct_dir(vmid), "config"), "w", encoding="utf-8") as fh:
        fh.write(render_lxc_config(vmid, conf))
    setup_guest(vmid, conf)
    log = os.path.join(LAB_ROOT, "log", f"lxc-{vmid}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    proc = subprocess.run(
        ["lxc-start", "-P", LXC_PATH, "-n", str(vmid), "-d", "-o", log, "-l", "WARN"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not _wait_state(vmid, "RUNNING", 30):
        detail = (proc.stderr.strip().splitlines() or ["see " + log])[-1]
        raise PctError(f"startup for container '{vmid}' failed: {detail}")


def _wait_state(vmid: int, state: str, timeout: float) -> bool:
    proc = subprocess.run(
        ["lxc-wait", "-P", LXC_PATH, "-n", str(vmid), "-s", state, "-t", str(int(timeout))],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def cmd_start(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["start"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if is_running(vmid):
            raise PctError(f"CT {vmid} already running")
        _start(vmid, conf)
    return 0


def _stop(vmid: int, timeout: int | None) -> None:
    """lxc-stop: a clean shutdown within timeout when one is given, otherwise an immediate kill."""
    args = ["lxc-stop", "-P", LXC_PATH, "-n", str(vmid)]
    args += ["-t", str(timeout)] if timeout is not None else ["-k"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if is_running(vmid):
        raise PctError(f"stopping CT {vmid} failed: {proc.stderr.strip() or 'still running'}")


def cmd_stop(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["stop"])
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError(f"CT {vmid} not running")
        _stop(vmid, None)
    return 0


def cmd_shutdown(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["shutdown"])
    timeout = int(opts.get("timeout", "60"))
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError(f"CT {vmid} not running")
        args = ["lxc-stop", "-P", LXC_PATH, "-n", str(vmid), "-t", str(timeout)]
        subprocess.run(args, capture_output=True, check=False)
        if is_running(vmid):
            if opts.get("forceStop") == "1":
                _stop(vmid, None)
            else:
                raise PctError(f"shutdown of CT {vmid} timed out after {timeout}s (use --forceStop 1)")
    return 0


def resolve_template(volid: str) -> str:
    if volid.startswith("/"):
        path = volid
    else:
        storage, _unused, rest = volid.partition(":")
        kind, _unused, name = rest.partition("/")
        if storage != "local" or kind != "vztmpl" or not name or "/" in name:
            raise PctError(f"unable to parse volume ID '{volid}'")
        path = os.path.join(VZTMPL_DIR, name)
    if not os.path.isfile(path):
        raise PctError(f"volume '{volid}' does not exist")
    return path


def cmd_create(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["create"])
    with config_lock(vmid):
        if os.path.exists(conf_path(vmid)) or os.path.exists(ct_dir(vmid)):
            raise PctError(f"CT {vmid} already exists on node '{NODE}'")
        template = resolve_template(pos[1])
        conf = CtConfig()
        conf.description = opts.pop("description", "")
        start = opts.pop("start", "0") == "1"
        conf.options.update(
            {"arch": "amd64", "ostype": "debian", "memory": "512", "swap": "512", "hostname": f"CT{vmid}"}
        )
        conf.options.update(opts)
        conf.options.setdefault("rootfs", f"lab:subvol-{vmid}-disk-0,size=8G")
        os.makedirs(conf_dir(), exist_ok=True)
        root = rootfs_dir(vmid)
        try:
            os.makedirs(root)
            print(f"extracting archive '{template}'")
            # GNU tar keeps owners, modes, devices and xattrs of the rootfs; it is several times
            # faster than tarfile on the ~15k files of a Debian rootfs.
            proc = subprocess.run(
                ["tar", "-xpf", template, "-C", root, "--numeric-owner"], capture_output=True, text=True, check=False
            )
            if proc.returncode != 0:
                raise PctError(f"unable to extract '{template}': {proc.stderr.strip()}")
            print("Detected container architecture: amd64")
            write_config(vmid, conf)
        except BaseException:
            shutil.rmtree(ct_dir(vmid), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(conf_path(vmid))
            raise
        if start:
            _start(vmid, conf)
    return 0


def cmd_destroy(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["destroy"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if conf.options.get("protection") == "1":
            raise PctError(f"can't remove CT {vmid} - protection mode enabled")
        if is_running(vmid):
            if opts.get("force") != "1":
                raise PctError(f"unable to destroy CT {vmid} - container is running")
            _stop(vmid, None)
        if os.path.exists(ct_dir(vmid)):
            shutil.rmtree(ct_dir(vmid))
        os.unlink(conf_path(vmid))
    return 0


def cmd_config(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["config"])
    conf = load_config(vmid)
    options = dict(conf.options)
    if conf.description:
        options["description"] = conf.description
    for key in sorted(options):
        value = options[key]
        if key == "description":
            value = _escape(value)
        print(f"{key}: {value}")
    for key, value in conf.lxc:
        print(f"{key}: {value}")
    return 0


def cmd_set(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["set"])
    delete = [d for d in re.split(r"[,;\s]+", opts.pop("delete", "")) if d]
    for key in list(opts) + delete:
        if key in CREATE_ONLY:
            raise _param_error(key, "unable to modify read-only option", USAGE["set"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if conf.options.get("lock"):
            raise PctError(f"CT {vmid} is locked ({conf.options['lock']})")
        if "description" in opts:
            conf.description = opts.pop("description")
        conf.options.update(opts)
        for key in delete:
            if key == "description":
                conf.description = ""
            conf.options.pop(key, None)
        write_config(vmid, conf)
    return 0


def cmd_exec(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["exec"])
    load_config(vmid)
    if not is_running(vmid):
        raise PctError(f"container '{vmid}' not running!")
    if not extra:
        raise PctError("missing command")
    keep_env = opts.get("keep-env", "1") == "1"
    args = ["lxc-attach", "-P", LXC_PATH, "-n", str(vmid), "--keep-env" if keep_env else "--clear-env", "--", *extra]
    sys.stdout.flush()
    os.execvp(args[0], args)  # noqa: S606 -- pct exec replaces itself with lxc-attach, as Proxmox does
    return 0  # not reached


def _libc_setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        raise PctError("failed to enter the container's mount namespace")


def _lookup_id(db: str, name: str, what: str) -> int:
    if name.isdigit():
        return int(name)
    with contextlib.suppress(FileNotFoundError), open(db, encoding="utf-8") as fh:
        for line in fh:
            parts = line.rstrip("\n").split(":")
            if len(parts) > 2 and parts[0] == name:
                return int(parts[2])
    raise PctError(f"failed to get {what} for: {name}")


def create_file(path: str, perms: str | None, user: str | None, group: str | None) -> int:
    """Open ``path`` for writing like pve-container's create_file: explicit perms, owner by name or id.

    Names resolve in the namespace we are in (the container's, for push). O_NOFOLLOW is not used on
    purpose: inside the container's mount namespace a symlink can only point inside the container.
    """
    uid = _lookup_id("/etc/passwd", user, "uid") if user is not None else -1
    gid = _lookup_id("/etc/group", group, "gid") if group is not None else -1
    mode: int | None = None
    if perms is not None:
        text = perms if perms.startswith("0") else "0" + perms
        try:
            mode = int(text, 16) if text.lower().startswith("0x") else int(text, 8)
        except ValueError:
            raise PctError(f"invalid mode: '{text}'") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            raise PctError(f"failed to create file: {path}: {exc.strerror}") from None
    except OSError as exc:
        raise PctError(f"failed to create file: {path}: {exc.strerror}") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid != -1 or gid != -1:
        try:
            os.fchown(fd, uid, gid)
        except OSError as exc:
            raise PctError(f"failed to change file owner: {exc.strerror}") from None
    return fd


def _copy_fd(src: int, dst: int) -> None:
    """Kernel-side copy, constant memory; falls back to read/write for pipes and special files."""
    offset = 0
    try:
        while True:
            sent = os.sendfile(dst, src, offset, 1 << 24)
            if sent == 0:
                return
            offset += sent
    except OSError:
        if offset:
            raise
    while chunk := os.read(src, 1 << 20):
        os.write(dst, chunk)


def _in_container(vmid: int, work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child that entered the container's mount namespace."""
    pid = init_pid(vmid)
    if pid is None:
        raise PctError(f"container '{vmid}' not running!")
    ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    child = os.fork()
    if child == 0:
        code = 0
        try:
            _libc_setns(ns_fd)
            os.close(ns_fd)
            os.chdir("/")
            work()
        except PctError as exc:
            print(exc, file=sys.stderr)
            code = 255
        except OSError as exc:
            print(f"{exc.strerror}: {exc.filename}" if exc.filename else str(exc), file=sys.stderr)
            code = 255
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(ns_fd)
    _unused, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)


def cmd_push(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["push"])
    src_path, dest = pos[1], pos[2]
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError("can only push files to a running CT")
        try:
            src = os.open(src_path, os.O_RDONLY)
        except OSError:
            raise PctError(f"failed to open {src_path} for reading") from None

        def work() -> None:
            dst = create_file(dest, opts.get("perms"), opts.get("user"), opts.get("group"))
            _copy_fd(src, dst)
            os.close(dst)

        try:
            return _in_container(vmid, work)
        finally:
            os.close(src)


def cmd_pull(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["pull"])
    path, dest = pos[1], pos[2]
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError("can only pull files from a running VM")
        dst = create_file(dest, opts.get("perms"), opts.get("user"), opts.get("group"))

        def work() -> None:
            try:
                src = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise PctError(f"failed to open {path}: {exc.strerror}") from None
            _copy_fd(src, dst)

        try:
            return _in_container(vmid, work)
        finally:
            os.close(dst)


USAGE = {
    "list": "pct list",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "create": "pct create <vmid> <ostemplate> [OPTIONS]",
    "destroy": "pct destroy <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "set": "pct set <vmid> [OPTIONS]",
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
}
_FILE_OPTS = {"user": "string", "group": "string", "perms": "string"}
COMMANDS = {
    "list": Command("list", [], USAGE["list"], cmd_list),
    "status": Command("status", ["vmid"], USAGE["status"], cmd_status, {"verbose": "boolean"}),
    "start": Command("start", ["vmid"], USAGE["start"], cmd_start, {"skiplock": "boolean", "debug": "boolean"}),
    "stop": Command("stop", ["vmid"], USAGE["stop"], cmd_stop, {"skiplock": "boolean", "overrule-shutdown": "boolean"}),
    "shutdown": Command(
        "shutdown", ["vmid"], USAGE["shutdown"], cmd_shutdown, {"timeout": "integer", "forceStop": "boolean"}
    ),
    "create": Command(
        "create",
        ["vmid", "ostemplate"],
        USAGE["create"],
        cmd_create,
        {"*": "ct-options", "start": "boolean", "storage": "string", "password": "string"},
    ),
    "destroy": Command(
        "destroy",
        ["vmid"],
        USAGE["destroy"],
        cmd_destroy,
        {"force": "boolean", "purge": "boolean", "destroy-unreferenced-disks": "boolean"},
    ),
    "config": Command("config", ["vmid"], USAGE["config"], cmd_config, {"current": "boolean", "snapshot": "string"}),
    "set": Command(
        "set",
        ["vmid"],
        USAGE["set"],
        cmd_set,
        {"*": "ct-options", "delete": "string", "digest": "string", "revert": "string"},
    ),
    "exec": Command("exec", ["vmid"], USAGE["exec"], cmd_exec, {"keep-env": "boolean"}, extra_args=True),
    "push": Command("push", ["vmid", "file", "destination"], USAGE["push"], cmd_push, dict(_FILE_OPTS)),
    "pull": Command("pull", ["vmid", "path", "destination"], USAGE["pull"], cmd_pull, dict(_FILE_OPTS)),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]")
        for usage in USAGE.values():
            print(f"       {usage}")
        return 0 if argv else 255
    name = argv.pop(0)
    cmd = COMMANDS.get(name)
    if cmd is None:
        print(f"ERROR: unknown command 'pct {name}'", file=sys.stderr)
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]", file=sys.stderr)
        return 255
    if os.geteuid() != 0:
        print("only root can run this command", file=sys.stderr)
        return 255
    try:
        pos, opts, extra = parse_args(cmd, argv)
        return cmd.handler(pos, opts, extra)
    except PctError as exc:
        print(str(exc).rstrip("\n"), file=sys.stderr)
        if exc.usage:
            print(f"\n{exc.usage}", file=sys.stderr)
        return 255
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141


if __name__ == "__main__":
    sys.exit(main())
