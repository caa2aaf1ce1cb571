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

    def __init__(self, hold: float = 1.5, key: str | None = None) -> None:
        self.in_flight = 0
        self.refused = 0
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

            def refuse(self) -> bool:
                """SGLang's --api-key: all but /health need the bearer (a 401 otherwise)."""
                if not key or self.path.startswith("/health") or self.headers.get("Authorization") == f"Bearer {key}":
                    return False
                me.refused += 1
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return True

            def do_GET(self) -> None:
                if self.refuse():
                    return
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
                if self.refuse():
                    return
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


KEYS: dict[str, str] = {}


def get(url: str, key: str | None = None) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})  # noqa: S310
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - loopback only
        return json.loads(resp.read())


def generate(router: str, key: str | None = None) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    req = urllib.request.Request(router + "/generate", data=b'{"text": "hi"}', headers=headers)  # noqa: S310 - loopback
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 - loopback only
            return resp.status, json.loads(resp.read())["text"]
    except Exception as exc:  # a failed request is what the test counts
        return 0, repr(exc)


API, ADMIN = "w" * 40, "a" * 40


@pytest.fixture(params=[False, True], ids=["open", "keyed"])
def router(request, tmp_path: Path) -> Iterator[tuple[str, Worker, Worker]]:
    """smg in front of two workers: open, or keyed as the sglang_router role starts it (the servers' API key, and a
    control-plane admin key); the test's calls read the keys from ``KEYS`` (empty when open)."""
    assert SMG.exists(), f"{SMG} is missing: run scripts/bootstrap.sh (it installs the pinned router)"
    keyed = request.param
    KEYS.clear()
    KEYS.update({"api_key": API, "admin_key": ADMIN} if keyed else {})
    a, b = Worker(key=API if keyed else None), Worker(key=API if keyed else None)
    port = free_port()
    log = (tmp_path / "smg.log").open("w")
    keys = ["--api-key", API, "--control-plane-api-keys", f"eagle3-ops:deployer:admin:{ADMIN}"] if keyed else []
    proc = subprocess.Popen([str(SMG), "launch", "--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
                             "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()),
                             "--worker-urls", a.url, b.url, *keys], stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                listed = get(url + "/workers", ADMIN if keyed else None)["workers"]
                if len([w for w in listed if w.get("is_healthy")]) == 2:
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
    key = KEYS.get("api_key")
    threads = [threading.Thread(target=lambda: results.append(generate(url, key))) for _ in range(6)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while a.in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert a.in_flight > 0
    got = run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", "poll": 0.1, **KEYS},
                     capsys=capsys)  # fmt: skip
    assert got["changed"] is True, got
    assert got["in_flight"] >= 1 and a.in_flight == 0  # what it had been sent finished before the module returned
    assert got["drained_seconds"] > 0.3
    assert [w["url"] for w in got["workers"]] == [b.url]
    for t in threads:
        t.join()
    assert [code for code, _ in results] == [200] * 6
    served = a.served
    assert all(generate(url, key) == (200, f"from {b.url}") for _ in range(3))  # nothing new goes to a
    assert a.served == served
    again = run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", **KEYS},
                       capsys=capsys)  # fmt: skip
    assert again["changed"] is False


def test_a_server_comes_back_and_check_mode_changes_nothing(router, capsys):
    url, a, b = router
    run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", "drain": False, **KEYS},
               capsys=capsys)  # fmt: skip
    planned = run_module("sglang_router_worker", {"router_url": url, "url": a.url, **KEYS}, check=True, diff=True,
                         capsys=capsys)  # fmt: skip
    assert planned["changed"] is True and a.url in planned["diff"]["after"] and a.url not in planned["diff"]["before"]
    assert [w["url"] for w in get(url + "/workers", KEYS.get("admin_key"))["workers"]] == [b.url]
    added = run_module("sglang_router_worker", {"router_url": url, "url": a.url + "/", **KEYS}, capsys=capsys)
    assert added["changed"] is True
    assert {(w["url"], w["healthy"]) for w in added["workers"]} == {(a.url, True), (b.url, True)}
    again = run_module("sglang_router_worker", {"router_url": url, "url": a.url, **KEYS}, capsys=capsys)
    assert again["changed"] is False
    # the worker added back is reached with its key: requests through the router land on both, none refused
    refused = a.refused
    assert {generate(url, KEYS.get("api_key")) for _ in range(4)} == {(200, f"from {a.url}"), (200, f"from {b.url}")}
    assert a.refused == refused
    assert "a" * 40 not in json.dumps(added) and "w" * 40 not in json.dumps(added)


def test_a_router_that_does_not_answer_is_named_with_the_fix(capsys):
    got = run_module("sglang_router_worker", {"router_url": f"http://127.0.0.1:{free_port()}", "url": "http://127.0.0.1:1",
                                              "state": "absent"}, capsys=capsys)  # fmt: skip
    assert got["failed"] is True
    assert "does not answer GET /workers" in got["msg"] and "sglang_router role" in got["msg"]
    bad = run_module("sglang_router_worker", {"url": "10.0.0.1:30000"}, capsys=capsys)
    assert bad["failed"] is True and "http(s)://ADDRESS:PORT" in bad["msg"]


def test_a_keyed_routers_control_plane_refuses_no_key_a_wrong_key_and_the_data_plane_key(router, capsys):
    url, a, _b = router
    if not KEYS:
        pytest.skip("the open router asks for no key")
    for keys, says in [({}, "asks for a key (HTTP 401) and none was sent"),
                       ({"admin_key": "x" * 40}, "refused the serving plane's admin key (HTTP 401)"),
                       ({"admin_key": API}, "refused the serving plane's admin key (HTTP 401)")]:
        got = run_module("sglang_router_worker", {"router_url": url, "url": a.url, "state": "absent", **keys},
                         capsys=capsys)  # fmt: skip
        assert got["failed"] and says in got["msg"], got["msg"]
        assert "x" * 40 not in got["msg"] and API not in got["msg"]
    assert len(get(url + "/workers", ADMIN)["workers"]) == 2  # nothing was removed
    assert generate(url)[0] == 0 and generate(url, ADMIN)[0] == 0  # the data plane: the API key only (401s)
    assert generate(url, API)[0] == 200
