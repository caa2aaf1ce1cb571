#!/usr/bin/env python3
"""Benchmark: PyTorch's OpenMP threads when two processes share the lab's cores (why the lab's containers run their
services with OMP_NUM_THREADS=1: lab_host_container_environment).

The same CPU work - a loop of small matmuls and softmaxes in the shapes of the lab's tiny target (hidden 64) and of a
larger one (hidden 512) - is timed in one process alone with the machine's default thread count and with one thread
(the floor), then in two processes at once, each with the default count and each with one thread. The ratio of two at
once to one alone says what oversubscription costs: two processes on a machine with two free cores should take about
as long as one.

Usage: python benchmarks/bench_threads.py [--python .venv-sglang/bin/python] [--iters 20000]
(any Python with torch: the SGLang environment bootstrap makes has one)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = """
import sys, time, torch
torch.manual_seed(0)
hidden, iters = int(sys.argv[1]), int(sys.argv[2])
weights = [torch.randn(hidden, hidden) for _ in range(12)]
x = torch.randn(128, hidden)
start = time.perf_counter()
for _ in range(iters):
    y = x
    for w in weights:
        y = torch.softmax(torch.nn.functional.silu(y @ w), -1)
print(f"threads={torch.get_num_threads()} seconds={time.perf_counter() - start:.3f}")
"""


def run(python: str, hidden: int, iters: int, threads: int | None, copies: int) -> float:
    """Wall seconds of the slowest of COPIES processes started together (each reports its own loop's time)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    procs = [subprocess.Popen([python, "-c", WORK, str(hidden), str(iters)], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(copies)]  # fmt: skip
    times = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        found = re.search(r"seconds=([\d.]+)", out or "")
        if proc.returncode != 0 or not found:
            sys.exit(f"the benchmark's worker failed (exit {proc.returncode}): is torch installed for {python}?")
        times.append(float(found.group(1)))
    return max(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--python", default=str(ROOT / ".venv-sglang" / "bin" / "python"))
    ap.add_argument("--iters", type=int, default=20000, help="loop iterations at hidden 64 (hidden 512 runs a tenth)")
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"PyTorch threads on {cores} cores ({time.strftime('%Y-%m-%d')}); seconds of the slowest process")
    print("  hidden  one alone, default  one alone, 1 thread  two at once, default  two at once, 1 thread"
          "  two default / one alone  two 1-thread / one alone")
    for hidden, iters in ((64, args.iters), (512, max(args.iters // 10, 1))):
        alone = run(args.python, hidden, iters, None, 1)
        floor = run(args.python, hidden, iters, 1, 1)
        both = run(args.python, hidden, iters, None, 2)
        both_one = run(args.python, hidden, iters, 1, 2)
        print(f"  {hidden:6d}  {alone:18.1f}  {floor:19.1f}  {both:20.1f}  {both_one:21.1f}"
              f"  {both / min(alone, floor):23.2f}  {both_one / min(alone, floor):24.2f}")


if __name__ == "__main__":
    main()
