"""sglang_gate: the smoke requests and the server info in one call; the first request that fails is named."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

from tests.modules import run_module

INFO = {"speculative_num_draft_tokens": 10, "internal_states": [{"avg_spec_accept_length": 2.75}]}


def server(fail_on: int = 0, info_path: str = "/get_server_info") -> tuple[HTTPServer, list[dict]]:
    """A server answering /generate (request ``fail_on`` with HTTP 500) and its info at ``info_path`` only."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, **body})
            if self.path not in ("/generate", "/v1/chat/completions") or len(seen) == fail_on:
                self.send_response(500)
                self.end_headers()
                self.wfile.write(b"scheduler died")
                return
            self.send_response(200)
            self.end_headers()
            # SGLang's two answers: /generate's text and meta_info, the chat API's choices and usage.
            if self.path == "/generate":
                n = body["sampling_params"]["max_new_tokens"]
                answer = {"text": "x" * n, "meta_info": {"completion_tokens": n}}
            else:
                n = body["max_tokens"]
                answer = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "y" * n}}],
                          "usage": {"completion_tokens": n}}  # fmt: skip
            self.wfile.write(json.dumps(answer).encode())

        def do_GET(self) -> None:
            self.send_response(200 if self.path == info_path else 404)
            self.end_headers()
            self.wfile.write(json.dumps(INFO).encode() if self.path == info_path else b"not found")

        def log_message(self, *_args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, seen


def test_one_call_sends_every_smoke_prompt_then_reads_the_accept_length(capsys):
    srv, seen = server(info_path="/server_info")  # a newer SGLang: the first path answers 404
    try:
        got = run_module("sglang_gate", {"url": f"http://127.0.0.1:{srv.server_port}/", "prompts": ["a", "b", "c"],
                                         "max_tokens": 7}, capsys=capsys)  # fmt: skip
    finally:
        srv.shutdown()
    assert not got.get("failed") and got["changed"] is False
    # The default: each prompt a user message through the chat API, so the server applies the model's template.
    assert [s["path"] for s in seen] == ["/v1/chat/completions"] * 3
    assert [s["messages"] for s in seen] == [[{"role": "user", "content": p}] for p in "abc"]
    assert all(s["max_tokens"] == 7 and s["temperature"] == 0 for s in seen)
    assert [(r["prompt"], r["chars"], r["tokens"]) for r in got["smoke"]] == [("a", 7, 7), ("b", 7, 7), ("c", 7, 7)]
    assert got["info_path"] == "server_info" and got["info"] == INFO and got["accept_length"] == 2.75


def test_the_generate_api_posts_the_bare_text(capsys):
    srv, seen = server()
    try:
        got = run_module("sglang_gate", {"url": f"http://127.0.0.1:{srv.server_port}", "prompts": ["a", "b"],
                                         "max_tokens": 5, "api": "generate"}, capsys=capsys)  # fmt: skip
    finally:
        srv.shutdown()
    assert not got.get("failed")
    assert [(s["path"], s["text"]) for s in seen] == [("/generate", "a"), ("/generate", "b")]
    assert all(s["sampling_params"] == {"max_new_tokens": 5, "temperature": 0} for s in seen)
    assert [(r["chars"], r["tokens"]) for r in got["smoke"]] == [(5, 5), (5, 5)]


def test_the_first_failing_request_is_named_and_nothing_after_it_is_sent(capsys):
    srv, seen = server(fail_on=2)
    try:
        got = run_module("sglang_gate", {"url": f"http://127.0.0.1:{srv.server_port}", "prompts": ["a", "b", "c"]},
                         capsys=capsys)  # fmt: skip
    finally:
        srv.shutdown()
    assert got["failed"] and len(seen) == 2
    assert got["msg"].startswith(f"The smoke request 2 of 3 to http://127.0.0.1:{srv.server_port}/v1/chat/completions "
                                 "answered "
                                 "HTTP 500 scheduler died; the server log says why.")  # fmt: skip


def test_a_server_that_does_not_answer_fails_naming_it(capsys):
    got = run_module("sglang_gate", {"url": "http://127.0.0.1:9", "prompts": ["a"], "timeout": 2}, capsys=capsys)
    assert got["failed"] and "The smoke request 1 of 1 to http://127.0.0.1:9/v1/chat/completions failed:" in got["msg"]


def test_no_info_and_no_accept_length_without_speculation(capsys):
    srv, _ = server(info_path="/nowhere")
    try:
        got = run_module("sglang_gate", {"url": f"http://127.0.0.1:{srv.server_port}", "prompts": []}, capsys=capsys)
    finally:
        srv.shutdown()
    assert not got.get("failed") and got["smoke"] == [] and got["info"] == {} and got["accept_length"] is None


def test_check_mode_sends_nothing(capsys):
    srv, seen = server()
    try:
        got = run_module("sglang_gate", {"url": f"http://127.0.0.1:{srv.server_port}", "prompts": ["a"]}, check=True,
                         capsys=capsys)  # fmt: skip
    finally:
        srv.shutdown()
    assert not got.get("failed") and seen == [] and got["smoke"] == [] and got["accept_length"] is None
