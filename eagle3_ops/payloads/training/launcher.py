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

A job over several nodes (torchrun's c10d rendezvous) runs one launcher per node. The first node's is the
leader: it owns the save directory, the budget ladder and the result, as above, and numbers each attempt
(``{attempt}`` in the command, for a rendezvous id per attempt). The others run with ``--follow LEADER_STATE``:
each joins whatever attempt the leader is running, at its budget, keeps its own ``attempts.json``, abandons a
rendezvous the leader has left, and waits for the leader's next attempt when one fails (a peer that died, a
restarted leader). The leader reads its followers' records (``--peer-state``): an attempt whose ranks ran out
of memory on another node backs off like one that ran out on its own. Every node's launcher beats
``STATE/heartbeat`` (its own state directory) every HEARTBEAT_EVERY seconds. A follower that sees no beat of the
leader's for ``--leader-timeout`` seconds (the leader's node is down or cut off, its unit stopped or failed for good)
stops its ranks - which would otherwise wait in a collective for the backend's own timeout - and exits
EXIT_LEADER_GONE; a leader that sees no beat of a follower's for as long stops its attempt - whose ranks would wait
in a collective, or at a rendezvous that node never joins, and systemd would start it into the same wait again -
and exits EXIT_NODE_GONE, naming the node. Beats are compared by content on the watching node's own clock, so the
nodes' clocks need not agree.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

try:
    from . import budget as budgets
    from . import checkpoints, metrics
except ImportError:  # pragma: no cover - run as a loose script
    import budget as budgets  # type: ignore[no-redef]
    import checkpoints  # type: ignore[no-redef]
    import metrics  # type: ignore[no-redef]

EXIT_LADDER_EXHAUSTED = 3
EXIT_LEADER_GONE = 4  # a follower whose leader gave no sign of life for --leader-timeout seconds
EXIT_NODE_GONE = 5  # a leader one of whose followers gave no sign of life for --leader-timeout seconds
# The unit's RestartPreventExitStatus: the launcher's own verdicts. A trainer that exits with one of these codes
# failed like any other (systemd restarts it): the launcher exits 1 for it.
OWN_EXITS = (EXIT_LADDER_EXHAUSTED, EXIT_LEADER_GONE, EXIT_NODE_GONE)
FOLLOW_POLL = 1.0  # seconds between looks at the leader's attempts
HEARTBEAT_EVERY = 2.0  # seconds between two beats of a node's launcher
PEER_GRACE = 20.0  # seconds a leader waits for its followers to record how an attempt ended
STOPPING = threading.Event()  # set when the launcher itself got SIGTERM/SIGINT (a stop, not a failure)


def _load_attempts(state: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(state, "attempts.json"), encoding="utf-8") as fh:
            return json.load(fh)
    except (FileNotFoundError, ValueError):
        return []


def _save_attempts(state: str, attempts: list[dict[str, Any]]) -> None:
    checkpoints.aio.write_json_atomic(os.path.join(state, "attempts.json"), attempts)


def _running(state: str) -> dict[str, Any] | None:
    """The attempt a leader's state says is running, or None."""
    attempts = _load_attempts(state)
    return attempts[-1] if attempts and attempts[-1].get("cause") == "running" else None


def beat_forever(state: str) -> None:
    """A node's heartbeat: STATE/heartbeat rewritten in place (one short write; NFS's close-to-open consistency
    shows it to the other nodes' next open) with a counter and this launcher's pid and host."""
    path, count = os.path.join(state, "heartbeat"), 0
    while True:
        count += 1
        try:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"beat": count, "pid": os.getpid(), "host": os.uname().nodename}))
        except OSError as exc:  # a full or unreachable store: the other nodes will say this one is gone
            log(f"cannot beat the heartbeat {path}: {exc}")
        time.sleep(HEARTBEAT_EVERY)


