"""module_utils/_gate.py: a server's health asked over HTTP - a closed port is no answer, never an error."""

from __future__ import annotations

import http.server
import socket
import threading

from tests.modules import module_utils

gate = module_utils("_gate")


def test_health_answers_from_a_server_and_not_from_a_closed_port():
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        assert gate.answers(f"{base}/health", 5) is True
        assert gate.answers(f"{base}/other", 5) is False
    finally:
        server.shutdown()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert gate.answers(f"http://127.0.0.1:{closed}/health", 2) is False


def test_a_health_wait_on_a_closed_port_ends_at_its_timeout():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    assert gate.wait_healthy(f"http://127.0.0.1:{closed}", 0.3, 0.05) is None


class _Replies:
    def __init__(self, short: str | None) -> None:
        self.short = short

    def too_short(self, smoke):
        return self.short


def test_the_accept_gate_passes_above_its_floor_and_names_the_length_and_the_hint_below():
    passed = {"accept_length": 2.5, "smoke": [{}]}
    assert gate.accept_refusal(_Replies(None), passed, 1.05, "", "hint") is None
    assert gate.accept_refusal(_Replies(None), {"accept_length": None}, None, "", "hint") is None  # no floor set
    said = gate.accept_refusal(_Replies(None), {"accept_length": 1.0}, 1.05, "at 16 draft tokens", "retrain.")
    assert said == "The server accepts 1.0 tokens per step at 16 draft tokens (gate: above 1.05): retrain."
    none = gate.accept_refusal(_Replies(None), {"accept_length": None}, 1.05, "", "h")
    assert none.startswith("The server accepts no tokens per step")
    # Replies of one token each verified nothing: that, not the length, is the sentence.
    assert gate.accept_refusal(_Replies("one token each"), {"accept_length": 1.0}, 1.05, "", "h") == "one token each"
