"""eagle3_status: one call reads a host's GPUs, training job and server; a part that cannot be read stays empty."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from tests.modules import ROOT, run_module

SMI = "#!/bin/sh\necho '0, GPU-aa, NVIDIA H200, 2048, 143771, 120.50, 700.00, 93'\n"


def fake_smi(tmp_path: Path, text: str = SMI) -> list[str]:
    path = tmp_path / "nvidia-smi"
    path.write_text(text)
    path.chmod(0o755)
    return [str(path)]


def serve_info(info: dict) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":  # SGLang's live gauges (--enable-metrics), over its last log interval
                body = (b'sglang:spec_accept_length{model_name="m"} 2.2\n'
                        b'sglang:gen_throughput{model_name="m"} 640.0\n')  # fmt: skip
                self.send_response(200)
            else:
                body = json.dumps(info).encode() if self.path == "/get_server_info" else b"{}"
                self.send_response(200 if self.path == "/get_server_info" else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def test_one_call_reads_the_gpus_the_job_and_the_server(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "attempts.json").write_text(json.dumps([{"n": 2, "total_seq_len": 16384, "cause": "running"}]))
    server = serve_info({"speculative_draft_model_path": "/srv/draft", "speculative_num_draft_tokens": 5,
                         "internal_states": [{"avg_spec_accept_length": 2.9}]})  # fmt: skip
    try:
        args = {"nvidia_smi": fake_smi(tmp_path), "train_state": str(state), "python": sys.executable,
                "payload_dir": str(ROOT / "eagle3_ops" / "payloads"),
                "server_url": f"http://127.0.0.1:{server.server_port}", "served_record": str(tmp_path / "served.json")}
        (tmp_path / "served.json").write_text(json.dumps({"accept_length": 2.9, "draft": "/srv/draft"}))
        got = run_module("eagle3_status", args, check=True, capsys=capsys)
    finally:
        server.shutdown()
    assert got["changed"] is False and got["gpus_read"] is True
    assert got["gpus"] == [{"index": 0, "uuid": "GPU-aa", "name": "NVIDIA H200", "memory_used": 2048,
                            "memory_total": 143771, "power_draw": 120.5, "power_limit": 700.0,
                            "utilization_gpu": 93}]  # fmt: skip
    assert got["training"]["attempt"] == 2 and got["training"]["total_seq_len"] == 16384
    assert got["training"]["result"] is False
    warning = got["serving"].pop("drift_warning")
    assert got["serving"] == {"draft": "/srv/draft", "draft_tokens": 5, "accept_length": 2.9, "live_accept_length": 2.2,
                              "tokens_per_s": 640.0, "gate_accept_length": 2.9}  # fmt: skip
    assert warning.startswith("accepts 2.20 tokens per step live, 24% below the 2.90 its gate measured at deploy")
    assert not (state / "monitor.json").exists()  # read-only: no power sample recorded


def test_what_cannot_be_read_is_left_empty(tmp_path, capsys):
    broken = fake_smi(tmp_path, "#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    got = run_module("eagle3_status", {"nvidia_smi": broken, "train_state": str(tmp_path / "none"),
                                       "python": sys.executable, "payload_dir": str(tmp_path),
                                       "server_url": "http://127.0.0.1:9", "timeout": 2}, capsys=capsys)  # fmt: skip
    assert not got.get("failed")
    assert got["gpus"] == [] and got["gpus_read"] is False
    assert got["training"] is None and got["serving"] is None


def test_the_router_host_reports_the_routers_view(tmp_path, capsys):
    workers = {
        "workers": [
            {"id": "a", "url": "http://10.0.0.33:30000", "is_healthy": True, "status": "ready", "load": 1},
            {"id": "b", "url": "http://10.0.0.34:30000", "is_healthy": False, "status": "pending"},
        ]
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/workers" else 404)
            self.end_headers()
            self.wfile.write(json.dumps(workers).encode() if self.path == "/workers" else b"{}")

        def log_message(self, *_args: object) -> None:
            pass

    router = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=router.serve_forever, daemon=True).start()
    try:
        got = run_module("eagle3_status", {"nvidia_smi": fake_smi(tmp_path), "router_url": f"http://127.0.0.1:{router.server_port}",
                                           "timeout": 2}, capsys=capsys)  # fmt: skip
        none = run_module("eagle3_status", {"nvidia_smi": fake_smi(tmp_path), "router_url": "http://127.0.0.1:9",
                                            "timeout": 2}, capsys=capsys)  # fmt: skip
    finally:
        router.shutdown()
    assert got["router"] == [
        {"url": "http://10.0.0.33:30000", "healthy": True, "status": "ready", "load": 1},
        {"url": "http://10.0.0.34:30000", "healthy": False, "status": "pending", "load": None},
    ]
    assert none["router"] is None and none["gpus_read"] is True  # a router that does not answer fails nothing
