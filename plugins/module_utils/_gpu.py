# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU holders and a safe signal ladder: the logic of the gpu_cleanup module, free of Ansible.

Holders are found from ``/proc/*/fd`` links to ``/dev/nvidia*``, which works in any PID namespace
(nvidia-smi's PIDs inside a container depend on the driver). Memory per process comes from
``nvidia-smi --query-compute-apps`` where its PIDs map to ours.

A job's root is the topmost ancestor of its holders that is still the job: never a supervisor, and never a
person's session -- an interactive or login shell, a terminal multiplexer pane or a login session -- which is
recognised from what the kernel says (controlling terminal, session leadership, the ``-`` login prefix of
argv[0], the shell's interactive flags and whether its stdin is a terminal), not from names alone.

Holders without a compute context (an NVML exporter keeps /dev/nvidia* open but owns no memory) are
observers: spared by default. A compute context shows as memory in ``--query-compute-apps``, as device
memory mapped into the process (``/proc/PID/maps``), or through the process group of a holder that has one
(DataLoader children inherit their worker's context). A GPU whose memory no holder accounts for makes every
holder on it a suspect instead, so an observer is only ever a holder the numbers show to hold nothing.

The ladder: SIGTERM to each job's root (the torchrun-like agent, so it cannot restart workers) and
to each holder's process group (torchrun workers live in their own sessions; DataLoader children share
their worker's group), wait ``grace`` seconds, then SIGKILL whatever selected process is left --
inherited-fd orphans included -- after checking that its PID still names the same process.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from typing import Any

DEFAULT_EXCLUDE = ["nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "dcgmi", "Xorg", "X", "nvidia-smi"]
# Processes a job root is never taken from: whoever started the job, not the job itself.
SUPERVISORS = {"systemd", "init", "sshd", "lxc-attach", "login", "tmux: server", "tmux", "screen", "SCREEN",
               "containerd-shim", "conmon", "su", "sudo", "runc", "lxc-start"}  # fmt: skip
# Shells: an interactive one is a person's terminal, a non-interactive one running a script may be the job
# (a launcher that would start the next stage).
SHELLS = {"bash", "sh", "dash", "zsh", "fish", "ksh", "mksh", "ash", "tcsh", "csh", "busybox"}
# Shell options that take the next word as their argument (so it is not the script operand).
_SHELL_OPTS_WITH_ARG = {"-o", "+o", "-O", "+O", "--rcfile", "--init-file"}


class _Record:
    """A plain record: its fields (``__slots__``) in order, equal when they are. Not a dataclass: a dry run on every
    host of a fleet-wide cleanup imports this file, and ``dataclasses`` would import ``inspect`` (a third of the
    host's import time) and build each class's methods from source."""

    __slots__: tuple[str, ...] = ()

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as an eq dataclass is

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{f}={getattr(self, f)!r}' for f in self.__slots__)})"


class Proc(_Record):
    __slots__ = ("argv", "cmdline", "comm", "control", "gpus", "maps_device", "memory_mib", "pgid", "pid", "ppid",
                 "sid", "starttime", "state", "stdin_tty", "tty_nr")  # fmt: skip

    def __init__(self, pid: int, ppid: int, pgid: int, sid: int, state: str, starttime: int, comm: str, cmdline: str,
                 gpus: set[int] | None = None, control: bool = False, memory_mib: int | None = None, tty_nr: int = 0,
                 argv: list[str] | None = None, stdin_tty: bool = False,
                 maps_device: bool = False) -> None:  # fmt: skip
        self.pid, self.ppid, self.pgid, self.sid = pid, ppid, pgid, sid
        self.state, self.starttime, self.comm, self.cmdline = state, starttime, comm, cmdline
        self.gpus: set[int] = set() if gpus is None else gpus
        self.control = control  # holds nvidiactl / nvidia-uvm
        self.memory_mib = memory_mib
        self.tty_nr = tty_nr  # controlling terminal (0: none)
        self.argv: list[str] = [] if argv is None else argv
        self.stdin_tty = stdin_tty  # fd 0 is a terminal
        self.maps_device = maps_device  # device memory of /dev/nvidia* mapped into the process (a CUDA context)

    @property
    def holds_gpu(self) -> bool:
        return bool(self.gpus) or self.control

    @property
    def name(self) -> str:
        first = self.cmdline.split(" ", 1)[0] if self.cmdline else self.comm
        return os.path.basename(first) or self.comm

    def describe(self, reason: str | None = None) -> dict[str, Any]:
        out = {
            "pid": self.pid,
            "pgid": self.pgid,
            "sid": self.sid,
            "state": self.state,
            "cmdline": self.cmdline,
            "gpus": sorted(self.gpus),
            "memory_mib": self.memory_mib,
        }
        if reason:
            out["reason"] = reason
        return out


def read_stat(pid: int, proc: str = "/proc") -> tuple[str, int, int, int, int, str] | None:
    """(state, ppid, pgid, sid, starttime, comm) from /proc/PID/stat, or None once the process is gone."""
    full = read_stat_full(pid, proc)
    return None if full is None else full[:6]


def read_stat_full(pid: int, proc: str = "/proc") -> tuple[str, int, int, int, int, str, int] | None:
    """(state, ppid, pgid, sid, starttime, comm, tty_nr) from /proc/PID/stat (proc(5))."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read().decode(errors="replace")
    except OSError:
        return None
    comm = raw[raw.index("(") + 1 : raw.rindex(")")]
    rest = raw[raw.rindex(")") + 2 :].split()
    # rest[0]=state, [1]=ppid, [2]=pgrp, [3]=session, [4]=tty_nr, ..., [19]=starttime
    return rest[0], int(rest[1]), int(rest[2]), int(rest[3]), int(rest[19]), comm, int(rest[4])


def _is_terminal(path: str) -> bool:
    """A terminal device: /dev/pts/N, /dev/ttyN, /dev/console (what a person types into)."""
    return path.startswith(("/dev/pts/", "/dev/tty")) or path == "/dev/console"


def _maps_device(pid: int, proc: str, dev_re: re.Pattern[str]) -> bool:
    """Device memory mapped from /dev/nvidia* (CUDA maps its context's memory; NVML queries do not)."""
    try:
        with open(f"{proc}/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and dev_re.match(parts[5].strip()):
                    return True
    except OSError:
        return False
    return False


def scan(proc: str = "/proc", dev_dir: str = "/dev", parents: set[int] | None = None) -> dict[int, Proc]:
    """Every process (or only the children of ``parents``: their fds alone are read), with the GPUs it holds open."""
    dev_re = re.compile(re.escape(dev_dir.rstrip("/")) + r"/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
    procs: dict[int, Proc] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        pid = int(entry)
        st = read_stat_full(pid, proc)
        if st is None:
            continue
        state, ppid, pgid, sid, starttime, comm, tty_nr = st
        if parents is not None and ppid not in parents:
            continue
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as fh:
                raw_argv = fh.read()
        except OSError:
            raw_argv = b""
        argv = [a.decode(errors="replace") for a in raw_argv.rstrip(b"\0").split(b"\0")] if raw_argv else []
        cmdline = " ".join(argv).strip()
        p = Proc(pid, ppid, pgid, sid, state, starttime, comm, cmdline, tty_nr=tty_nr, argv=argv)
        try:
            p.stdin_tty = _is_terminal(os.readlink(f"{proc}/{pid}/fd/0"))
        except OSError:
            pass
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
        if p.holds_gpu:
            p.maps_device = _maps_device(pid, proc, dev_re)
        procs[pid] = p
    return procs


def person_session(p: Proc) -> str | None:
    """Why ``p`` is a person's terminal session rather than a job, or None when it may be a job's root."""
    argv0 = p.argv[0] if p.argv else ""
    if argv0.startswith("-"):
        return f"login shell ({argv0})"
    base = os.path.basename(argv0) or p.comm
    if base in SHELLS or p.comm in SHELLS:
        interactive, login, operand, command = False, False, False, False
        words = p.argv[1:]
        i = 0
        while i < len(words):
            w = words[i]
            if w == "--":
                operand = i + 1 < len(words)
                break
            if w == "--interactive":
                interactive = True
            elif w == "--login":
                login = True
            elif w in _SHELL_OPTS_WITH_ARG:
                i += 1
            elif w.startswith("--"):
                pass
            elif w.startswith(("-", "+")) and len(w) > 1:
                flags = w[1:]
                interactive |= "i" in flags
                login |= "l" in flags
                command |= "c" in flags
            else:
                operand = True
                break
            i += 1
        if interactive:
            return f"interactive shell ({p.cmdline[:60]})"
        if not operand and not command and (p.stdin_tty or login):
            return f"interactive shell reading a terminal ({p.cmdline[:60]})"
        if operand or command:
            # `bash -c 'while …'` or `bash train.sh`, a pane's own command included: it runs the job and ends
            # with it, so it is the job (a restart loop, a launcher), not a person's shell.
            return None
    if p.pid == p.sid and p.tty_nr != 0 and _reads_a_person(p):
        return f"session leader of a terminal ({p.cmdline[:60] or p.comm}): a multiplexer pane or login session"
    return None


def _reads_a_person(p: Proc) -> bool:
    """A terminal's session leader that is not a shell: a person's when it takes no program to run (a REPL such as
    ``python3`` or ``ipython`` on the terminal, a login program), a job's when it names one (``python3 train.py``,
    ``python3 -m pkg``, ``python3 -c …``: a pane's own command that ends with the job)."""
    words = p.argv[1:]
    if not words:
        return True
    runs = {"-c", "-m"}
    return not any(w in runs or not w.startswith("-") for w in words)


def ancestors(pid: int, procs: dict[int, Proc]) -> list[int]:
    out = []
    seen = set()
    while pid in procs and pid not in seen and pid > 1:
        seen.add(pid)
        out.append(pid)
        pid = procs[pid].ppid
    return out


# -- systemd units -----------------------------------------------------------------------------


def unit_of(pid: int, proc: str = "/proc") -> str | None:
    """The systemd service a process runs in, from /proc/PID/cgroup (cgroup v2 ``0::/system.slice/X.service``;
    the v1 ``name=systemd`` hierarchy otherwise). Inside a container the path is relative to the container's own
    cgroup, which is what its systemd names. None for scopes (sessions) and processes outside any service."""
    try:
        with open(f"{proc}/{pid}/cgroup", encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    paths = [line.split(":", 2)[2] for line in lines if line.startswith("0::")]
    paths += [line.split(":", 2)[2] for line in lines if ":name=systemd:" in line]
    for path in paths:
        services = [part for part in path.split("/") if part.endswith(".service")]
        if services:
            return services[-1]
    return None


_SPAN_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hr": 3600.0,
               "d": 86400.0}  # fmt: skip


def systemd_seconds(span: str) -> float | None:
    """A time span as systemctl show prints it ("2min", "1min 30s", "500ms", "infinity") in seconds, or None."""
    span = span.strip()
    if not span or span == "infinity":
        return None
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", span):
        if unit not in _SPAN_UNITS and unit:
            return None
        total += float(number) * _SPAN_UNITS.get(unit or "s", 1.0)
    return total


def unit_facts(unit: str, systemctl: str = "systemctl") -> dict[str, Any] | None:
    """MainPID, Restart, ActiveState, Environment and UnitFileState (``enabled``: started at boot) of a unit
    (``systemctl show``), or None when systemctl cannot tell.

    ``spans`` lists the hosts of a job over several nodes (``EAGLE3_TRAIN_HOSTS`` in the unit's environment, which
    eagle3_train writes), empty for a job of one host.
    """
    try:
        out = subprocess.run([systemctl, "show", unit, "-p", "MainPID", "-p", "Restart", "-p", "ActiveState", "-p",
                              "Environment", "-p", "TimeoutStopUSec", "-p", "UnitFileState"], capture_output=True,
                             text=True, timeout=30, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    facts: dict[str, Any] = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    facts["stop_timeout"] = systemd_seconds(str(facts.get("TimeoutStopUSec", "")))
    hosts = [word.split("=", 1)[1] for word in str(facts.get("Environment", "")).split()
             if word.startswith("EAGLE3_TRAIN_HOSTS=")]  # fmt: skip
    facts["spans"] = [h for h in (hosts[-1].split(",") if hosts else []) if h]
    try:
        facts["MainPID"] = int(facts.get("MainPID") or 0)
    except ValueError:
        facts["MainPID"] = 0
    return facts


# -- selection ---------------------------------------------------------------------------------


class Selection(_Record):
    __slots__ = ("chain", "holders", "observers", "protected", "reasons", "roots", "spared", "spared_ancestors")

    def __init__(self, holders: list[Proc], roots: list[Proc], spared: list[Proc], protected: set[int],
                 reasons: dict[int, str] | None = None, observers: list[Proc] | None = None,
                 spared_ancestors: list[Proc] | None = None, chain: list[Proc] | None = None) -> None:  # fmt: skip
        self.holders = holders  # selected GPU holders (and non-GPU matches when asked)
        self.roots = roots  # job roots to stop first (agents), not GPU holders themselves
        self.spared = spared  # holders left alone (allow-listed, other GPUs, not matching)
        self.protected = protected  # our own tree
        self.reasons: dict[int, str] = {} if reasons is None else reasons  # why each spared holder or ancestor is
        self.observers: list[Proc] = [] if observers is None else observers  # holders with no compute context
        self.spared_ancestors: list[Proc] = [] if spared_ancestors is None else spared_ancestors  # shells/sessions
        self.chain: list[Proc] = [] if chain is None else chain  # job processes between a root and its holders

    def job_pids(self) -> set[int]:
        """Every process of the selected jobs: roots, the chain below them, holders."""
        return {p.pid for p in [*self.roots, *self.chain, *self.holders]}

    def untouchable(self) -> set[int]:
        """PIDs no signal may reach, even through a process group."""
        return ({p.pid for p in self.spared} | {p.pid for p in self.observers}
                | {p.pid for p in self.spared_ancestors} | self.protected)  # fmt: skip


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
    include_observers: bool = False,
    gpu_used: dict[int, int] | None = None,
    free_threshold_mib: int = 512,
) -> Selection:
    """Which processes to stop, which job roots to stop first, and what is spared (with the reason).

    ``gpu_used`` (index -> MiB used) lets observers be told from holders: without it every holder counts.
    """
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

    observer_pids = set() if include_observers else observers(procs, gpu_used, free_threshold_mib)
    holders, spared, watching = [], [], []
    reasons: dict[int, str] = {}
    for p in sorted(procs.values(), key=lambda p: p.pid):
        if not p.holds_gpu:
            if include_non_gpu and match_re and any(r.search(p.cmdline) for r in match_re) and not excluded(p):
                holders.append(p)
            continue
        on_selected = gpus is None or bool(p.gpus & gpus)
        matches = not match_re or any(r.search(p.cmdline) for r in match_re)
        # A holder of only nvidiactl/nvidia-uvm is selected only when every GPU is.
        if p.pid in protected:
            reason = "the module's own process tree"
        elif excluded(p):
            reason = "allow-listed"
        elif not on_selected or (not p.gpus and gpus is not None):
            reason = "holds no selected GPU"
        elif not matches:
            reason = "does not match"
        elif p.pid in observer_pids:
            watching.append(p)
            reasons[p.pid] = "observer: holds device nodes but no GPU memory (include_observers stops it)"
            continue
        else:
            holders.append(p)
            continue
        spared.append(p)
        reasons[p.pid] = reason
    keep = {p.pid for p in spared} | {p.pid for p in watching}
    roots: dict[int, Proc] = {}
    chain: dict[int, Proc] = {}
    sessions: dict[int, Proc] = {}
    selected_pids = {p.pid for p in holders}
    for h in holders:
        path: list[Proc] = []  # the job's processes above this holder, nearest first; the last is its root
        for pid in ancestors(h.ppid, procs):
            a = procs[pid]
            if a.pid in protected or a.comm in SUPERVISORS or a.name in SUPERVISORS or excluded(a):
                break
            if a.pid in keep:
                break
            why = person_session(a)
            if why:
                sessions[a.pid] = a
                reasons[a.pid] = why
                break
            path.append(a)
        if path and path[-1].pid not in selected_pids:
            roots[path[-1].pid] = path[-1]
        # Everything between the root and the holder is the job too: a loop there (`while true; do python
        # train.py; done`) would start the holder again once the root and the holder are gone.
        for a in path[:-1]:
            if a.pid not in selected_pids:
                chain[a.pid] = a
    # An agent whose job also holds GPUs we keep (another GPU, allow-listed) would take those down with it
    # when it stops: leave such an agent (or loop) alone and stop only the selected holders.
    for found in (roots, chain):
        for pid in list(found):
            if any(pid in ancestors(s.ppid, procs) for s in [*spared, *watching]):
                del found[pid]
    return Selection(
        holders, sorted(roots.values(), key=lambda p: p.pid), spared, protected, reasons, watching,
        sorted(sessions.values(), key=lambda p: p.pid), sorted(chain.values(), key=lambda p: p.pid),
    )  # fmt: skip


def observers(procs: dict[int, Proc], gpu_used: dict[int, int] | None, free_threshold_mib: int) -> set[int]:
    """Holders with no compute context, when the GPUs' memory shows they hold none.

    Evidence of a context: memory in --query-compute-apps, device memory mapped into the process, or the
    process group of a holder with either (forked DataLoader children). A GPU using memory that no holder
    with evidence accounts for makes all its holders suspects (PIDs that nvidia-smi cannot map, say).
    """
    if gpu_used is None:
        return set()
    holders = [p for p in procs.values() if p.holds_gpu]
    evident = [p for p in holders if (p.memory_mib or 0) > 0 or p.maps_device]
    evident_pids = {p.pid for p in evident}
    groups = {p.pgid for p in evident}
    accounted = {g for p in evident for g in p.gpus}
    unexplained = {g for g, used in gpu_used.items() if used > free_threshold_mib and g not in accounted}
    out = set()
    for p in holders:
        if p.pid in evident_pids or p.pgid in groups:
            continue
        held = p.gpus or set(gpu_used)  # a control-node-only holder could be behind any GPU's memory
        if held & unexplained:
            continue
        out.add(p.pid)
    return out


# -- signalling --------------------------------------------------------------------------------


def same_process(p: Proc, proc: str = "/proc") -> bool:
    """True while PID p.pid still names the process we saw (guards against PID reuse)."""
    st = read_stat(p.pid, proc)
    return st is not None and st[4] == p.starttime


def alive(p: Proc, proc: str = "/proc") -> bool:
    st = read_stat(p.pid, proc)
    return st is not None and st[4] == p.starttime and st[0] != "Z"


def _group_is_safe(pgid: int, procs: dict[int, Proc], sel: Selection) -> bool:
    """killpg only groups with nothing we must not touch in them (a shell without job control shares one)."""
    untouchable = sel.untouchable()
    return pgid > 1 and not any(p.pgid == pgid and p.pid in untouchable for p in procs.values())


def terminate(sel: Selection, procs: dict[int, Proc], proc: str = "/proc") -> list[int]:
    """SIGTERM the job roots, the chain below them, then each holder's process group (or the holder alone).

    Top down, so nothing that is still running can start again what was just stopped. Returns pids signalled.
    """
    signalled: list[int] = []
    groups_done: set[int] = set()
    for p in [*sel.roots, *sel.chain, *sel.holders]:
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
