"""The lab pct's container configuration: Proxmox's option set and types, the config files under the lab root
(the source of truth, as /etc/pve is), and the per-container lock. Standard library only."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import time
from collections.abc import Iterator
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


def conf_dir(node: str | None = None) -> str:
    """A node's container configs, as /etc/pve/nodes/NODE/lxc is on a PVE cluster (one tree, every node in it)."""
    return os.path.join(LAB_ROOT, "pve", "nodes", node or NODE, "lxc")


def conf_path(vmid: int, node: str | None = None) -> str:
    return os.path.join(conf_dir(node), f"{vmid}.conf")


def cluster_nodes() -> list[str]:
    """The cluster's nodes: EAGLE3_LAB_NODES (comma-separated, the lab's API is told them), else this node."""
    listed = [n for n in os.environ.get("EAGLE3_LAB_NODES", "").split(",") if n]
    return listed or [NODE]


def node_of(vmid: int) -> str | None:
    """The node whose config holds VMID: VMIDs are unique across a cluster."""
    root = os.path.join(LAB_ROOT, "pve", "nodes")
    try:
        nodes = sorted(os.listdir(root))
    except FileNotFoundError:
        return None
    return next((n for n in nodes if os.path.exists(conf_path(vmid, n))), None)


def load_config(vmid: int, node: str | None = None) -> CtConfig:
    path = conf_path(vmid, node)
    try:
        with open(path, encoding="utf-8") as fh:
            return CtConfig.parse(fh.read())
    except FileNotFoundError:
        raise PctError(f"Configuration file 'nodes/{node or NODE}/lxc/{vmid}.conf' does not exist") from None


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
