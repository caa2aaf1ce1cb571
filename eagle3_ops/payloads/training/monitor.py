"""One progress sample of a training job, as a JSON line: attempt, epoch/step, tokens/s and the GPUs.

Reads the launcher's ``attempts.json`` and the current attempt's log (speculators prints
``Training epoch E/N``, ``global_step=S`` and ``profile/tokens_per_s=T``), and ``nvidia-smi`` for memory,
power and utilisation. Power samples of busy GPUs (more than ``--busy-mib`` in use) accumulate in
``STATE/monitor.json``; once ``--min-samples`` are in, a mean draw below ``--low-power`` of the limit adds a
``warning``: the seeds' run at total_seq_len 8192 drew 250-476 W of 600 W and had room for a larger budget.

With ``--steps-per-epoch`` (the plan's), it adds the epoch's and the run's ETA at the step rate measured since the
attempt's first sample.

Usage: python3 -m training.monitor --state DIR [--low-power 0.6] [--steps-per-epoch N]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from typing import Any

try:  # shipped beside this file (a link to the collection's module_utils/_plan.py)
    from ._plan import THROUGHPUT, log_tail
except ImportError:  # pragma: no cover - run as a loose script
    from _plan import THROUGHPUT, log_tail  # type: ignore[no-redef]

try:  # shipped beside this file (a link to the collection's module_utils/_atomic.py)
    from . import _atomic as st
except ImportError:  # pragma: no cover - run as a loose script
    import _atomic as st  # type: ignore[no-redef]

SMI_FIELDS = ("index", "memory.used", "memory.total", "power.draw", "power.limit", "utilization.gpu")


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def gpus() -> list[dict[str, Any]]:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    rows = []
    for line in out.strip().splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) == len(SMI_FIELDS):
            rows.append({k.replace(".", "_"): _num(v) for k, v in zip(SMI_FIELDS, cells, strict=True)})
    return rows


def progress(log_path: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        text = log_tail(log_path)
    except OSError:
        return found
    for pattern, key, cast in ((r"Training epoch (\d+)/(\d+)", "epoch", None),
                               (r"global_step=(\d+)", "step", int),
                               (THROUGHPUT, "tokens_per_s", float)):  # fmt: skip
        matches = re.findall(pattern, text)
        if matches:
            last = matches[-1]
            if key == "epoch":
                found["epoch"], found["epochs"] = int(last[0]), int(last[1])
            elif cast is not None:
                found[key] = cast(last)
    return found


def eta(acc: dict[str, Any], sample: dict[str, Any], steps_per_epoch: int, now: float) -> dict[str, Any]:
    """The epoch's and the run's time to go at the step rate measured since this attempt's first sample (kept in
    ``acc``; a new attempt, or a step count that went back, starts the measure again)."""
    step, epoch, epochs = int(sample["step"]), int(sample.get("epoch") or 1), int(sample["epochs"])
    first = acc.get("rate_from")
    if not first or first.get("attempt") != sample.get("attempt") or step < first["step"]:
        acc["rate_from"] = first = {"attempt": sample.get("attempt"), "step": step, "time": now}
    done = step - (epoch - 1) * steps_per_epoch  # speculators counts global steps across epochs
    if not 0 <= done <= steps_per_epoch:
        done = step % steps_per_epoch
    out: dict[str, Any] = {"steps_per_epoch": steps_per_epoch}
    if now > first["time"] and step > first["step"]:
        rate = (step - first["step"]) / (now - first["time"])
        out["step_s"] = round(1 / rate, 3)
        out["eta_epoch_s"] = int((steps_per_epoch - done) / rate)
        out["eta_s"] = int(((epochs - epoch) * steps_per_epoch + steps_per_epoch - done) / rate)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="monitor", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--state", required=True)
    ap.add_argument("--low-power", type=float, default=0.6, help="warn below this mean fraction of the power limit")
    ap.add_argument("--busy-mib", type=float, default=1024)
    ap.add_argument("--min-samples", type=int, default=3)
    ap.add_argument("--no-record", action="store_true", help="read only (status views): do not add a power sample")
    ap.add_argument("--steps-per-epoch", type=int, default=0,
                    help="the plan's steps per epoch: with it, the epoch's and the run's ETA at the measured step rate")
    args = ap.parse_args(argv)
    sample: dict[str, Any] = {}
    try:
        with open(os.path.join(args.state, "attempts.json"), encoding="utf-8") as fh:
            attempt = json.load(fh)[-1]
        sample.update(attempt=attempt["n"], total_seq_len=attempt["total_seq_len"], cause=attempt["cause"],
                      resume_from_epoch=attempt.get("resume_from_epoch"))  # fmt: skip
        sample.update(progress(os.path.join(args.state, f"attempt-{attempt['n']}.log")))
    except (OSError, ValueError, IndexError, KeyError):
        sample["attempt"] = None
    sample["result"] = os.path.exists(os.path.join(args.state, "result.json"))
    sample["gpus"] = gpus()
    store = os.path.join(args.state, "monitor.json")
    try:
        with open(store, encoding="utf-8") as fh:
            acc = json.load(fh)
    except (OSError, ValueError):
        acc = {"samples": 0, "ratio_sum": 0.0}
    busy = [g for g in sample["gpus"] if (g.get("memory_used") or 0) > args.busy_mib and g.get("power_limit")]
    if busy and not args.no_record:
        acc["samples"] += 1
        acc["ratio_sum"] += sum(g["power_draw"] / g["power_limit"] for g in busy) / len(busy)
        os.makedirs(args.state, exist_ok=True)
        st.write_json_atomic(store, acc)
    if args.steps_per_epoch and sample.get("step") is not None and sample.get("epochs"):
        sample.update(eta(acc, sample, args.steps_per_epoch, time.time()))
        if not args.no_record:
            os.makedirs(args.state, exist_ok=True)
            st.write_json_atomic(store, acc)
    if acc["samples"]:
        mean = acc["ratio_sum"] / acc["samples"]
        sample["mean_power_ratio"] = round(mean, 3)
        if acc["samples"] >= args.min_samples and mean < args.low_power:
            sample["warning"] = (f"the GPUs drew {mean:.0%} of their power limit on average over {acc['samples']} "
                                 f"samples at total_seq_len {sample.get('total_seq_len')}: they are underfed; raise "
                                 "eagle3_train_total_seq_len for the next run")  # fmt: skip
    print(json.dumps(sample))
    return 0


if __name__ == "__main__":
    sys.exit(main())
