"""gpu_cleanup against the process trees people really have: jobs started from a terminal (an interactive
shell on a pty, a login shell, a tmux pane), launcher scripts, agents that restart their workers, NVML
exporters that hold the device nodes without memory. Real processes, emulated device nodes, no lab needed."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest

from tests.unit.conftest import NVEMU, processes_with_env
from tests.unit.plugins.modules.test_gpu_cleanup import alive, cleanup, used, workload


class Terminal:
    """A shell on its own pseudo-terminal, as a person's: session leader, the pty its controlling terminal."""

    def __init__(self, argv: list[str], env: dict[str, str], executable: str | None = None) -> None:
        self.master, slave = os.openpty()

        def take_terminal() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        self.proc = subprocess.Popen(
            argv, executable=executable, stdin=slave, stdout=slave, stderr=slave, env=env,
            start_new_session=True, preexec_fn=take_terminal,
        )  # fmt: skip
        os.close(slave)
        self.output = bytearray()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                return
            if not chunk:
                return
            self.output += chunk

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        os.close(self.master)


def _env() -> dict[str, str]:
    return {**os.environ, "PS1": "$ ", "HISTFILE": "/dev/null", "TERM": "dumb"}


def _wait_used(expected: list[int], seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while used() != expected:
        if time.monotonic() > deadline:
            raise AssertionError(f"GPU memory {used()} never became {expected}")
        time.sleep(0.1)


def _job(mib: int = 8000, restarts: int = 3, gpus_arg: str = "0") -> str:
    return (f"{sys.executable} {NVEMU} workload --foreground --gpus {gpus_arg} --mib {mib} "
            f"--dataloader-workers 1 --max-restarts {restarts} --tag trial-job")


def _pids_of(pattern: str) -> list[int]:
    """This test's processes whose command line has PATTERN: the other xdist worker may run the same trial at once,
    so a machine-wide pgrep would see its processes too (they share the tag, not the test's NVEMU_CTX_DIR)."""
    out = subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True, check=False).stdout
    ours = set(processes_with_env("NVEMU_CTX_DIR", os.environ["NVEMU_CTX_DIR"]))
    return [int(x) for x in out.split() if int(x) in ours]


@pytest.fixture
def terminals():
    opened: list[Terminal] = []
    yield opened
    for t in opened:
        t.close()


SHELLS = {
    "bash -i on a pty": (["bash", "--norc", "-i"], None),
    "ssh login shell (-bash)": (["-bash", "--norc"], "/bin/bash"),
    "plain bash reading the terminal": (["bash", "--norc"], None),
}


@pytest.mark.parametrize("shell", sorted(SHELLS))
def test_a_job_started_from_a_terminal_keeps_the_terminal(gpus, capsys, terminals, shell):
    argv, executable = SHELLS[shell]
    term = Terminal(argv, _env(), executable)
    terminals.append(term)
    term.type(_job())
    _wait_used([8003, 3, 3, 3])
    agent = [p for p in _pids_of("trial-job") if "--role agent" not in Path(f"/proc/{p}/cmdline").read_text()]
    res = cleanup(gpus, capsys, grace=2, timeout=8)
    assert not res.get("failed"), res.get("msg")
    assert used() == [3, 3, 3, 3]
    assert term.proc.poll() is None, "the person's shell was killed"
    assert [a["pid"] for a in res["spared_ancestors"]] == [term.proc.pid]
    reason = res["spared_ancestors"][0]["reason"]
    assert "shell" in reason or "session leader" in reason
    # The job's own agent was the root, stopped first, so it could not restart the worker.
    assert len(res["roots"]) == 1 and "workload --foreground" in res["roots"][0]["cmdline"]
    assert res["roots"][0]["pid"] in agent
    assert term.proc.pid not in res["signalled"] + res["killed"]
    term.type("echo still-here-$((6*7))")
    deadline = time.monotonic() + 5
    while b"still-here-42" not in term.output and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"still-here-42" in term.output


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_a_job_in_a_tmux_pane_keeps_the_pane(gpus, capsys, tmp_path):
    socket = str(tmp_path / "tmux.sock")
    env = {**_env(), "TMUX": ""}
    subprocess.run(["tmux", "-S", socket, "-f", "/dev/null", "new-session", "-d", "-x", "200", "-y", "50",
                    "bash --norc -i"], env=env, check=True)
    try:
        pane = int(subprocess.run(["tmux", "-S", socket, "display", "-p", "#{pane_pid}"], capture_output=True,
                                  text=True, check=True).stdout)
        subprocess.run(["tmux", "-S", socket, "send-keys", _job(), "Enter"], check=True)
        _wait_used([8003, 3, 3, 3])
        res = cleanup(gpus, capsys, grace=2, timeout=8)
        assert not res.get("failed"), res.get("msg")
        assert used() == [3, 3, 3, 3]
        assert alive(pane), "the tmux pane's shell was killed"
        assert [a["pid"] for a in res["spared_ancestors"]] == [pane]
        panes = subprocess.run(["tmux", "-S", socket, "list-panes", "-F", "#{pane_dead}"], capture_output=True,
                               text=True, check=True).stdout.split()
        assert panes == ["0"]
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], check=False)


