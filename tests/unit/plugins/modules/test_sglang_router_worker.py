"""sglang_router_worker against the real router (smg, .venv-router from scripts/bootstrap.sh): a server leaves
the router with requests in flight, none fails, and it is idle before the module returns; it comes back."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.modules import ROOT, run_module

SMG = ROOT / ".venv-router" / "bin" / "smg"


class Worker:
    """A server as the router sees it: SGLang's endpoints, requests that take a while, /v1/loads."""

    def __init__(self, hold: float = 1.5) -> None:
        self.in_flight = 0
        self.served = 0
        lock = threading.Lock()
        me = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a: object) -> None:
                pass

            def _send(self, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                if path == "/v1/loads":
                    self._send({"loads": [{"dp_rank": 0, "num_running_reqs": me.in_flight, "num_waiting_reqs": 0}]})
                elif path in ("/get_model_info", "/model_info"):
                    self._send({"model_path": "tiny", "is_generation": True})
                elif path == "/v1/models":
                    self._send({"object": "list", "data": [{"id": "tiny", "object": "model"}]})
                else:
                    self._send({})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    me.in_flight += 1
                time.sleep(hold)
                with lock:
                    me.in_flight -= 1
                    me.served += 1
                self._send({"text": f"from {me.url}", "meta_info": {}})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def generate(router: str) -> tuple[int, str]:
    req = urllib.request.Request(router + "/generate", data=b'{"text": "hi"}',  # noqa: S310 - loopback only
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback only
            return resp.status, json.loads(resp.read())["text"]
    except Exception as exc:  # a failed request is what the test counts
        return 0, repr(exc)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[tuple[str, Worker, Worker]]:
    assert SMG.exists(), f"{SMG} is missing: run scripts/bootstrap.sh (it installs the pinned router)"
    a, b = Worker(), Worker()
    port = free_port()
    log = (tmp_path / "smg.log").open("w")
    proc = subprocess.Popen([str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                             "--worker-urls", a.url, b.url], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if len([w for w in get(url + "/workers")["workers"] if w.get("is_healthy")]) == 2:
                    break
            except OSError:
                pass
            time.sleep(0.3)
        else:
            pytest.fail(f"the router did not list both workers: {(tmp_path / 'smg.log').read_text()[-2000:]}")
        yield url, a, b
    finally:
        proc.kill()  # its graceful stop waits for a grace period the test does not need
        proc.wait(timeout=30)
        log.close()
        a.httpd.shutdown()
        b.httpd.shutdown()


def test_a_server_leaves_with_requests_in_flight_none_fails_and_it_is_idle_after(router, capsys):
    url, a, b = router
    results: list[tuple[int, str]] = []
    threads = [threading.Thread(target=lambda: results.append(generate(url))) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while a.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.in_flight > 0
    got = run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", "poll": 0.1},
                     capsys=capsys)  # fmt: skip
    assert got["changed"] is True, got
    assert got["in_flight"] >= 1 and a.in_flight == 0  # what it had been sent finished before the module returned
    assert got["drained_seconds"] > 0.3
    assert [w["url"] for w in got["workers"]] == [b.url]
    for t in threads:
        t.join()
    assert [code for code, _ in results] == [200] * 6
    served = a.served
    assert all(generate(url) == (200, f"from {b.url}") for _ in range(3))  # nothing new goes to a
    assert a.served == served
    again = run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent"}, capsys=capsys)
    assert again["changed"] is False


def test_a_server_comes_back_and_check_mode_changes_nothing(router, capsys):
    url, a, b = router
    run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", "drain": False},
               capsys=capsys)  # fmt: skip
    planned = run_module("sglang_router_worker", {"router_url": url, "url": a.url}, check=True, diff=True,
                         capsys=capsys)  # fmt: skip
    assert planned["changed"] is True and a.url in planned["diff"]["after"] and a.url not in planned["diff"]["before"]
    assert [w["url"] for w in get(url + "/workers")["workers"]] == [b.url]
    added = run_module("sglang_router_worker", {"router_url": url, "url": a.url + "/"}, capsys=capsys)
    assert added["changed"] is True
    assert {(w["url"], w["healthy"]) for w in added["workers"]} == {(a.url, True), (b.url, True)}
    assert run_module("sglang_router_worker", {"router_url": url, "url": a.url}, capsys=capsys)["changed"] is False


def test_a_router_that_does_not_answer_is_named_with_the_fix(capsys):
    got = run_module("sglang_router_worker", {"router_url": f"http://127.0.0.1:{free_port()}", "url": "http://127.0.0.1:1",
                                              "state": "absent"}, capsys=capsys)  # fmt: skip
    assert got["failed"] is True
    assert "does not answer GET /workers" in got["msg"] and "sglang_router role" in got["msg"]
    bad = run_module("sglang_router_worker", {"url": "10.0.0.1:30000"}, capsys=capsys)
    assert bad["failed"] is True and "http(s)://ADDRESS:PORT" in bad["msg"]
