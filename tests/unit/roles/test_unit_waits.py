"""The waits on a host's units: eagle3_common's for a job's unit (unit_wait.yml) and for a server's health
(unit_health.yml), and gpu_cleanup's for a job over several nodes to stop on its other hosts (span_wait.yml), run by
Ansible on the controller against a stand-in systemctl (its answer is a file the test writes) and a health endpoint on
loopback: the end of a job, or a server's first healthy answer, is seen within the call that is waiting (the call
watches the host itself), not one poll interval and a round trip later; a server whose unit is gone ends the wait."""

from __future__ import annotations

import http.server
import sys
import threading
import time
from pathlib import Path

from tests.unit.roles.controller_play import role_tasks

SYSTEMCTL = """#!/bin/sh
# systemctl show -p ActiveState [...] [--value] -- UNIT. The state is the file state's content, or - once the seconds
# the file flip names have passed since the first call (kept in first) - the state it names. Each call adds a line to
# calls.
dir=$(dirname "$0")
echo "$*" >> "$dir/calls"
now=$(date +%s.%N)
[ -e "$dir/first" ] || echo "$now" > "$dir/first"
state=$(cat "$dir/state")
if [ -e "$dir/flip" ]; then
  set -- $(cat "$dir/flip") "$@"
  awk -v now="$now" -v first="$(cat "$dir/first")" -v after="$1" 'BEGIN { exit !(now - first >= after) }' && state=$2
  shift 2
fi
case " $* " in
  *" --value "*) echo "$state" ;;
  *) printf 'ActiveState=%s\\nResult=success\\nExecMainStatus=0\\nNRestarts=0\\n' "$state" ;;
esac
"""


