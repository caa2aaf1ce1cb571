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
