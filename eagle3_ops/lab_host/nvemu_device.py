"""The emulated GPUs' device model: GPUs are device nodes, memory is held by context files that live while any
process keeps them open, and every figure is derived from /proc at each call (see nvemu.py)."""

from __future__ import annotations

import json
import os
import re
import uuid

CTX_DIR = os.environ.get("NVEMU_CTX_DIR", "/run/nvidia-emu/ctx")
DEV_DIR = os.environ.get("NVEMU_DEV_DIR", "/dev")
PROC = os.environ.get("NVEMU_PROC", "/proc")
GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
TOTAL_MIB = 97887
IDLE_MIB = 3  # an idle GPU still reports a few MiB used
IDLE_W = 31.0
LIMIT_W = 600.0
DRIVER = "580.95.05"
CUDA = "13.0"


# ---------------------------------------------------------------------------------------------
# discovery: device nodes, contexts, holders
# ---------------------------------------------------------------------------------------------


def gpu_indices() -> list[int]:
    try:
        names = os.listdir(DEV_DIR)
    except FileNotFoundError:
        return []
    return sorted(int(n[6:]) for n in names if re.fullmatch(r"nvidia\d+", n))


def machine_key() -> str:
    for path in ("/etc/machine-id", "/proc/sys/kernel/hostname"):
        try:
            with open(path) as fh:
                text = fh.read().strip()
            if text:
                return text
        except OSError:
            continue
    return "nvemu"


def gpu_uuid(index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_OID, f"nvemu:{machine_key()}:{index}"))


def bus_id(index: int) -> str:
    return f"00000000:{0x17 + index * 0x10:02X}:00.0"


def _comm(pid: int) -> str:
    try:
        with open(f"{PROC}/{pid}/cmdline", "rb") as fh:
            argv = fh.read().split(b"\0")
        name = argv[0].decode(errors="replace") if argv and argv[0] else ""
        if name:
            return name
        with open(f"{PROC}/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return "[unknown]"


def scan() -> tuple[dict[str, list[int]], dict[int, list[int]]]:
    """Map context file -> holder pids, and GPU index -> pids holding its device node."""
    ctx_holders: dict[str, list[int]] = {}
    dev_holders: dict[int, list[int]] = {}
    ctx_prefix = CTX_DIR.rstrip("/") + "/"
    dev_re = re.compile(re.escape(DEV_DIR.rstrip("/")) + r"/nvidia(\d+)$")
    for entry in os.listdir(PROC):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            fds = os.listdir(f"{PROC}/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{PROC}/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith(ctx_prefix):
                holders = ctx_holders.setdefault(target, [])
                if pid not in holders:
                    holders.append(pid)
            else:
                m = dev_re.match(target)
                if m:
                    holders = dev_holders.setdefault(int(m.group(1)), [])
                    if pid not in holders:
                        holders.append(pid)
    return ctx_holders, dev_holders


def live_contexts() -> list[dict]:
    """Every context with at least one live holder, with the pid nvidia-smi attributes it to."""
    ctx_holders, _unused = scan()
    result = []
    for path, holders in ctx_holders.items():
        try:
            with open(path) as fh:
                ctx = json.load(fh)
        except (OSError, ValueError):
            continue
        owner = ctx.get("pid")
        ctx["holders"] = sorted(holders)
        ctx["pid"] = owner if owner in holders else min(holders)
        result.append(ctx)
    return result


def gpu_state() -> list[dict]:
    contexts = live_contexts()
    gpus = []
    for idx in gpu_indices():
        mine = [c for c in contexts if c.get("gpu") == idx]
        used = IDLE_MIB + sum(int(c.get("mib", 0)) for c in mine)
        used = min(used, TOTAL_MIB)
        util = min(100, sum(int(c.get("util", 0)) for c in mine))
        mem_frac = used / TOTAL_MIB
        power = IDLE_W + (LIMIT_W - IDLE_W) * (0.75 * util / 100 + 0.15 * mem_frac)
        gpus.append(
            {
                "index": idx,
                "uuid": gpu_uuid(idx),
                "name": GPU_NAME,
                "pci.bus_id": bus_id(idx),
                "memory.total": TOTAL_MIB,
                "memory.used": used,
                "memory.free": TOTAL_MIB - used,
                "memory.reserved": 0,
                "utilization.gpu": util,
                "utilization.memory": min(100, int(util * 0.6)),
                "power.draw": round(power, 2),
                "power.limit": LIMIT_W,
                "temperature.gpu": int(32 + util * 0.45),
                "driver_version": DRIVER,
                "count": len(gpu_indices()),
                "contexts": mine,
                "persistence_mode": "Enabled",
                "pstate": "P0" if util else "P8",
            }
        )
    return gpus


# ---------------------------------------------------------------------------------------------
# allocation API for workloads
# ---------------------------------------------------------------------------------------------


class Context:
    """A held allocation: the device node and the context file stay open for the process's life."""

    def __init__(self, gpu: int, mib: int, util: int = 95) -> None:
        self.dev_fd = os.open(f"{DEV_DIR}/nvidia{gpu}", os.O_RDWR)
        os.makedirs(CTX_DIR, mode=0o1777, exist_ok=True)
        path = os.path.join(CTX_DIR, f"{os.getpid()}-{gpu}-{uuid.uuid4().hex[:8]}")
        self.ctx_fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(self.ctx_fd, json.dumps({"gpu": gpu, "mib": mib, "util": util, "pid": os.getpid()}).encode())
        self.path = path

    def release(self) -> None:
        os.close(self.ctx_fd)
        os.close(self.dev_fd)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def alloc(gpu: int, mib: int, util: int = 95) -> Context:
    return Context(gpu, mib, util)


def _open_control_nodes() -> list[int]:
    fds = []
    for name in ("nvidiactl", "nvidia-uvm"):
        try:
            fds.append(os.open(f"{DEV_DIR}/{name}", os.O_RDWR))
        except OSError:
            pass
    return fds
