"""Emulated NVIDIA GPUs for lab containers: the device-node contract, ``nvidia-smi`` and a workload.

Installed inside each lab container (standard library only, Python 3.9+). The emulation follows
the driver's observable contract rather than its internals:

* GPUs are the device nodes ``/dev/nvidia0..N-1`` (bind-mounted from the lab host, like the
  ``lxc.mount.entry`` lines of a real Proxmox GPU container), plus ``nvidiactl`` and ``nvidia-uvm``.
* A process "allocates" memory by opening a node and creating a context: a small file under
  ``/run/nvidia-emu/ctx`` that it keeps open, stating the GPU, MiB and utilisation. A context is
  alive while *any* process holds it open -- so DataLoader children forked after CUDA init keep the
  memory alive after their parent is killed, exactly the orphan problem real cleanups have.
* When the last holder dies the kernel closes its descriptors and the memory is free again:
  ``nvidia-smi`` derives everything from ``/proc/*/fd`` at every call, nothing is cached.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
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
# nvidia-smi
# ---------------------------------------------------------------------------------------------

GPU_FIELDS = {
    "index": ("", "index"),
    "uuid": ("", "uuid"),
    "gpu_uuid": ("", "uuid"),
    "name": ("", "name"),
    "gpu_name": ("", "name"),
    "pci.bus_id": ("", "pci.bus_id"),
    "gpu_bus_id": ("", "pci.bus_id"),
    "memory.total": ("MiB", "memory.total"),
    "memory.used": ("MiB", "memory.used"),
    "memory.free": ("MiB", "memory.free"),
    "memory.reserved": ("MiB", "memory.reserved"),
    "utilization.gpu": ("%", "utilization.gpu"),
    "utilization.memory": ("%", "utilization.memory"),
    "power.draw": ("W", "power.draw"),
    "power.limit": ("W", "power.limit"),
    "temperature.gpu": ("", "temperature.gpu"),
    "driver_version": ("", "driver_version"),
    "count": ("", "count"),
    "persistence_mode": ("", "persistence_mode"),
    "pstate": ("", "pstate"),
}
APP_FIELDS = {
    "gpu_uuid": "",
    "pid": "",
    "process_name": "",
    "used_memory": "MiB",
    "used_gpu_memory": "MiB",
    "gpu_bus_id": "",
    "gpu_name": "",
    "name": "",
}


def _fmt(value: object, unit: str, units: bool) -> str:
    text = f"{value:.2f}" if isinstance(value, float) else str(value)
    return f"{text} {unit}" if units and unit else text


def _csv(header: list[str], rows: list[list[str]], fmt: set[str]) -> str:
    out = []
    if "noheader" not in fmt:
        out.append(", ".join(header))
    out += [", ".join(r) for r in rows]
    return "\n".join(out) + ("\n" if out else "")


def _select(gpus: list[dict], ids: str | None) -> list[dict]:
    if not ids:
        return gpus
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    chosen = []
    for w in wanted:
        match = [g for g in gpus if str(g["index"]) == w or g["uuid"] == w or g["pci.bus_id"] == w]
        if not match:
            raise SystemExit(f"No devices were found matching the ID '{w}'")  # nvidia-smi wording
        chosen += match
    return chosen


def query_gpu(fields: list[str], fmt: set[str], ids: str | None) -> str:
    gpus = _select(gpu_state(), ids)
    units = "nounits" not in fmt
    header: list[str] = []
    rows: list[list[str]] = [[] for _unused in gpus]
    for f in fields:
        unit, key = GPU_FIELDS[f]
        header.append(f"{f} [{unit}]" if unit else f)
        for row, g in zip(rows, gpus, strict=True):
            row.append(_fmt(g[key], unit, units))
    return _csv(header, rows, fmt)


def query_apps(fields: list[str], fmt: set[str], ids: str | None) -> str:
    gpus = _select(gpu_state(), ids)
    units = "nounits" not in fmt
    header = [f"{f} [{APP_FIELDS[f]}]" if APP_FIELDS[f] else f for f in fields]
    rows = []
    for g in gpus:
        for c in g["contexts"]:
            values = {
                "gpu_uuid": g["uuid"],
                "pid": c["pid"],
                "process_name": _comm(c["pid"]),
                "used_memory": int(c.get("mib", 0)),
                "used_gpu_memory": int(c.get("mib", 0)),
                "gpu_bus_id": g["pci.bus_id"],
                "gpu_name": g["name"],
                "name": g["name"],
            }
            rows.append([_fmt(values[f], APP_FIELDS[f], units) for f in fields])
    return _csv(header, rows, fmt)


def table() -> str:
    gpus = gpu_state()
    now = time.strftime("%a %b %d %H:%M:%S %Y")
    rule = "+-----------------------------------------+------------------------+----------------------+"
    out = [
        now,
        "+" + "-" * 87 + "+",
        f"| NVIDIA-SMI {DRIVER}              Driver Version: {DRIVER}      CUDA Version: {CUDA}     |",
        rule,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "=" * 89,
    ]
    for g in gpus:
        out.append(f"| {g['index']:>3}  {g['name'][:24]:<24}      On  | {g['pci.bus_id']:<16} Off | {'Off':>20} |")
        pwr = f"{g['power.draw']:.0f}W /  {g['power.limit']:.0f}W"
        mem = f"{g['memory.used']}MiB / {g['memory.total']}MiB"
        out.append(
            f"| N/A  {g['temperature.gpu']:>3}C    {g['pstate']:<4} {pwr:>18} | {mem:>22} | "
            f"{g['utilization.gpu']:>6}%      Default |"
        )
        out.append(rule)
    out += [
        "",
        "+" + "-" * 87 + "+",
        "| Processes:" + " " * 77 + "|",
        "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "=" * 89,
    ]
    procs = [(g["index"], c) for g in gpus for c in g["contexts"]]
    if not procs:
        out.append("|  No running processes found" + " " * 59 + "|")
    for idx, c in procs:
        name = _comm(c["pid"])[-35:]
        out.append(f"| {idx:>4}   N/A  N/A  {c['pid']:>12}      C   {name:<35} {int(c['mib']):>8}MiB |")
    out.append("+" + "-" * 87 + "+")
    return "\n".join(out) + "\n"


def smi_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi", add_help=True)
    parser.add_argument("--query-gpu", dest="query_gpu")
    parser.add_argument("--query-compute-apps", dest="query_apps")
    parser.add_argument("--format", dest="fmt", default="")
    parser.add_argument("-i", "--id", dest="ids")
    parser.add_argument("-L", "--list-gpus", action="store_true")
    args = parser.parse_args(argv)
    if not gpu_indices():
        print("No devices were found")
        return 6
    try:
        if args.list_gpus:
            for g in gpu_state():
                print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
            return 0
        query, known = (args.query_gpu, GPU_FIELDS) if args.query_gpu else (args.query_apps, APP_FIELDS)
        if query is None:
            sys.stdout.write(table())
            return 0
        fmt = {f.strip() for f in args.fmt.split(",") if f.strip()}
        if "csv" not in fmt:
            print('"--format=" switch is missing. Please try again.')
            return 2
        fields = [f.strip() for f in query.split(",") if f.strip()]
        for f in fields:
            if f not in known:
                print(f'Field "{f}" is not a valid field to query.')
                return 2
        writer = query_gpu if args.query_gpu else query_apps
        sys.stdout.write(writer(fields, fmt, args.ids))
        return 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code)
            return 6
        raise


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


# ---------------------------------------------------------------------------------------------
# lab workload: a torchrun-like job that reproduces the seeds' picture
# ---------------------------------------------------------------------------------------------


def _sleep_forever() -> None:
    while True:
        time.sleep(3600)


def _worker(args: argparse.Namespace) -> None:
    """One rank: its own session (torchrun start_new_session), its GPU, DataLoader-like children."""
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _open_control_nodes()
    Context(args.gpu, args.mib, args.util)
    for _unused in range(args.dataloader_workers):
        if os.fork() == 0:
            # DataLoader worker forked after "CUDA init": inherits the device and context fds.
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _sleep_forever()
    _sleep_forever()


def _job_args(args: argparse.Namespace) -> list[str]:
    """The flags every process of one job shares (agent and workers get them from the launch)."""
    return ["--mib", str(args.mib), "--util", str(args.util), "--dataloader-workers", str(args.dataloader_workers),
            "--tag", args.tag, "--max-restarts", str(args.max_restarts)]  # fmt: skip


def _agent(args: argparse.Namespace) -> None:
    workers: list[subprocess.Popen] = []
    me = [sys.executable, os.path.realpath(__file__), "workload"]

    def forward(signum: int, _frame: object) -> None:
        for w in workers:
            try:
                os.kill(w.pid, signum)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(w.poll() is None for w in workers):
            time.sleep(0.05)
        os._exit(128 + signum)

    def spawn(rank: int, gpu: int) -> subprocess.Popen:
        cmd = [*me, "--role", "worker", "--gpu", str(gpu), "--rank", str(rank), *_job_args(args)]
        if rank in args.ignore_term_ranks:
            cmd.append("--ignore-term")
        return subprocess.Popen(cmd, start_new_session=True, stdin=subprocess.DEVNULL)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    workers.extend(spawn(rank, gpu) for rank, gpu in enumerate(args.gpus))
    restarts = 0
    while True:
        for rank, w in enumerate(workers):
            if w.poll() is None:
                continue
            # torchrun's elastic agent: a dead worker is restarted while --max-restarts allows, and only the
            # agent's own SIGTERM ends the job for good -- why a cleanup must stop the agent first.
            if restarts < args.max_restarts:
                restarts += 1
                workers[rank] = spawn(rank, args.gpus[rank])
            else:
                forward(signal.SIGTERM, None)
        time.sleep(0.2)


def _ranks(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out += list(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out


def workload_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="lab-workload", description="Start a torchrun-like GPU workload.")
    p.add_argument("--role", choices=["launch", "agent", "worker", "bystander", "observer"], default="launch")
    p.add_argument("--gpus", type=_ranks, default=None, help="GPU indices, e.g. 0-3 (default: all)")
    p.add_argument("--gpu", type=int, default=0)
    p.add_argument("--mib", type=int, default=30000, help="MiB each worker holds on its GPU")
    p.add_argument("--util", type=int, default=95)
    p.add_argument("--dataloader-workers", type=int, default=2)
    p.add_argument("--ignore-term-ranks", type=_ranks, default=[], help="ranks whose worker ignores SIGTERM")
    p.add_argument("--ignore-term", action="store_true")
    p.add_argument("--bystander", action="store_true", help="also start an unrelated python3 holding no GPU")
    p.add_argument("--observer", action="store_true",
                   help="also start a monitor that holds every device node open with no context (an NVML exporter)")
    p.add_argument("--max-restarts", type=int, default=0, help="times the agent restarts a dead worker (torchrun)")
    p.add_argument("--tag", default="lab-train", help="marker in every command line of this job")
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--foreground", action="store_true", help="run the agent in the foreground")
    p.add_argument("--pidfile", default=None)
    args = p.parse_args(argv)
    if args.gpus is None:
        args.gpus = gpu_indices()
    for g in args.gpus:
        if not os.path.exists(f"{DEV_DIR}/nvidia{g}"):
            p.error(f"GPU {g} has no device node {DEV_DIR}/nvidia{g}; choose from {gpu_indices()}")
    if args.role == "worker":
        _worker(args)
    elif args.role == "agent":
        _agent(args)
    elif args.role == "bystander":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _sleep_forever()
    elif args.role == "observer":
        # What an NVML exporter looks like to the kernel: device nodes open, no context, no memory.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _held = [os.open(f"{DEV_DIR}/nvidia{g}", os.O_RDWR) for g in gpu_indices()] + _open_control_nodes()
        _sleep_forever()
    else:
        me = [sys.executable, os.path.realpath(__file__), "workload"]
        passthrough = ["--gpus", ",".join(map(str, args.gpus)), "--ignore-term-ranks",
                       ",".join(map(str, args.ignore_term_ranks)), *_job_args(args)]  # fmt: skip
        if args.foreground:
            args.role = "agent"
            _agent(args)
        pids = {}
        agent = subprocess.Popen(
            [*me, "--role", "agent", *passthrough],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        pids["agent"] = agent.pid
        # Processes of their own that are not the job: a python3 holding nothing, an exporter holding device nodes.
        extras = ((args.bystander, "bystander", "-bystander"), (args.observer, "observer", "-exporter"))
        for wanted, role, suffix in extras:
            if wanted:
                pids[role] = subprocess.Popen(
                    [*me, "--role", role, "--tag", args.tag + suffix],
                    start_new_session=True,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ).pid
        # Wait until every worker's context is visible, so callers can measure right away.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            holders = {c["gpu"] for c in live_contexts() if c.get("mib") == args.mib}
            if set(args.gpus) <= holders:
                break
            time.sleep(0.1)
        else:
            print("workers did not allocate their GPUs within 20 s", file=sys.stderr)
            return 1
        if args.pidfile:
            with open(args.pidfile, "w") as fh:
                json.dump(pids, fh)
        print(json.dumps(pids))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = os.path.basename(sys.argv[0])
    if prog == "nvidia-smi":
        return smi_main(argv)
    if prog == "lab-workload":
        return workload_main(argv)
    if argv and argv[0] == "smi":
        return smi_main(argv[1:])
    if argv and argv[0] == "workload":
        return workload_main(argv[1:])
    print("usage: nvemu.py smi|workload ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
