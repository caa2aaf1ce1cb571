"""The emulated ``nvidia-smi``: --query-gpu, --query-compute-apps (csv, noheader, nounits) and the default table,
all from the device model."""

from __future__ import annotations

import argparse
import sys
import time

try:  # a package module (tests), or loose files beside each other (in a container)
    from .nvemu_device import CUDA, DRIVER, _comm, gpu_indices, gpu_state
except ImportError:  # pragma: no cover
    from nvemu_device import CUDA, DRIVER, _comm, gpu_indices, gpu_state  # type: ignore[no-redef]

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
