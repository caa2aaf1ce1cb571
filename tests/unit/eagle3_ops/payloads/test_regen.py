"""Response regeneration against a loopback OpenAI-compatible stub: concurrency, retries, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from eagle3_ops.payloads.training import regen
from tests.modules import ROOT


class Stub:
    """/v1/chat/completions answering 'reply to <last message>'; every 3rd request first gets a 503."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: Counter[str] = Counter()
        self.delay = delay
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                return

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                text = body["messages"][-1]["content"]
                stub.calls[text] += 1
                if hash(text) % 3 == 0 and stub.calls[text] == 1:
                    self.send_response(503)
                    self.end_headers()
                    return
                time.sleep(stub.delay)
                data = json.dumps(
                    {
                        "choices": [{"message": {"role": "assistant", "content": f"reply to {text}"}}],
                        "usage": {"completion_tokens": 3},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def prompts(tmp_path) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"id": f"p{i}", "prompt": f"question {i}"}) + "\n" for i in range(60)))
    return path


def ids(path: Path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


def test_all_prompts_once_with_retries(prompts, tmp_path):
    stub = Stub()
    try:
        out = tmp_path / "responses.jsonl"
        rc = regen.main(["--endpoint", stub.url, "--model", "t", "--prompts", str(prompts), "--out", str(out),
                         "--concurrency", "8", "--retries", "3", "--progress-every", "20"])  # fmt: skip
        assert rc == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert sorted(r["id"] for r in rows) == sorted(f"p{i}" for i in range(60))
        assert all(r["messages"][-1] == {"role": "assistant", "content": f"reply to question {r['id'][1:]}"}
                   for r in rows)  # fmt: skip
        assert any(n == 2 for n in stub.calls.values())  # some were retried after a 503
        assert regen.main(["--endpoint", stub.url, "--model", "t", "--prompts", str(prompts), "--out", str(out)]) == 0
        assert len(ids(out)) == 60  # a rerun of a finished job sends nothing
    finally:
        stub.close()


def test_killed_run_resumes_without_duplicates(prompts, tmp_path):
    stub = Stub(delay=0.05)
    try:
        out = tmp_path / "responses.jsonl"
        cmd = [sys.executable, "-m", "eagle3_ops.payloads.training.regen", "--endpoint", stub.url, "--model", "t",
               "--prompts", str(prompts), "--out", str(out), "--concurrency", "4"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out.exists() or len(out.read_text().splitlines()) < 15):
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        partial = len(ids(out))
        assert 15 <= partial < 60
        with out.open("a") as fh:
            fh.write('{"id": "p59", "messages": [')  # a line torn by the crash
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert f"{partial} already done" in result.stderr
        final = ids(out)
        assert len(final) == 60 and len(set(final)) == 60
    finally:
        stub.close()


def test_bad_prompt_files_are_named(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "a"}\n{"id": 1, "prompt": "b"}\n')
    with pytest.raises(SystemExit, match="repeats id '1'"):
        regen.load_prompts(str(bad))
    bad.write_text('{"id": 1, "prompt": "a"}\nnot json\n')
    with pytest.raises(SystemExit, match=r"bad\.jsonl:2 is not JSON"):
        regen.load_prompts(str(bad))


def test_an_unreachable_endpoint_gives_up_after_the_retries(prompts, tmp_path):
    with pytest.raises(SystemExit, match="samples failed; rerun to continue"):
        regen.main(["--endpoint", "http://127.0.0.1:9", "--model", "t", "--prompts", str(prompts),
                    "--out", str(tmp_path / "o.jsonl"), "--retries", "1", "--concurrency", "2"])  # fmt: skip
