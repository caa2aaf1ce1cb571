"""sglang_canary against real HTTP servers on loopback that count as SGLang does: the window ends after N requests
on the canary, both accept lengths come from the counters' differences, the same draft decides at once, a server
that does not answer or asks for another key is named, check mode waits for nothing."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.modules import run_module

KEY = "canary-test-key-0123456789abcdefghij"


class Fake:
    """A server's /get_server_info and /metrics; each /metrics read of the canary counts ``per_read`` requests."""

    def __init__(self, draft, tokens_per_verify, per_read=0, key=KEY):
        self.draft, self.tpv, self.per_read, self.key = draft, tokens_per_verify, per_read, key
        self.requests = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                if self.path == "/get_server_info":
                    if self.headers.get("Authorization") != f"Bearer {fake.key}":
                        self.send_response(401)
                        self.end_headers()
                        return
                    body = json.dumps({"speculative_draft_model_path": fake.draft}).encode()
                else:
                    fake.requests += fake.per_read
                    r = fake.requests
                    body = (f'sglang:num_requests_total{{is_streaming="false"}} {r}\n'
                            f'sglang:generation_tokens_total{{is_streaming="false"}} {r * 10 * fake.tpv}\n'
                            f"sglang:spec_verify_calls_total {r * 10}\n").encode()
                self.send_response(200)
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fakes():
    made = []

    def make(*args, **kwargs):
        made.append(Fake(*args, **kwargs))
        return made[-1]

    yield make
    for f in made:
        f.close()


def run(capsys, check=False, **args):
    base = {"api_key": KEY, "poll_interval": 0.01, "window_seconds": 30, "min_requests": 5}
    return run_module("sglang_canary", {**base, **args}, check=check, capsys=capsys)


def test_a_worse_draft_is_rolled_back_after_its_window(fakes, capsys):
    new, old = fakes("/d/new", 1.5, per_read=3), fakes("/d/old", 2.5, per_read=3)
    res = run(capsys, canary=new.url, peers=[old.url], window_requests=12)
    assert res["decision"] == "rollback" and res["canary_accept_length"] == 1.5 and res["peers_accept_length"] == 2.5
    assert res["canary_requests"] >= 12 and res["peers_draft"] == "/d/old" and res["changed"] is False
    assert "accept length 1.50 against the others' 2.50" in res["reason"]


def test_a_better_draft_is_promoted(fakes, capsys):
    new, old = fakes("/d/new", 2.8, per_read=2), fakes("/d/old", 2.5, per_read=2)
    res = run(capsys, canary=new.url, peers=[old.url], window_requests=10)
    assert res["decision"] == "promote" and res["canary_accept_length"] == 2.8


def test_the_same_draft_has_nothing_to_compare(fakes, capsys):
    a, b = fakes("/d/v", 2.0), fakes("/d/v", 2.0)
    res = run(capsys, canary=a.url, peers=[b.url])
    assert res["decision"] == "same" and a.requests == 0  # no window was read


def test_too_few_requests_in_the_window_roll_back(fakes, capsys):
    new, old = fakes("/d/new", 3.0, per_read=0), fakes("/d/old", 2.0, per_read=1)
    res = run(capsys, canary=new.url, peers=[old.url], window_seconds=0.3)
    assert res["decision"] == "rollback" and res["reason"].startswith("only 0 request(s) reached the canary")


def test_a_peer_that_does_not_answer_or_a_wrong_key_is_named(fakes, capsys):
    new = fakes("/d/new", 2.0)
    res = run(capsys, canary=new.url, peers=["http://127.0.0.1:9"])
    assert res["failed"] and "http://127.0.0.1:9/get_server_info did not answer" in res["msg"]
    other = fakes("/d/old", 2.0, key="other")
    res = run(capsys, canary=new.url, peers=[other.url])
    assert res["failed"] and "refused the serving plane's API key (HTTP 401)" in res["msg"]


def test_check_mode_reads_the_drafts_and_waits_for_nothing(fakes, capsys):
    new, old = fakes("/d/new", 1.0, per_read=1), fakes("/d/old", 2.0, per_read=1)
    res = run(capsys, check=True, canary=new.url, peers=[old.url])
    assert res["decision"] == "promote" and res["reason"].startswith("would watch /d/new") and new.requests == 0
