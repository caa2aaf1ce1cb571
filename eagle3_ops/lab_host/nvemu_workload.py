"""``lab-workload``: processes that hold emulated GPU memory the way training jobs do (ranks, DataLoader-like
children that keep a context alive, an agent that restarts them), for the cleanup tests."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

try:  # a package module (tests), or loose files beside each other (in a container)
    from .nvemu_device import DEV_DIR, Context, _open_control_nodes, gpu_indices, live_contexts
except ImportError:  # pragma: no cover
    from nvemu_device import DEV_DIR, Context, _open_control_nodes, gpu_indices, live_contexts  # type: ignore[no-redef]

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
    me = [sys.executable, os.path.join(os.path.dirname(os.path.realpath(__file__)), "nvemu.py"), "workload"]

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
        me = [sys.executable, os.path.join(os.path.dirname(os.path.realpath(__file__)), "nvemu.py"), "workload"]
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