def unit(tmp_path: Path, state: str, flip: str = "") -> Path:
    """The stand-in's state (and its change, "SECONDS STATE" after its first call)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "state").write_text(state + "\n")
    if flip:
        (fake / "flip").write_text(flip + "\n")
    return fake


def wait(tmp_path: Path, tasks: str, register: str, values: dict, role: str = "eagle3_common") -> tuple[int, dict, str]:
    fake = tmp_path / "bin"
    (fake / "systemctl").write_text(SYSTEMCTL)
    (fake / "systemctl").chmod(0o755)
    values = {"eagle3_common_unit": "eagle3-job", "eagle3_common_unit_log": str(tmp_path / "job.log"), **values}
    proc, saw = role_tasks(tmp_path, role, tasks, values, fake, keep=register)
    return proc.returncode, saw, proc.stdout


def test_a_job_that_ends_is_seen_within_the_waiting_call(tmp_path):
    unit(tmp_path, "active", flip="1 inactive")
    polls = tmp_path / "polls"
    rc, saw, out = wait(tmp_path, "unit_wait.yml", "eagle3_common_unit_waited", {
        "eagle3_common_unit_timeout": 120, "eagle3_common_unit_poll": 30,
        "eagle3_common_unit_progress": ["sh", "-c", f"echo poll >> {polls}; echo epoch 1"]})  # fmt: skip
    assert rc == 0, out[-3000:]
    assert "ActiveState=inactive" in saw["stdout"] and saw["stdout"].endswith("epoch 1")
    # One call: it watched the unit until it ended, ran the progress once and returned (the poll interval, 30 s,
    # is the most a call waits; a call that returned before the end would be followed by a second one).
    assert polls.read_text() == "poll\n" and saw.get("attempts", 1) == 1


def test_a_job_still_running_after_a_window_reports_progress_and_waits_on(tmp_path):
    unit(tmp_path, "activating", flip="3.5 failed")
    polls = tmp_path / "polls"
    rc, saw, out = wait(tmp_path, "unit_wait.yml", "eagle3_common_unit_waited", {
        "eagle3_common_unit_timeout": 60, "eagle3_common_unit_poll": 1, "eagle3_common_unit_check_result": False,
        "eagle3_common_unit_progress": ["sh", "-c", f"echo poll >> {polls}"]})  # fmt: skip
    assert rc == 0, out[-3000:]
    assert "ActiveState=failed" in saw["stdout"]
    assert 2 <= len(polls.read_text().splitlines()) <= 6 and saw["attempts"] >= 2  # a progress report per window


def test_a_server_is_seen_healthy_within_the_waiting_call(tmp_path):
    fake = unit(tmp_path, "activating")
    asked: list[str] = []

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    port = server.server_address[1]
    server.server_close()  # nothing listens until the "server" comes up
    up: list[http.server.ThreadingHTTPServer] = []

    def start() -> None:  # a second and a half after the wait's first look at the unit
        while not (fake / "first").exists():
            time.sleep(0.05)
        time.sleep(1.5)
        up.append(http.server.ThreadingHTTPServer(("127.0.0.1", port), Health))
        threading.Thread(target=up[0].serve_forever, daemon=True).start()

    started = threading.Thread(target=start, daemon=True)
    started.start()
    try:
        rc, saw, out = wait(tmp_path, "unit_health.yml", "__eagle3_common_unit_health", {
            "eagle3_common_unit_url": f"http://127.0.0.1:{port}", "eagle3_common_unit_python": sys.executable,
            "eagle3_common_unit_timeout": 60, "eagle3_common_unit_what": "The test server"})  # fmt: skip
    finally:
        started.join(timeout=60)
        for s in up:
            s.shutdown()
            s.server_close()
    assert rc == 0, out[-3000:]
    assert saw["rc"] == 0 and saw.get("attempts", 1) == 1 and asked == ["/health"]


def test_a_server_whose_unit_is_gone_ends_the_wait_naming_it(tmp_path):
    unit(tmp_path, "failed")
    (tmp_path / "job.log").write_text("Traceback ...\nRuntimeError: out of memory\n")
    rc, _, out = wait(tmp_path, "unit_health.yml", "__eagle3_common_unit_health", {
        "eagle3_common_unit_url": "http://127.0.0.1:9", "eagle3_common_unit_python": sys.executable,
        "eagle3_common_unit_timeout": 600, "eagle3_common_unit_what": "The test server"})  # fmt: skip
    assert rc == 2
    flat = " ".join(out.split())
    assert "The test server (eagle3-job) on localhost exited (failed): fix what its log" in flat, flat[-2000:]
    assert "RuntimeError: out of memory" in flat


def span_wait(tmp_path: Path, seconds: int) -> tuple[int, dict, str]:
    """gpu_cleanup's wait for the job eagle3-train, which spans this host and (here) localhost."""
    return wait(tmp_path, "span_wait.yml", "__gpu_cleanup_span_active", {
        "__gpu_cleanup_spans": [[{"unit": "eagle3-train", "action": "stop"}, "localhost"]],
        "gpu_cleanup_span_timeout": seconds}, role="gpu_cleanup")  # fmt: skip


def test_a_job_stopping_on_another_host_is_seen_stopped_within_one_call(tmp_path):
    # Told to stop, the unit is deactivating while its processes exit (a job's collectives may take a while).
    fake = unit(tmp_path, "deactivating", flip="1.5 inactive")
    rc, saw, out = span_wait(tmp_path, 60)
    assert rc == 0, out[-3000:]
    (result,) = saw["results"]
    # One call watched the unit on its host until it had stopped (several looks, no retry from the controller).
    assert result["rc"] == 3 and "attempts" not in result
    assert len((fake / "calls").read_text().splitlines()) >= 3


def test_a_job_still_running_on_another_host_fails_the_cleanup_naming_it(tmp_path):
    unit(tmp_path, "active")
    rc, _, out = span_wait(tmp_path, 2)
    assert rc == 2
    flat = " ".join(out.split())
    assert ("eagle3-train on localhost still runs 2 s after it was told to stop: stop it there by hand (systemctl "
            "stop) and rerun the cleanup.") in flat, flat[-2000:]  # fmt: skip