class NodeWatch:
    """How long, on this node's own clock, another node's heartbeat (in its state directory) has not changed."""

    def __init__(self, state: str) -> None:
        self.path = os.path.join(state, "heartbeat")
        self.seen: str | None = None
        self.changed = time.monotonic()

    def silent_for(self) -> float:
        try:
            with open(self.path, encoding="utf-8") as fh:
                now = fh.read()
        except OSError:
            now = None
        if now and now != self.seen:  # an empty read is a beat being written, not a new one
            self.seen, self.changed = now, time.monotonic()
        return time.monotonic() - self.changed


def log(message: str) -> None:
    print(f"[launcher] {message}", flush=True)


def run_attempt(cmd: list[str], log_path: str, abandon: Callable[[], str | None] | None = None) -> tuple[int, str]:
    """Run the trainer in its own process group, teeing its output; (returncode, last lines).

    ``abandon`` is asked every FOLLOW_POLL seconds; once it gives a reason the trainer is stopped (SIGTERM, then
    SIGKILL 10 s later) and the attempt ends with the trainer's signal.
    """
    tail: deque[str] = deque(maxlen=200)
    with open(log_path, "a", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True, bufsize=1)  # fmt: skip

        def forward(signum: int, _frame: object) -> None:
            if _frame is not None:  # a signal to the launcher itself: the unit is being stopped
                STOPPING.set()
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                pass

        def watch() -> None:
            while proc.poll() is None:
                time.sleep(FOLLOW_POLL)
                reason = abandon() if proc.poll() is None and abandon is not None else None
                if reason:
                    log(f"{reason}: stopping this node's trainer")
                    forward(signal.SIGTERM, None)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        forward(signal.SIGKILL, None)
                    return

        if abandon is not None:
            threading.Thread(target=watch, daemon=True).start()
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
    ap.add_argument("--follow", metavar="LEADER_STATE", help="run as a follower node of the leader with this state")
    ap.add_argument("--peer-state", action="append", default=[], help="a follower's state directory (leader)")
    ap.add_argument("--leader-timeout", type=float, default=120,
                    help="a follower stops (exit 4) after this long with no beat from the leader, a leader (exit 5) "
                    "after this long with none from a follower")  # fmt: skip
    args = ap.parse_args(argv[:split])
    template = argv[split + 1 :]
    if not any("{total_seq_len}" in part for part in template):
        print("the trainer command must contain {total_seq_len}", file=sys.stderr)
        return 2
    os.makedirs(args.state, exist_ok=True)
    attempts = _load_attempts(args.state)
    for earlier in attempts:
        if earlier.get("cause") == "running":
            # Its launcher died with it (SIGKILL to the whole unit, a reboot, a migration): say so.
            earlier["cause"] = "interrupted"
    if args.follow:
        return follow(args.follow, args.state, attempts, template, args.leader_timeout)
    if os.path.exists(os.path.join(args.state, "result.json")):
        # Finished (for instance by systemd's restart while a play was deciding to start it): starting it again is
        # a no-op, never a new attempt - which, over several nodes, would wait at a rendezvous no follower joins.
        log(f"the job is complete ({os.path.join(args.state, 'result.json')}): nothing to do")
        return 0
    threading.Thread(target=beat_forever, args=(args.state,), daemon=True).start()
    peers = {peer: NodeWatch(peer) for peer in args.peer_state}

    def silent_peer() -> str | None:
        return next((peer for peer, watch in peers.items() if watch.silent_for() > args.leader_timeout), None)

    def abandon() -> str | None:
        peer = silent_peer()
        return f"the node {node_name(peer)} went silent" if peer else None

    os.makedirs(args.save_dir, exist_ok=True)
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
        attempt: dict[str, Any] = {"n": len(attempts) + 1, "total_seq_len": total, "started": time.time(),
                                   "resume_from_epoch": newest.epoch if newest else None,
                                   "cause": "running"}  # fmt: skip
        attempts.append(attempt)
        _save_attempts(args.state, attempts)
        where = f"resuming from epoch {newest.epoch}" if newest else "from scratch"
        log(f"attempt {attempt['n']}: total_seq_len={total}, {where}")
        rc, tail = run_attempt(command(template, attempt), os.path.join(args.state, f"attempt-{attempt['n']}.log"),
                               abandon if peers else None)  # fmt: skip
        finish(attempt, rc, tail)
        gone = silent_peer() if attempt["cause"] != "completed" and not STOPPING.is_set() else None
        if gone:
            # Its ranks are gone with it: another attempt would wait at a rendezvous it never joins.
            attempt.update(cause="node_gone", node=node_name(gone), peer=gone)
            _save_attempts(args.state, attempts)
            log(f"the node {attempt['node']} (state {gone}) has given no sign of life for {args.leader_timeout:.0f} s "
                "- its node down or cut off, or its unit stopped or failed: stopping the job; start it again with "
                "train.yml once that node is back, or over the remaining trainers (eagle3_train_hosts)")  # fmt: skip
            return EXIT_NODE_GONE
        if attempt["cause"] not in ("completed", "out_of_memory") and not STOPPING.is_set():
            peer = peer_out_of_memory(args.peer_state, attempt["n"])
            if peer:
                attempt.update(cause="out_of_memory", peer=peer)
                log(f"attempt {attempt['n']}: the ranks on the node with state {peer} ran out of memory")
        _save_attempts(args.state, attempts)
        if attempt["cause"] == "completed":
            for path in checkpoints.readable_weights(args.save_dir):
                log(f"made {path} readable as its config.json is (safetensors wrote it 0600)")
            result = metrics.collect(args.save_dir)
            result.update(total_seq_len=total, attempts=len(attempts))
            checkpoints.aio.write_json_atomic(os.path.join(args.state, "result.json"), result)
            log(f"done: tau={result['tau']} (best epoch {result['best_epoch']}) at total_seq_len={total}")
            return 0
        if STOPPING.is_set():
            log(f"stopped during attempt {attempt['n']}; a restart resumes from the newest complete epoch")
            return 128 + signal.SIGTERM
        if attempt["cause"] != "out_of_memory":
            log(f"attempt {attempt['n']} failed ({attempt['cause']}, rc={rc}); a restart resumes from the newest "
                "complete epoch with the same budget")  # fmt: skip
            return (1 if rc in OWN_EXITS else rc) if rc > 0 else 128 - rc
        log(f"attempt {attempt['n']} ran out of memory at total_seq_len={total}; backing off")
    log(f"every budget down to {args.floor} ran out of memory; see attempts.json")
    return EXIT_LADDER_EXHAUSTED