def test_a_launcher_script_is_the_root_and_the_terminal_is_spared(gpus, capsys, terminals, tmp_path):
    # The launcher would start the next stage after training: it is the job, so it stops first.
    launcher = tmp_path / "train.sh"
    next_stage = tmp_path / "next-stage-ran"
    launcher.write_text(f"#!/bin/bash\n{_job()}\ntouch {next_stage}\n")
    launcher.chmod(0o755)
    term = Terminal(["bash", "--norc", "-i"], _env())
    terminals.append(term)
    term.type(f"bash {launcher}")
    _wait_used([8003, 3, 3, 3])
    res = cleanup(gpus, capsys, grace=2, timeout=8)
    assert not res.get("failed"), res.get("msg")
    assert [r["cmdline"] for r in res["roots"]] == [f"bash {launcher}"]
    assert [a["pid"] for a in res["spared_ancestors"]] == [term.proc.pid]
    assert term.proc.poll() is None
    time.sleep(0.5)
    assert not next_stage.exists()


def test_a_restarting_agent_left_alone_is_named_not_blamed_on_zombies(gpus, capsys):
    job = workload(gpus, "--gpus", "0", "--mib", "8000", "--dataloader-workers", "0", "--max-restarts", "50")
    # The agent is allow-listed here, so the ladder reaches only the worker, which the agent restarts.
    res = cleanup(gpus, capsys, grace=1, timeout=3, exclude=["--role agent"])
    assert res["failed"]
    assert f"started by pid {job['agent']}" in res["msg"] and "a restart" in res["msg"]
    assert "zombies" not in res["msg"]
    assert any(h["new"] for h in res["holders_after"])
    os.kill(job["agent"], signal.SIGTERM)
    _wait_used([3, 3, 3, 3])


def test_an_exporter_holding_device_nodes_without_memory_is_an_observer(gpus, capsys):
    job = workload(gpus, "--gpus", "0-1", "--mib", "4000", "--dataloader-workers", "1", "--observer")
    res = cleanup(gpus, capsys)
    assert not res.get("failed"), res.get("msg")
    assert used() == [3, 3, 3, 3]
    assert alive(job["observer"]), "the exporter was killed"
    assert [o["pid"] for o in res["observers"]] == [job["observer"]]
    assert "observer" in res["observers"][0]["reason"]
    # Asked to, it is stopped too.
    res = cleanup(gpus, capsys, include_observers=True)
    assert res["changed"] and not alive(job["observer"])


def test_a_real_holder_mentioning_an_allow_listed_name_is_still_stopped(gpus, capsys):
    holder = subprocess.Popen([sys.executable, str(NVEMU), "workload", "--role", "worker", "--gpu", "1", "--mib",
                               "2000", "--dataloader-workers", "0", "--tag", "nvidia-smi dcgm-exporter Xorg"],
                              start_new_session=True, env=os.environ.copy())
    gpus["started"].append(holder.pid)
    _wait_used([3, 2003, 3, 3])
    res = cleanup(gpus, capsys)
    assert not res.get("failed"), res.get("msg")
    assert used() == [3, 3, 3, 3] and holder.wait(timeout=5) is not None


