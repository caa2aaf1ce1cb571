"""The supervised training job: budget back-off on out-of-memory, resume from complete checkpoints.

Runs as the ExecStart of the training unit inside the container:

    python3 -m training.launcher --save-dir SAVE --state STATE --start 32768 -- \\
        torchrun --standalone --nproc_per_node 4 -m speculators.train ... --total-seq-len {total_seq_len}

Before every attempt, partial epoch directories are set aside so the trainer resumes from the newest
complete epoch. An attempt that dies of out-of-memory is recorded and the next budget down the ladder is
tried; any other failure ends the launcher with the trainer's exit code (systemd restarts it, and it
resumes with the same budget). ``STATE/attempts.json`` keeps every attempt and its cause across
restarts; ``STATE/result.json`` gets the per-epoch accuracies and tau at the end. SIGTERM is passed to
the trainer's process group so a stop is graceful.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections import deque
from typing import Any

try:
    from . import budget as budgets
    from . import checkpoints, metrics
except ImportError:  # pragma: no cover - run as a loose script
    import budget as budgets  # type: ignore[no-redef]
    import checkpoints  # type: ignore[no-redef]
    import metrics  # type: ignore[no-redef]

EXIT_LADDER_EXHAUSTED = 3


def _load_attempts(state: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(state, "attempts.json"), encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return []


def log(message: str) -> None:
    print(f"[launcher] {message}", flush=True)


def run_attempt(cmd: list[str], log_path: str) -> tuple[int, str]:
    """Run the trainer in its own process group, teeing its output; (returncode, last lines)."""
    tail: deque[str] = deque(maxlen=200)
    with open(log_path, "a", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, bufsize=1)  # fmt: skip

        def forward(signum: int, _frame: object) -> None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

        previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                logf.flush()
                sys.stdout.write(line)
                tail.append(line)
            rc = proc.wait()
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
    return rc, "".join(tail)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        print("usage: launcher.py [options] -- TRAINER COMMAND ... {total_seq_len} ...", file=sys.stderr)
        return 2
    split = argv.index("--")
    ap = argparse.ArgumentParser(prog="launcher")
    ap.add_argument("--save-dir", required=True)
    ap.add_argument("--state", required=True, help="directory for attempts.json, result.json and logs")
    ap.add_argument("--start", type=int, required=True, help="first total_seq_len to try")
    ap.add_argument("--floor", type=int, default=1024, help="smallest total_seq_len worth trying")
    args = ap.parse_args(argv[:split])
    template = argv[split + 1 :]
    if not any("{total_seq_len}" in part for part in template):
        print("the trainer command must contain {total_seq_len}", file=sys.stderr)
        return 2
    os.makedirs(args.state, exist_ok=True)
    os.makedirs(args.save_dir, exist_ok=True)
    attempts = _load_attempts(args.state)
    for earlier in attempts:
        if earlier.get("cause") == "running":
            # Its launcher died with it (SIGKILL to the whole unit, a reboot, a migration): say so.
            earlier["cause"] = "interrupted"
    exhausted = {a["total_seq_len"] for a in attempts if a.get("cause") == "out_of_memory"}
    ladder = [b for b in budgets.ladder_from(args.start, args.floor) if b not in exhausted]
    if not ladder:
        log(f"every budget from {args.start} down to {args.floor} ran out of memory; see attempts.json")
        return EXIT_LADDER_EXHAUSTED
    for total in ladder:
        moved = checkpoints.set_partial_aside(args.save_dir)
        for path in moved:
            log(f"set aside the partial checkpoint {path}")
        newest = checkpoints.newest_complete(args.save_dir)
        attempt = {"n": len(attempts) + 1, "total_seq_len": total, "started": time.time(),
                   "resume_from_epoch": newest.epoch if newest else None, "cause": "running"}  # fmt: skip
        attempts.append(attempt)
        checkpoints.st.write_json_atomic(os.path.join(args.state, "attempts.json"), attempts)
        where = f"resuming from epoch {newest.epoch}" if newest else "from scratch"
        log(f"attempt {attempt['n']}: total_seq_len={total}, {where}")
        cmd = [part.replace("{total_seq_len}", str(total)) for part in template]
        rc, tail = run_attempt(cmd, os.path.join(args.state, f"attempt-{attempt['n']}.log"))
        attempt.update(ended=time.time(), returncode=rc)
        if rc == 0:
            attempt["cause"] = "completed"
        elif budgets.died_of_oom(rc, tail):
            attempt["cause"] = "out_of_memory"
        elif rc < 0:
            attempt["cause"] = f"signal {signal.Signals(-rc).name}"
        else:
            attempt["cause"] = "error"
            attempt["log_tail"] = tail[-2000:]
        checkpoints.st.write_json_atomic(os.path.join(args.state, "attempts.json"), attempts)
        if attempt["cause"] == "completed":
            for path in checkpoints.readable_weights(args.save_dir):
                log(f"made {path} readable as its config.json is (safetensors wrote it 0600)")
            result = metrics.collect(args.save_dir)
            result.update(total_seq_len=total, attempts=len(attempts))
            checkpoints.st.write_json_atomic(os.path.join(args.state, "result.json"), result)
            log(f"done: tau={result['tau']} (best epoch {result['best_epoch']}) at total_seq_len={total}")
            return 0
        if attempt["cause"] != "out_of_memory":
            log(f"attempt {attempt['n']} failed ({attempt['cause']}, rc={rc}); a restart resumes from the newest "
                "complete epoch with the same budget")  # fmt: skip
            return rc if rc > 0 else 128 - rc
        log(f"attempt {attempt['n']} ran out of memory at total_seq_len={total}; backing off")
    log(f"every budget down to {args.floor} ran out of memory; see attempts.json")
    return EXIT_LADDER_EXHAUSTED


if __name__ == "__main__":
    sys.exit(main())