def command(template: list[str], attempt: dict[str, Any]) -> list[str]:
    return [part.replace("{total_seq_len}", str(attempt["total_seq_len"])).replace("{attempt}", str(attempt["n"]))
            for part in template]  # fmt: skip


def finish(attempt: dict[str, Any], rc: int, tail: str) -> None:
    """Record how an attempt ended (and, for an error, the end of its log)."""
    attempt.update(ended=time.time(), returncode=rc, cause=cause_of(rc, tail))
    if attempt["cause"] == "error":
        attempt["log_tail"] = tail[-2000:]


def cause_of(rc: int, tail: str) -> str:
    if rc == 0:
        return "completed"
    if budgets.died_of_oom(rc, tail):
        return "out_of_memory"
    if rc < 0:
        return f"signal {signal.Signals(-rc).name}"
    return "error"


def train_hosts() -> list[str]:
    """The job's trainers in rank order, as the unit names them (EAGLE3_TRAIN_HOSTS; none outside a unit)."""
    return [h for h in os.environ.get("EAGLE3_TRAIN_HOSTS", "").split(",") if h]


def node_name(state: str) -> str:
    """The inventory name of the node whose launcher keeps STATE (node-K: the job's K-th trainer, from the
    unit's EAGLE3_TRAIN_HOSTS), else the directory itself."""
    hosts = train_hosts()
    base = os.path.basename(os.path.normpath(state))
    rank = int(base[5:]) if base.startswith("node-") and base[5:].isdigit() else None
    return hosts[rank] if rank is not None and rank < len(hosts) else state


def leader_name(state: str) -> str:
    """The inventory name of the job's leader (the first of the unit's EAGLE3_TRAIN_HOSTS), else its state directory."""
    hosts = train_hosts()
    return hosts[0] if hosts else state


