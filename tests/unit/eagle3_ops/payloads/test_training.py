"""Training payload: OOM back-off down the plan's ladder, resume from complete checkpoints, tau."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from eagle3_ops.payloads.training import budget, checkpoints, metrics
from tests.modules import ROOT

FAKE = ROOT / "tests" / "data" / "fake_trainer.py"
def test_ladder_and_oom_detection():
    assert budget.ladder_from(32768, 8192) == [32768, 24576, 16384, 12288, 8192]
    assert budget.ladder_from(20000, 8192) == [20000, 16384, 12288, 8192]
    assert budget.died_of_oom(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert not budget.died_of_oom(1, "ValueError: bad config")
    assert not budget.died_of_oom(0, "out of memory")


def test_tau():
    assert metrics.tau_from_full([0.747, 0.55, 0.4]) == pytest.approx(2.697)
    assert metrics.tau_from_conditional([0.8, 0.5]) == pytest.approx(1 + 0.8 + 0.4)
    assert metrics.tau_constant(0.5, 3) == pytest.approx((1 - 0.5**4) / 0.5)
    # speculators 0.9 writes val_metrics.json keys with an _epoch suffix and cond_acc for per-step accuracy
    real = {"loss_0_epoch": 1.9, "full_acc_0_epoch": 0.63, "cond_acc_0_epoch": 0.63, "full_acc_1_epoch": 0.32,
            "cond_acc_1_epoch": 0.51, "full_acc_2_epoch": 0.14, "cond_acc_2_epoch": 0.42, "loss_epoch": 6.4}
    got = metrics.epoch_summary(real)
    assert got["full_accuracy"] == [0.63, 0.32, 0.14] and got["step_accuracy"] == [0.63, 0.51, 0.42]
    assert got["tau"] == pytest.approx(2.09)
    summary = metrics.epoch_summary({"full_acc_0": 0.7, "full_acc_1": 0.5, "acc_0": 0.7, "acc_1": 0.71, "loss": 2})
    assert summary["tau"] == pytest.approx(2.2) and summary["step_accuracy"] == [0.7, 0.71]


def test_collect_lists_checkpointed_epochs_that_speculators_left_unscored(tmp_path):
    # speculators writes val_metrics.json only for an epoch that lowered the validation loss.
    for epoch, acc in ((0, 0.5), (1, None), (2, 0.7)):
        (tmp_path / str(epoch)).mkdir()
        if acc is not None:
            (tmp_path / str(epoch) / "val_metrics.json").write_text(json.dumps({"cond_acc_0_epoch": acc}))
    (tmp_path / "checkpoint_best").symlink_to("2")
    got = metrics.collect(str(tmp_path))
    assert got["checkpoints"] == [0, 1, 2] and got["unscored"] == [1] and sorted(got["epochs"]) == [0, 2]
    assert got["best_epoch"] == 2 and got["tau"] == pytest.approx(1.7)


def launcher(tmp_path: Path, start: int, env: dict[str, str], epochs: int = 3) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "eagle3_ops.payloads.training.launcher", "--save-dir", str(tmp_path / "save"),
           "--state", str(tmp_path / "state"), "--start", str(start), "--floor", "8192", "--",
           sys.executable, str(FAKE), "--save-path", str(tmp_path / "save"), "--total-seq-len", "{total_seq_len}",
           "--epochs", str(epochs)]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def test_oom_backs_off_down_the_ladder_and_records_each_attempt(tmp_path):
    proc = launcher(tmp_path, 32768, {"FAKE_OOM_ABOVE": "16384"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    attempts = json.loads((tmp_path / "state" / "attempts.json").read_text())
    assert [(a["total_seq_len"], a["cause"]) for a in attempts] == [
        (32768, "out_of_memory"),
        (24576, "out_of_memory"),
        (16384, "completed"),
    ]
    result = json.loads((tmp_path / "state" / "result.json").read_text())
    assert result["total_seq_len"] == 16384 and result["best_epoch"] == 3
    assert result["tau"] == pytest.approx(1 + 0.6 + 0.36 + 0.216)
    # The weights are as readable as the configs beside them (the trainer left them 0600).
    mask = os.umask(0)
    os.umask(mask)
    modes = {p.stat().st_mode & 0o777 for p in (tmp_path / "save").glob("*/model.safetensors")}
    assert modes == {0o666 & ~mask}
    # Files and links beside the epochs (speculators keeps checkpoint_best as a link, logs as files) are fine.
    (tmp_path / "save" / "notes.txt").write_text("x")
    (tmp_path / "save" / "checkpoint_best").symlink_to("3")
    os.chmod(tmp_path / "save" / "3" / "model.safetensors", 0o600)
    assert checkpoints.readable_weights(str(tmp_path / "save")) == [str(tmp_path / "save" / "3" / "model.safetensors")]
    # Started again once finished (systemd's restart raced a play's start): nothing happens, no new attempt.
    proc = launcher(tmp_path, 32768, {"FAKE_OOM_ABOVE": "16384"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "the job is complete" in out
    assert len(json.loads((tmp_path / "state" / "attempts.json").read_text())) == 3
    # A restart of an unfinished job does not retry the budgets that ran out of memory.
    (tmp_path / "state" / "result.json").unlink()
    proc = launcher(tmp_path, 32768, {"FAKE_OOM_ABOVE": "16384"})
    proc.communicate(timeout=60)
    attempts = json.loads((tmp_path / "state" / "attempts.json").read_text())
    assert attempts[-1]["total_seq_len"] == 16384 and len(attempts) == 4


def test_resume_after_a_kill_mid_epoch_ignores_the_partial_checkpoint(tmp_path):
    proc = launcher(tmp_path, 8192, {"FAKE_EPOCH_SECONDS": "1.5"}, epochs=4)
    save = tmp_path / "save"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (save / "3").exists():
        time.sleep(0.05)
    time.sleep(0.3)  # epoch 3's weights are half written
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert checkpoints.newest_complete(str(save)).epoch == 2
    assert [e.epoch for e in checkpoints.scan(str(save)) if not e.complete] == [3]
    proc = launcher(tmp_path, 8192, {"FAKE_EPOCH_SECONDS": "0"}, epochs=4)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "resuming after epoch 2" in out and "set aside the partial checkpoint" in out
    assert [e.epoch for e in checkpoints.scan(str(save))] == [1, 2, 3, 4]
    assert all(e.complete for e in checkpoints.scan(str(save)))
    attempts = json.loads((tmp_path / "state" / "attempts.json").read_text())
    assert attempts[-1]["resume_from_epoch"] == 2
    assert [a["cause"] for a in attempts] == ["interrupted", "completed"]  # the killed launcher could not say


@pytest.mark.parametrize(("code", "exits"), [(7, 7), (4, 1)])
def test_a_non_oom_failure_stops_with_its_code(tmp_path, code, exits):
    # (a trainer's code that is one of the launcher's own verdicts, which systemd does not restart, becomes 1)
    proc = launcher(tmp_path, 8192, {})
    proc.communicate(timeout=60)
    bad = [sys.executable, "-m", "eagle3_ops.payloads.training.launcher", "--save-dir", str(tmp_path / "s2"),
           "--state", str(tmp_path / "st2"), "--start", "8192", "--", sys.executable, "-c",
           f"import sys; print('ValueError: bad config'); sys.exit({code})", "{total_seq_len}"]  # fmt: skip
    result = subprocess.run(bad, cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == exits
    attempts = json.loads((tmp_path / "st2" / "attempts.json").read_text())
    assert attempts[0]["cause"] == "error" and "bad config" in attempts[0]["log_tail"]


# vLLM 0.32's /metrics after a CPU run of the lab's drafter (20 prompts, 3 speculative tokens), trimmed.
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/m"} 389.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="/m"} 1.7960798032709386e+09
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/m"} 1167.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/m"} 574.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="0"} 269.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="1"} 178.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/m",position="2"} 127.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{engine="0",model_name="/m",position="2"} 1.79e+09
"""


