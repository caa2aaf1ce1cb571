#!/usr/bin/env python3
"""This machine's speed against the reference machine: a fixed CPU micro-benchmark and a fixed disk one, each timed
as the best of a few runs, as factors (the reference's seconds are 1.00; 2.0 means twice as slow), so that times from
different machines can be compared. .ci/run prints it first; docs/timings.md notes which machine measured what.

Usage: python scripts/speed.py [--json] [--dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

# The reference machine's seconds for the work below: the machine the README's times are from (2 cores, AMD EPYC,
# Debian 12, ext4), best of 3, the median of three such measurements on 2026-12-07. A factor is this machine's best
# time over these.
REFERENCE = {"cpu": 0.58, "disk": 0.25}
CPU_LOOPS = 8_000_000
HASH_BYTES = 256 << 20
DISK_BYTES = 256 << 20
SMALL_FILES = 500
CHUNK = 1 << 20


def cpu_work() -> float:
    """One core: a pure-Python loop (the interpreter) and sha256 over 256 MiB (native code, memory)."""
    started = time.perf_counter()
    total = 0
    for i in range(CPU_LOOPS):
        total += i * i % 7
    block = b"\x5a" * CHUNK
    digest = hashlib.sha256()
    for _ in range(HASH_BYTES // CHUNK):
        digest.update(block)
    return time.perf_counter() - started


def disk_work(directory: str) -> float:
    """256 MiB written and fsynced, then read back, and 500 small files created, fsynced and removed (what unpacking
    environments into containers does), in a temporary directory that is removed."""
    block = os.urandom(CHUNK)
    with tempfile.TemporaryDirectory(prefix="eagle3-speed-", dir=directory) as tmp:
        started = time.perf_counter()
        path = os.path.join(tmp, "big")
        with open(path, "wb") as out:
            for _ in range(DISK_BYTES // CHUNK):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
        with open(path, "rb") as back:
            while back.read(CHUNK):
                pass
        for i in range(SMALL_FILES):
            with open(os.path.join(tmp, f"s{i}"), "wb") as small:
                small.write(block[:4096])
                os.fsync(small.fileno())
        for i in range(SMALL_FILES):
            os.unlink(os.path.join(tmp, f"s{i}"))
        return time.perf_counter() - started


def measure(directory: str, runs: int = 3) -> dict[str, float]:
    # The factors from the seconds as printed, so that the figures a reader sees agree with each other.
    cpu = round(min(cpu_work() for _ in range(runs)), 3)
    disk = round(min(disk_work(directory) for _ in range(runs)), 3)
    return {"cpu_s": cpu, "disk_s": disk, "cpu_factor": round(cpu / REFERENCE["cpu"], 2),
            "disk_factor": round(disk / REFERENCE["disk"], 2), "cores": os.cpu_count() or 0}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="one line of JSON instead of the sentence")
    ap.add_argument("--dir", default=str(Path(__file__).resolve().parent.parent), help="where the disk test writes")
    args = ap.parse_args()
    got = measure(args.dir)
    if args.json:
        print(json.dumps(got))
    else:
        print(f"speed factor: CPU {got['cpu_factor']:.2f} ({got['cpu_s']:.2f} s), disk {got['disk_factor']:.2f} "
              f"({got['disk_s']:.2f} s), {got['cores']} cores (1.00 = the reference machine; 2.00 = twice as slow)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