def test_a_busy_gpu_nobody_accounts_for_makes_its_holders_suspects(gpus, capsys, monkeypatch):
    # nvidia-smi that cannot map PIDs (a container without PID mapping): no holder shows memory, yet the GPU
    # is busy -- nothing may be called an observer then, or the job would survive as one.
    job = workload(gpus, "--gpus", "0", "--mib", "4000", "--dataloader-workers", "0")
    smi = Path(gpus["dev"]).parent / "smi-no-pids"
    smi.write_text(f"#!/bin/sh\ncase \"$1\" in --query-compute-apps*) exit 0;; esac\n"
                   f"exec {sys.executable} {NVEMU} smi \"$@\"\n")
    smi.chmod(0o755)
    res = cleanup({**gpus, "smi": str(smi)}, capsys)
    assert not res.get("failed"), res.get("msg")
    assert res["observers"] == [] and used()[0] == 3 and not alive(job["agent"])


def _proc(pid: int, argv: list[str], *, sid: int | None = None, tty: int = 0, stdin_tty: bool = False):
    from ansible_collections.eagle3.ops.plugins.module_utils._gpu import Proc

    return Proc(pid, 1, pid, pid if sid is None else sid, "S", 1, os.path.basename(argv[0]).lstrip("-")[:15],
                " ".join(argv), tty_nr=tty, argv=argv, stdin_tty=stdin_tty)


@pytest.mark.parametrize(
    ("argv", "kw", "expected"),
    [
        (["-bash"], {"sid": 7}, "login shell"),
        (["-zsh"], {"sid": 7}, "login shell"),
        (["bash", "-i"], {"sid": 7}, "interactive shell"),
        (["/bin/bash", "--norc", "--noprofile", "-i"], {"sid": 7}, "interactive shell"),
        (["bash"], {"sid": 7, "stdin_tty": True}, "interactive shell reading a terminal"),
        (["zsh", "-l"], {"sid": 7}, "interactive shell reading a terminal"),
        (["bash", "train.sh"], {"sid": 7, "tty": 34816, "stdin_tty": True}, None),
        (["bash", "-c", "torchrun train.py"], {"sid": 7, "tty": 34816, "stdin_tty": True}, None),
        (["bash", "-lc", "torchrun train.py"], {"sid": 7}, None),
        (["bash", "-o", "pipefail", "run.sh"], {"sid": 7, "stdin_tty": True}, None),
        (["bash"], {"sid": 7}, None),  # reads a pipe: `ssh host bash < script`, a job
        (["python3", "train.py"], {"tty": 34816}, None),  # a pane's own command that names a program: the job
        (["python3", "-m", "speculators.train"], {"tty": 34816}, None),
        (["python3"], {"tty": 34816, "stdin_tty": True}, "session leader of a terminal"),  # a REPL in a pane
        (["ipython", "--no-banner"], {"tty": 34816, "stdin_tty": True}, "session leader of a terminal"),
        (["python3", "train.py"], {"sid": 7, "tty": 34816}, None),
        # A pane (or screen window) whose own command is a restart loop: not interactive, not a login shell.
        (["bash", "-c", "while true; do python train.py; done"], {"tty": 34816, "stdin_tty": True}, None),
        (["sh", "-c", "until python train.py; do sleep 1; done"], {"tty": 34816, "stdin_tty": True}, None),
        (["bash", "run-forever.sh"], {"tty": 34816, "stdin_tty": True}, None),
    ],
)
def test_person_sessions_come_from_kernel_facts(argv, kw, expected):
    from ansible_collections.eagle3.ops.plugins.module_utils._gpu import person_session

    why = person_session(_proc(100, argv, **kw))
    assert (why is None) if expected is None else (why is not None and why.startswith(expected)), why