def test_vllm_acceptance_comes_from_the_counters_this_run_moved():
    from eagle3_ops.payloads.training import vllm_accept

    after = vllm_accept.parse_counters(VLLM_METRICS)
    assert after["spec_decode_num_drafts"] == 389 and after["accepted_per_pos.2"] == 127
    before = {"spec_decode_num_drafts": 89.0, "spec_decode_num_accepted_tokens": 74.0,
              "spec_decode_num_draft_tokens": 267.0, "accepted_per_pos.0": 69.0}  # fmt: skip
    got = vllm_accept.judge(before, after, tokens=900, prompts=20)
    assert got["drafts"] == 300 and got["accepted_tokens"] == 500
    assert got["accept_length"] == pytest.approx(2.6667, abs=1e-3)
    assert got["per_position"] == [pytest.approx(200 / 300, abs=1e-4), pytest.approx(178 / 300, abs=1e-4),
                                   pytest.approx(127 / 300, abs=1e-4)]  # fmt: skip
    assert got["acceptance_rate"] == pytest.approx(500 / 900, abs=1e-4)
    assert vllm_accept.judge(after, after, 0, 1)["accept_length"] is None


# A two-node job without torch: each node's "trainer" stands for that node's torchrun. The follower's ranks run out of
# memory above a budget (as one node with smaller GPUs would); the leader's then lose their peer, as gloo/NCCL do.
NODE = r"""
import os, sys, time
role, attempt, total, shared = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
limit = int(os.environ.get("NODE_OOM_ABOVE", "0") or 0)
if role == "follower":
    if limit and total > limit:
        open(os.path.join(shared, f"fail-{attempt}"), "w").close()
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
        sys.exit(1)
    open(os.path.join(shared, f"ok-{attempt}"), "w").close()
    print(f"follower trained attempt {attempt} at {total}", flush=True)
    sys.exit(0)
deadline = time.time() + 20
while time.time() < deadline:
    if os.path.exists(os.path.join(shared, f"fail-{attempt}")):
        print("RuntimeError: [gloo] Connection closed by peer", flush=True)
        sys.exit(1)
    if os.path.exists(os.path.join(shared, f"ok-{attempt}")):
        os.execv(sys.executable, [sys.executable, *sys.argv[5:]])
    time.sleep(0.05)
sys.exit(5)
"""


