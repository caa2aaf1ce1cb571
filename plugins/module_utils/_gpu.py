# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU holders and a safe signal ladder: the logic of the gpu_cleanup module, free of Ansible.

Holders are found from ``/proc/*/fd`` links to ``/dev/nvidia*``, which works in any PID namespace
(nvidia-smi's PIDs inside a container depend on the driver). Memory per process comes from
``nvidia-smi --query-compute-apps`` where its PIDs map to ours.

The ladder: SIGTERM to each job's root (the torchrun-like agent, so it cannot restart workers) and
to each holder's process group (torchrun workers live in their own sessions; DataLoader children share
their worker's group), wait ``grace`` seconds, then SIGKILL whatever selected process is left --
inherited-fd orphans included -- after checking that its PID still names the same process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

from ansible.module_utils._safetensors import SafetensorsError, read_header

DEFAULT_EXCLUDE = ["nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "Xorg", "X", "nvidia-smi"]
# Processes a job root is never taken from: whoever started the job, not the job itself.
SUPERVISORS = {"systemd", "init", "sshd", "lxc-attach", "login", "tmux: server", "tmux", "screen", "SCREEN",
               "containerd-shim", "conmon", "su", "sudo", "runc", "lxc-start"}  # fmt: skip


@dataclass
class Proc:
    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    starttime: int
    comm: str
    cmdline: str
    gpus: set[int] = field(default_factory=set)
    control: bool = False  # holds nvidiactl / nvidia-uvm
    memory_mib: int | None = None

    @property
    def holds_gpu(self) -> bool:
        return bool(self.gpus) or self.control

    @property
    def name(self) -> str:
        first = self.cmdline.split(" ", 1)[0] if self.cmdline else self.comm
        return os.path.basename(first) or self.comm

    def describe(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "pgid": self.pgid,
            "sid": self.sid,
            "state": self.state,
            "cmdline": self.cmdline,
            "gpus": sorted(self.gpus),
            "memory_mib": self.memory_mib,
        }


def read_stat(pid: int, proc: str = "/proc") -> tuple[str, int, int, int, int, str] | None:
    """(state, ppid, pgid, sid, starttime, comm) from /proc/PID/stat, or None once the process is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    # rest[0]=state, [1]=ppid, [2]=pgrp, [3]=session, ..., [19]=starttime
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]), comm


def scan(proc: str = "/proc", dev_dir: str = "/dev") -> dict[int, Proc]:
    """Every process, with the GPUs it holds open."""
    dev_re = re.compile(re.escape(dev_dir.rstrip("/")) + r"/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
    procs: dict[int, Proc] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = read_stat(pid, proc)
        if st is None:
            continue
        state, ppid, pgid, sid, starttime, comm = st
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            cmdline = ""
        p = Proc(pid, ppid, pgid, sid, state, starttime, comm, cmdline)
        try:
            fds = os.listdir(f"{proc}/{pid}/fd")
        except OSError:
            fds = []
        for fd in fds:
            try:
                target = os.readlink(f"{proc}/{pid}/fd/{fd}")
            except OSError:
                continue
            m = dev_re.match(target)
            if m:
                if m.group(1).isdigit():
                    p.gpus.add(int(m.group(1)))
                else:
                    p.control = True
        procs[pid] = p
    return procs


def ancestors(pid: int, procs: dict[int, Proc]) -> list[int]:
    out = []
    seen = set()
    while pid in procs and pid not in seen and pid > 1:
        seen.add(pid)
        out.append(pid)
        pid = procs[pid].ppid
    return out


# -- nvidia-smi --------------------------------------------------------------------------------


def run_smi(nvidia_smi: list[str], query: str, fields: str) -> list[list[str]] | None:
    """Rows of an nvidia-smi CSV query, or None when nvidia-smi cannot answer."""
    try:
        proc = subprocess.run(
            [*nvidia_smi, f"--{query}={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def gpu_memory(nvidia_smi: list[str]) -> list[dict[str, Any]] | None:
    rows = run_smi(nvidia_smi, "query-gpu", "index,uuid,memory.used,memory.total")
    if rows is None:
        return None
    out = []
    for r in rows:
        try:
            out.append({"index": int(r[0]), "uuid": r[1], "memory_used": int(r[2]), "memory_total": int(r[3])})
        except (ValueError, IndexError):
            continue
    return out


def app_memory(nvidia_smi: list[str]) -> dict[int, int]:
    """PID -> MiB from --query-compute-apps, summed over GPUs (nothing when idle or when PIDs do not map)."""
    rows = run_smi(nvidia_smi, "query-compute-apps", "gpu_uuid,pid,used_memory") or []
    out: dict[int, int] = {}
    for r in rows:
        try:
            out[int(r[1])] = out.get(int(r[1]), 0) + int(r[2])
        except (ValueError, IndexError):
            continue
    return out


# -- selection ---------------------------------------------------------------------------------


@dataclass
class Selection:
    holders: list[Proc]  # selected GPU holders (and non-GPU matches when asked)
    roots: list[Proc]  # job roots to stop first (agents), not GPU holders themselves
    spared: list[Proc]  # holders left alone (allow-listed, other GPUs, not matching)
    protected: set[int]  # our own tree


def resolve_gpus(wanted: list[str] | None, gpus: list[dict[str, Any]] | None) -> set[int] | None:
    """Indices for a list of indices/UUIDs; None means every GPU."""
    if not wanted:
        return None
    by_uuid = {g["uuid"]: g["index"] for g in gpus or []}
    out = set()
    for w in wanted:
        w = str(w).strip()
        if w.isdigit():
            out.add(int(w))
        elif w in by_uuid:
            out.add(by_uuid[w])
        else:
            raise ValueError(f"GPU {w!r} is neither an index nor the UUID of a GPU on this host")
    return out


def select(
    procs: dict[int, Proc],
    gpus: set[int] | None,
    match: list[str],
    exclude: list[str],
    include_non_gpu: bool,
    me: int | None = None,
) -> Selection:
    me = os.getpid() if me is None else me
    protected = set(ancestors(me, procs)) | {me, 1}
    match_re = [re.compile(m) for m in match]
    exclude_re = [re.compile(e) for e in exclude if not re.fullmatch(r"[\w.+-]+", e)]
    exclude_names = {e for e in exclude if re.fullmatch(r"[\w.+-]+", e)}

    # The kernel keeps 15 characters of a process name (comm): nvidia-persistenced is "nvidia-persiste".
    exclude_comms = {e[:15] for e in exclude_names}

    def excluded(p: Proc) -> bool:
        return (
            p.pid in protected
            or p.name in exclude_names
            or p.comm in exclude_comms
            or any(r.search(p.cmdline) for r in exclude_re)
        )

    holders, spared = [], []
    for p in sorted(procs.values(), key=lambda p: p.pid):
        if not p.holds_gpu:
            if include_non_gpu and match_re and any(r.search(p.cmdline) for r in match_re) and not excluded(p):
                holders.append(p)
            continue
        on_selected = gpus is None or bool(p.gpus & gpus)
        matches = not match_re or any(r.search(p.cmdline) for r in match_re)
        # A holder of only nvidiactl/nvidia-uvm is selected only when every GPU is.
        if excluded(p) or not matches or not on_selected or (not p.gpus and gpus is not None):
            spared.append(p)
        else:
            holders.append(p)
    spared_pids = {p.pid for p in spared}
    roots: dict[int, Proc] = {}
    selected_pids = {p.pid for p in holders}
    for h in holders:
        root = None
        for pid in ancestors(h.ppid, procs):
            a = procs[pid]
            if a.pid in protected or a.comm in SUPERVISORS or a.name in SUPERVISORS or excluded(a):
                break
            if a.pid in spared_pids:
                break
            root = a
        if root is not None and root.pid not in selected_pids:
            roots[root.pid] = root
    # An agent whose job also holds GPUs we keep (another GPU, allow-listed) would take those down with it
    # when it stops: leave such an agent alone and stop only the selected holders.
    for pid in list(roots):
        if any(pid in ancestors(s.ppid, procs) for s in spared):
            del roots[pid]
    return Selection(holders, sorted(roots.values(), key=lambda p: p.pid), spared, protected)


# -- signalling --------------------------------------------------------------------------------


def same_process(p: Proc, proc: str = "/proc") -> bool:
    """True while PID p.pid still names the process we saw (guards against PID reuse)."""
    st = read_stat(p.pid, proc)
    return st is not None and st[4] == p.starttime


def alive(p: Proc, proc: str = "/proc") -> bool:
    st = read_stat(p.pid, proc)
    return st is not None and st[4] == p.starttime and st[0] != "Z"


def _group_is_safe(pgid: int, procs: dict[int, Proc], sel: Selection) -> bool:
    """killpg only groups with nothing we must not touch in them."""
    spared = {p.pid for p in sel.spared} | sel.protected
    return pgid > 1 and not any(p.pgid == pgid and p.pid in spared for p in procs.values())


def terminate(sel: Selection, procs: dict[int, Proc], proc: str = "/proc") -> list[int]:
    """SIGTERM the job roots, then each holder's process group (or the holder alone). Returns pids signalled."""
    signalled: list[int] = []
    groups_done: set[int] = set()
    for p in [*sel.roots, *sel.holders]:
        if not same_process(p, proc):
            continue
        if p.pgid not in groups_done and p.pgid == p.pid and _group_is_safe(p.pgid, procs, sel):
            try:
                os.killpg(p.pgid, signal.SIGTERM)
                groups_done.add(p.pgid)
                signalled += [q.pid for q in procs.values() if q.pgid == p.pgid and q.pid not in signalled]
                continue
            except ProcessLookupError:
                pass
        if p.pgid not in groups_done and _send(p.pid, signal.SIGTERM):
            signalled.append(p.pid)
    return signalled


def _send(pid: int, sig: int) -> bool:
    """Signal one process; False when it is already gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_gone(targets: list[Proc], seconds: float, proc: str = "/proc") -> list[Proc]:
    """Wait up to ``seconds`` for targets to exit; returns those still alive."""
    deadline = time.monotonic() + seconds
    left = [p for p in targets if alive(p, proc)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p, proc)]
    return left


def kill(targets: list[Proc], proc: str = "/proc") -> list[int]:
    killed = []
    for p in targets:
        # skip what is gone, or whose PID now names another process
        if same_process(p, proc) and _send(p.pid, signal.SIGKILL):
            killed.append(p.pid)
    return killed


def state_word(state: str) -> str:
    return {"D": "uninterruptible sleep (D)", "Z": "zombie", "T": "stopped", "R": "running", "S": "sleeping"}.get(
        state, state
    )


# -- the guard ---------------------------------------------------------------------------------


def check_complete(path: str) -> str | None:
    """Why ``path`` is not a complete checkpoint file, or None when it is."""
    if not os.path.exists(path):
        return f"{path} does not exist"
    if not os.path.isfile(path):
        return f"{path} is not a regular file"
    if os.path.getsize(path) == 0:
        return f"{path} is empty"
    if path.endswith(".safetensors"):
        try:
            read_header(path)
        except SafetensorsError as exc:
            return str(exc)
    elif path.endswith(".json"):
        try:
            with open(path, encoding="utf-8") as fh:
                json.load(fh)
        except ValueError:
            return f"{path} is not complete JSON"
    return None