LOOP = "while true; do {job}; done"


def _worker(gpu: int = 0, mib: int = 6000) -> str:
    return (f"{sys.executable} {NVEMU} workload --role worker --gpu {gpu} --mib {mib} --dataloader-workers 0 "
            "--tag trial-loop")


@pytest.mark.parametrize("loop_in_own_session", [True, False], ids=["loop-own-session", "loop-same-group"])
def test_a_restart_loop_between_a_launcher_and_the_holder_is_stopped_too(gpus, capsys, tmp_path, loop_in_own_session):
    # launcher -> bash -c 'while true; do python worker; done' -> holder: the launcher and the holder alone are not
    # enough, the loop in between would start the holder again.
    loop = LOOP.format(job=_worker())
    setsid = "setsid " if loop_in_own_session else ""
    launcher = tmp_path / "launch.sh"
    launcher.write_text(f"#!/bin/bash\n{setsid}bash -c '{loop}' &\nwait\n")
    launcher.chmod(0o755)
    proc = subprocess.Popen(["bash", str(launcher)], start_new_session=True, env=os.environ.copy())
    gpus["started"].append(proc.pid)
    _wait_used([6003, 3, 3, 3])
    checked = cleanup(gpus, capsys, check=True, grace=1, timeout=6)
    roles = {t["role"] for t in checked["targets"]}
    assert roles == {"root", "chain", "holder"}, checked["targets"]
    chain = [t for t in checked["targets"] if t["role"] == "chain"]
    assert len(chain) == 1 and chain[0]["cmdline"].startswith("bash -c while true")
    assert "loop there would start it again" in chain[0]["reason"]
    assert used() == [6003, 3, 3, 3]  # check mode stopped nothing
    res = cleanup(gpus, capsys, grace=1, timeout=6)
    assert not res.get("failed"), res.get("msg")
    assert chain[0]["pid"] in res["signalled"] + res["killed"]
    time.sleep(1.0)
    assert used() == [3, 3, 3, 3], "the loop started the holder again"
    assert _pids_of("trial-loop") == []


def test_a_restart_loop_that_ignores_sigterm_is_killed_and_its_last_holder_too(gpus, capsys, tmp_path):
    loop = f"trap '' TERM; {LOOP.format(job=_worker())}"
    proc = subprocess.Popen(["bash", "-c", f"setsid bash -c \"{loop}\" & wait"], start_new_session=True,
                            env=os.environ.copy())  # fmt: skip
    gpus["started"].append(proc.pid)
    _wait_used([6003, 3, 3, 3])
    res = cleanup(gpus, capsys, grace=1, timeout=8)
    assert not res.get("failed"), res.get("msg")
    time.sleep(1.0)
    assert used() == [3, 3, 3, 3]
    assert _pids_of("trial-loop") == []


@pytest.mark.skipif(not shutil.which("tmux"), reason="tmux is not installed")
def test_a_tmux_pane_whose_command_is_a_restart_loop_is_the_job(gpus, capsys, tmp_path):
    socket = str(tmp_path / "tmux.sock")
    env = {**_env(), "TMUX": ""}
    subprocess.run(["tmux", "-S", socket, "-f", "/dev/null", "new-session", "-d", "-x", "200", "-y", "50",
                    "bash", "-c", LOOP.format(job=_worker())], env=env, check=True)  # fmt: skip
    try:
        pane = int(subprocess.run(["tmux", "-S", socket, "display", "-p", "#{pane_pid}"], capture_output=True,
                                  text=True, check=True).stdout)
        _wait_used([6003, 3, 3, 3])
        res = cleanup(gpus, capsys, grace=1, timeout=6)
        assert not res.get("failed"), res.get("msg")
        assert [r["pid"] for r in res["roots"]] == [pane] and res["spared_ancestors"] == []
        time.sleep(1.0)
        assert used() == [3, 3, 3, 3] and not alive(pane)
    finally:
        subprocess.run(["tmux", "-S", socket, "kill-server"], check=False)