@pytest.fixture
def reap():
    """Launchers a test started are killed (process group) whatever the test's outcome: a follower waits for ever."""
    started: list[subprocess.Popen] = []
    yield started.append
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def node_launcher(tmp_path: Path, role: str, env: dict[str, str]) -> subprocess.Popen:
    script = tmp_path / "node.py"
    script.write_text(NODE)
    leader_state, follower_state = tmp_path / "state", tmp_path / "state" / "node-1"
    own = ["--state", str(leader_state), "--peer-state", str(follower_state)] if role == "leader" else [
        "--state", str(follower_state), "--follow", str(leader_state)]  # fmt: skip
    cmd = [sys.executable, "-m", "eagle3_ops.payloads.training.launcher", "--save-dir", str(tmp_path / "save"), *own,
           "--start", "32768", "--floor", "8192", "--", sys.executable, str(script), role, "{attempt}",
           "{total_seq_len}", str(tmp_path), str(FAKE), "--save-path", str(tmp_path / "save"), "--total-seq-len",
           "{total_seq_len}", "--epochs", "2"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def test_a_follower_node_joins_each_attempt_and_its_out_of_memory_backs_the_leader_off(tmp_path, reap):
    env = {"NODE_OOM_ABOVE": "16384"}
    follower = node_launcher(tmp_path, "follower", env)  # started first: it waits for the leader's attempt
    reap(follower)
    time.sleep(0.5)
    leader = node_launcher(tmp_path, "leader", env)
    reap(leader)
    out, _ = leader.communicate(timeout=120)
    assert leader.returncode == 0, out
    for state in ("state", "state/node-1"):  # each node beat while it ran, the follower too (the leader watches it)
        assert json.loads((tmp_path / state / "heartbeat").read_text())["beat"] >= 1
    fout, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0, fout
    lead = json.loads((tmp_path / "state" / "attempts.json").read_text())
    assert [(a["n"], a["total_seq_len"], a["cause"]) for a in lead] == [
        (1, 32768, "out_of_memory"),
        (2, 24576, "out_of_memory"),
        (3, 16384, "completed"),
    ]
    assert lead[0]["peer"] == str(tmp_path / "state" / "node-1")  # the leader's own ranks only lost their peer
    mine = json.loads((tmp_path / "state" / "node-1" / "attempts.json").read_text())
    assert [(a["n"], a["total_seq_len"], a["cause"]) for a in mine] == [
        (1, 32768, "out_of_memory"),
        (2, 24576, "out_of_memory"),
        (3, 16384, "completed"),
    ]
    assert json.loads((tmp_path / "state" / "result.json").read_text())["total_seq_len"] == 16384
    assert not (tmp_path / "state" / "node-1" / "result.json").exists()  # one result, the leader's


def follower_of(tmp_path: Path, attempts: list[dict], trainer: list[str], *options: str,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """A follower launcher of the leader state tmp_path/state (holding ``attempts``) running ``trainer``."""
    leader_state = tmp_path / "state"
    leader_state.mkdir()
    (leader_state / "attempts.json").write_text(json.dumps(attempts))
    cmd = [sys.executable, "-m", "eagle3_ops.payloads.training.launcher", "--save-dir", str(tmp_path / "save"),
           "--state", str(leader_state / "node-1"), "--follow", str(leader_state), *options, "--start", "8192",
           "--", sys.executable, *trainer]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, env={**os.environ, **(env or {})})  # fmt: skip


def leader_of(tmp_path: Path, followers: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    """A leader launcher with state tmp_path/state and FOLLOWERS followers (node-1...), a 2 s node timeout, whose
    trainer waits as ranks at a rendezvous do."""
    state = tmp_path / "state"
    peers = [arg for k in range(1, followers + 1) for arg in ("--peer-state", str(state / f"node-{k}"))]
    cmd = [sys.executable, "-m", "eagle3_ops.payloads.training.launcher", "--save-dir", str(tmp_path / "save"),
           "--state", str(state), *peers, "--leader-timeout", "2", "--start", "8192", "--", sys.executable, "-c",
           "import time; time.sleep(99)", "{total_seq_len}"]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)  # fmt: skip


def test_a_follower_abandons_a_rendezvous_the_leader_left_and_joins_its_next_attempt(tmp_path, reap):
    leader_state = tmp_path / "state"
    # The leader's launcher died with attempt 1 "running"; the follower joins it and waits at its rendezvous.
    follower = follower_of(tmp_path, [{"n": 1, "total_seq_len": 8192, "cause": "running"}], [
        "-c", "import sys, time; print('joined', sys.argv[1], flush=True); time.sleep(0 if sys.argv[1] == '2' else 60)",
        "{attempt}", "{total_seq_len}"])  # fmt: skip
    reap(follower)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (leader_state / "node-1" / "attempt-1.log").exists():
        time.sleep(0.1)
    time.sleep(1)
    # The restarted leader runs attempt 2: the follower stops waiting on attempt 1 and joins it.
    restarted = [{"n": 1, "total_seq_len": 8192, "cause": "interrupted"},
                 {"n": 2, "total_seq_len": 8192, "cause": "running"}]  # fmt: skip
    (leader_state / "attempts.json").write_text(json.dumps(restarted))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and '"completed"' not in (leader_state / "node-1" / "attempts.json").read_text():
        time.sleep(0.1)
    assert follower.poll() is None  # its ranks are done; it waits for the leader's result
    (leader_state / "result.json").write_text("{}")
    out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 0, out
    mine = json.loads((leader_state / "node-1" / "attempts.json").read_text())
    assert [(a["n"], a["cause"]) for a in mine] == [(1, "signal SIGTERM"), (2, "completed")]
    assert "the leader left this attempt" in out


def test_a_follower_whose_leader_runs_no_attempt_stops_with_its_own_exit_code(tmp_path, reap):
    # The leader's last attempt ended (its node went down before the next): nothing to join.
    ended = [{"n": 1, "total_seq_len": 8192, "cause": "error"}]
    follower = follower_of(tmp_path, ended, ["-c", "pass", "{total_seq_len}"], "--leader-timeout", "2")
    reap(follower)
    out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 4, out  # the unit's RestartPreventExitStatus: systemd leaves it failed
    assert "has given no sign of life for 2 s" in out and "once the leader's node is back" in out


def beat_in(state: Path) -> threading.Event:
    """Beat a node's heartbeat in STATE (as its launcher does, faster) until the returned event is cleared."""
    beating = threading.Event()
    beating.set()
    state.mkdir(parents=True, exist_ok=True)

    def beat() -> None:
        count = 0
        while beating.is_set():
            count += 1
            (state / "heartbeat").write_text(json.dumps({"beat": count}))
            time.sleep(0.3)

    threading.Thread(target=beat, daemon=True).start()
    return beating


def test_a_follower_waits_while_the_leader_beats_and_leaves_an_attempt_once_it_goes_silent(tmp_path, reap):
    leader_state = tmp_path / "state"
    # The leader runs attempt 1 (its ranks wait at their rendezvous, as ours do): the follower joins it.
    follower = follower_of(tmp_path, [{"n": 1, "total_seq_len": 8192, "cause": "running"}],
                           ["-c", "import time; time.sleep(99)", "{total_seq_len}"], "--leader-timeout", "2",
                           env={"EAGLE3_TRAIN_HOSTS": "ct131,ct132"})  # fmt: skip
    beating = beat_in(leader_state)
    reap(follower)
    time.sleep(5)  # beyond the timeout: a leader that beats is waited for, however long its attempt
    assert follower.poll() is None
    beating.clear()  # the leader's node is gone: no beat, no rendezvous partner
    out, _ = follower.communicate(timeout=30)
    assert follower.returncode == 4, out
    assert "went silent: stopping this node's trainer" in out and "no sign of life for 2 s" in out
    # The node's verdict on the attempt it left: the leader's node named (the unit's EAGLE3_TRAIN_HOSTS), the
    # attempt's own ending kept.
    mine = json.loads((leader_state / "node-1" / "attempts.json").read_text())
    assert {k: mine[-1].get(k) for k in ("n", "cause", "node", "ended_as")} == {
        "n": 1, "cause": "node_gone", "node": "ct131", "ended_as": "signal SIGTERM"}, mine  # fmt: skip


def test_a_leader_waits_while_its_followers_beat_and_stops_the_job_naming_the_node_that_goes_silent(tmp_path, reap):
    """A follower's node dies (or its unit stops for good): the leader's ranks would wait in a collective, or a
    restarted leader at a rendezvous that node never joins, and systemd would start it into the same wait again.
    The leader stops its attempt once that follower gives no sign of life for the timeout and exits 5 (not
    restarted), its record naming the node."""
    state = tmp_path / "state"
    beats = [beat_in(state / "node-1"), beat_in(state / "node-2")]
    leader = leader_of(tmp_path, 2, {"EAGLE3_TRAIN_HOSTS": "ct131,ct132,ct133"})
    reap(leader)
    time.sleep(5)  # beyond the timeout: followers that beat are waited for, however long the attempt
    assert leader.poll() is None
    beats[1].clear()  # node-2's node is gone
    out, _ = leader.communicate(timeout=30)
    beats[0].clear()
    assert leader.returncode == 5, out  # the unit's RestartPreventExitStatus: systemd leaves it failed
    assert "the node ct133 went silent: stopping this node's trainer" in out
    assert "the node ct133 (state " in out and "no sign of life for 2 s" in out and "remaining trainers" in out
    tried = json.loads((state / "attempts.json").read_text())
    assert [(a["n"], a["cause"], a.get("node")) for a in tried] == [(1, "node_gone", "ct133")], tried
    assert not (state / "result.json").exists()


def test_a_restarted_leader_whose_follower_never_beats_stops_instead_of_waiting_at_its_rendezvous(tmp_path, reap):
    # The follower's unit failed for good while the leader's node was down (its heartbeat, stale, never changes);
    # the leader's node came back and its unit started the job again: its attempt would wait for that node.
    state = tmp_path / "state"
    (state / "node-1").mkdir(parents=True)
    (state / "node-1" / "heartbeat").write_text(json.dumps({"beat": 7}))
    (state / "attempts.json").write_text(json.dumps([{"n": 1, "total_seq_len": 8192, "cause": "running"}]))
    leader = leader_of(tmp_path, 1)
    reap(leader)
    out, _ = leader.communicate(timeout=30)
    assert leader.returncode == 5, out
    tried = json.loads((state / "attempts.json").read_text())
    # (no EAGLE3_TRAIN_HOSTS: the node is named by its state directory)
    assert [(a["n"], a["cause"], a.get("node")) for a in tried] == [
        (1, "interrupted", None), (2, "node_gone", str(state / "node-1"))]  # fmt: skip


def test_monitor_reads_the_newest_figures_from_the_end_of_an_attempts_log(tmp_path):
    from eagle3_ops.payloads.training import monitor

    log = tmp_path / "attempt-1.log"
    early = "Training epoch 1/5 global_step=1 profile/tokens_per_s=9.0\n"
    log.write_text(early + "x" * (300 * 1024) + "\nTraining epoch 2/5 global_step=40 profile/tokens_per_s=1.5e+03\n")
    assert monitor.progress(str(log)) == {"epoch": 2, "epochs": 5, "step": 40, "tokens_per_s": 1500.0}
    assert monitor.progress(str(tmp_path / "attempt-2.log")) == {}  # no log yet


def test_monitor_eta_from_the_measured_step_rate():
    from eagle3_ops.payloads.training import monitor

    acc: dict = {}
    sample = {"attempt": 1, "epoch": 2, "epochs": 3, "step": 120}
    assert monitor.eta(acc, sample, 100, now=0.0) == {"steps_per_epoch": 100}  # the first sample: no rate yet
    got = monitor.eta(acc, {**sample, "step": 130}, 100, now=20.0)  # 10 steps in 20 s
    assert got == {"steps_per_epoch": 100, "step_s": 2.0, "eta_epoch_s": 140, "eta_s": 340}
    assert "step_s" not in monitor.eta(acc, {**sample, "attempt": 2, "step": 5}, 100, now=30.0)  # a new attempt