def peer_out_of_memory(peers: list[str], n: int) -> str | None:
    """The first follower state whose ranks ran out of memory in attempt ``n`` (waiting PEER_GRACE for them)."""
    deadline = time.monotonic() + (PEER_GRACE if peers else 0)
    while True:
        pending = False
        for peer in peers:
            mine = [a for a in _load_attempts(peer) if a.get("n") == n]
            if mine and mine[-1].get("cause") == "out_of_memory":
                return peer
            pending |= not mine or mine[-1].get("cause") == "running"
        if not pending or time.monotonic() > deadline:
            return None
        time.sleep(FOLLOW_POLL)


def follow(leader: str, state: str, attempts: list[dict[str, Any]], template: list[str], timeout: float) -> int:
    """A follower node: join each attempt the leader runs until the leader has its result.

    A leader whose heartbeat stops for ``timeout`` seconds (its node is down or cut off, its unit stopped or failed
    for good) ends the follower with EXIT_LEADER_GONE, which systemd does not restart: the play's wait then names
    the unit. An attempt under way is abandoned then too: its ranks would wait for a peer that is not coming.
    """
    _save_attempts(state, attempts)
    threading.Thread(target=beat_forever, args=(state,), daemon=True).start()  # the leader watches it
    joined: list[dict[str, Any]] = []  # this process's records of the leader's attempts it joined (each seen to end)
    watch = NodeWatch(leader)
    log(f"following the leader's attempts in {leader}")

    while True:
        if os.path.exists(os.path.join(leader, "result.json")):
            log("the leader has its result: done")
            return 0
        lead = _running(leader)
        if lead is None or any(mine["n"] == lead["n"] for mine in joined):
            if watch.silent_for() > timeout:  # also after an attempt the leader's death ended (it stays "running")
                log(f"the leader ({leader}) has given no sign of life for {timeout:.0f} s - its node down or cut off, "
                    "or its unit stopped or failed: stopping; start the job again with train.yml once the leader's "
                    "node is back")  # fmt: skip
                # The node's verdict on its last attempt (however its ranks ended: a lost store, a signal), so that the
                # play names the leader's node rather than quoting the ranks' traceback.
                # (an earlier launch's records stay as they were: a node that joined nothing gets a record of its own)
                last = joined[-1] if joined else {"n": lead["n"] if lead else 0,
                                                  "total_seq_len": lead["total_seq_len"] if lead else None}  # fmt: skip
                if not joined:
                    attempts.append(last)
                last.update(ended_as=last.get("cause"), cause="node_gone", node=leader_name(leader), peer=leader,
                            ended=last.get("ended", time.time()))  # fmt: skip
                _save_attempts(state, attempts)
                return EXIT_LEADER_GONE
            time.sleep(FOLLOW_POLL)
            continue
        n = lead["n"]
        attempt: dict[str, Any] = {"n": n, "total_seq_len": lead["total_seq_len"], "started": time.time(),
                                   "cause": "running"}  # fmt: skip
        attempts.append(attempt)
        joined.append(attempt)
        _save_attempts(state, attempts)
        log(f"joining the leader's attempt {n}: total_seq_len={lead['total_seq_len']}")

        def abandoned(n: int = n) -> str | None:
            now = _running(leader)
            if now is not None and now["n"] != n:
                return "the leader left this attempt"
            return "the leader went silent" if watch.silent_for() > timeout else None

        rc, tail = run_attempt(command(template, lead), os.path.join(state, f"attempt-{n}.log"), abandoned)
        finish(attempt, rc, tail)
        _save_attempts(state, attempts)
        if STOPPING.is_set():
            log(f"stopped during attempt {n}")
            return 128 + signal.SIGTERM
        # Done once the leader has its result (it collects it after its own ranks end); until then a new attempt of
        # the leader's (it restarted before writing it) is joined like any other.
        log(f"attempt {n} ended on this node ({attempt['cause']}, rc={rc}); waiting for the leader's result or its "
            "next attempt")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
