#!/usr/bin/env python3
"""Where the test command's CPU goes: the machine's whole CPU time and each LXC container's (the labs' engines,
trainers and modules), read from the kernel's cgroup accounting every few seconds while the tests run, so that a
container destroyed mid-run still counts. The rest is the controller's: Ansible, pytest, the ssh hops, the lab's
pct and API. .ci/run starts it beside the tests and prints its summary; where /proc/stat cannot be read it says
"not measured", and where no cgroup accounts for the containers all of the CPU counts as the controller side's.

Usage: python scripts/cpu_split.py --out FILE [--every SECONDS]   (runs until SIGTERM, then writes FILE)
       python scripts/cpu_split.py --show FILE                      (one line: busy %, containers' and the rest's)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

# cgroup v1 (cpuacct: nanoseconds) and v2 (cpu.stat usage_usec: microseconds); LXC names a container's cgroup
# lxc.payload.<name> under either.
V1 = Path("/sys/fs/cgroup/cpuacct")
V2 = Path("/sys/fs/cgroup")


def _v1_read(path: Path) -> float | None:
    try:
        return int((path / "cpuacct.usage").read_text()) / 1e9
    except (OSError, ValueError):
        return None


def _v2_read(path: Path) -> float | None:
    try:
        for line in (path / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    except (OSError, ValueError):
        return None
    return None


def machine_seconds() -> float | None:
    """The CPU seconds of the whole machine (every core) since boot, from /proc/stat."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
        busy = sum(int(x) for x in fields[:8]) - int(fields[3]) - int(fields[4])  # less idle and iowait
    except (OSError, ValueError, IndexError):
        return None
    return busy / os.sysconf("SC_CLK_TCK")


def containers() -> dict[str, float]:
    """Each running container's CPU seconds since it started (none where the kernel keeps no cgroup accounting)."""
    root, read = (V1, _v1_read) if (V1 / "cpuacct.usage").exists() else (V2, _v2_read)
    found: dict[str, float] = {}
    for path in root.glob("lxc.payload.*"):
        seconds = read(path)
        if seconds is not None:
            found[path.name.removeprefix("lxc.payload.")] = seconds
    return found


class Sampler:
    """Accumulates each container's CPU from its samples: a counter that went down is a container started again."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.machine_start = machine_seconds()
        self.machine_last = self.machine_start
        # the containers already running count from now; those started later, from their start
        self.last: dict[str, float] = containers()
        self.total: dict[str, float] = {}

    def sample(self) -> None:
        self.machine_last = machine_seconds()
        for name, seconds in containers().items():
            before = self.last.get(name)
            self.total[name] = self.total.get(name, 0.0) + (seconds if before is None or seconds < before
                                                            else seconds - before)  # fmt: skip
            self.last[name] = seconds

    def result(self) -> dict[str, object]:
        wall = time.monotonic() - self.started
        first, last = self.machine_start, self.machine_last
        machine = last - first if first is not None and last is not None else None
        return {"wall_s": round(wall, 1), "cores": os.cpu_count(), "machine_cpu_s": machine and round(machine, 1),
                "containers_cpu_s": {k: round(v, 1) for k, v in sorted(self.total.items())}}  # fmt: skip


def show(result: dict[str, object]) -> str:
    wall, cores, machine = result["wall_s"], result["cores"], result["machine_cpu_s"]
    per = result["containers_cpu_s"]
    if not (isinstance(machine, (int, float)) and isinstance(wall, (int, float)) and isinstance(cores, int)
            and isinstance(per, dict)):  # fmt: skip
        return "CPU split: not measured (no /proc/stat)"
    inside = sum(per.values())
    busy = 100 * machine / max(wall * max(cores, 1), 1e-9)
    rest = max(machine - inside, 0.0)
    return (f"CPU during the tests: {busy:.0f} % busy of {cores} cores over {wall / 60:.1f} min; {machine / 60:.1f} "
            f"CPU-min in all: the containers {inside / 60:.1f} ({100 * inside / max(machine, 1e-9):.0f} %), the "
            f"controller side (Ansible, pytest, hops) {rest / 60:.1f}")  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--show", type=Path)
    ap.add_argument("--every", type=float, default=5.0)
    args = ap.parse_args()
    if args.show:
        try:
            print(show(json.loads(args.show.read_text())))
        except (OSError, ValueError) as exc:
            print(f"CPU split: not measured ({exc})")
        return
    if not args.out:
        ap.error("--out FILE or --show FILE")
    sampler = Sampler()
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    while not stop:
        sampler.sample()
        deadline = time.monotonic() + args.every
        while not stop and time.monotonic() < deadline:
            time.sleep(0.2)
    sampler.sample()
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(sampler.result()))
    tmp.replace(args.out)


if __name__ == "__main__":
    main()
