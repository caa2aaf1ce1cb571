"""The lab's SGLang stand-in: ``python3 -m serving.server`` takes ``sglang.launch_server``'s arguments.

It serves the endpoints eagle3-ops uses - ``/health``, ``/health_generate``, ``/generate``,
``/v1/completions`` and ``/v1/chat/completions`` (streaming or not), ``/v1/models``, and
``/get_server_info`` (``/server_info``) with ``internal_states[0].avg_spec_accept_length``, and
``/v1/loads`` (``num_running_reqs``/``num_waiting_reqs``, SGLang's load report, which a rolling switch reads
to drain a server) - on top of
:mod:`serving.engine`. Unknown arguments are refused, as SGLang refuses them; arguments that only matter
on GPUs (tensor parallel size, memory fraction) are accepted and reported. Decoding is greedy: a request
with temperature > 0 gets HTTP 400 instead of silently different sampling. With ``--api-key`` every endpoint but
the health, readiness and metrics probes asks for ``Authorization: Bearer KEY``, as SGLang's does
(:func:`auth_status`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from serving.engine import DraftLoadError, Engine


class BadRequest(Exception):
    pass


# Paths SGLang answers without a key, by prefix (sglang/srt/utils/auth.py, decide_request_auth: probes and scrapers).
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def auth_status(method: str, path: str, authorization: str | None, api_key: str | None) -> int | None:
    """None when SGLang 0.5.23 lets the request through, else the status it answers (401): its decision for the
    endpoints this engine serves, which are all of its NORMAL level - OPTIONS and the open probes pass, and with an
    API key set every other request needs ``Bearer <key>`` (compared in constant time)."""
    if method == "OPTIONS" or path.startswith(OPEN_PREFIXES) or not api_key:
        return None
    scheme, _sep, token = (authorization or "").partition(" ")
    if scheme.lower() == "bearer" and token and secrets.compare_digest(token, api_key):
        return None
    return 401


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="serving.server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--served-model-name")
    ap.add_argument("--speculative-algorithm", choices=["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM"])
    ap.add_argument("--speculative-draft-model-path")
    ap.add_argument("--speculative-num-steps", type=int)
    ap.add_argument("--speculative-eagle-topk", type=int)
    ap.add_argument("--speculative-num-draft-tokens", type=int)
    ap.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--mem-fraction-static", type=float)
    ap.add_argument("--context-length", type=int)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--trust-remote-code", action="store_true")
    ap.add_argument("--log-level", default="info")
    ap.add_argument("--api-key", help="the key every request but the health, readiness and metrics probes must send")
    # SGLang's key for its admin endpoints (weight updates, cache flushes, profiling): this engine serves none of them,
    # so it only takes the argument a keyed unit passes (SGLang's NORMAL endpoints ignore it: auth_status).
    ap.add_argument("--admin-api-key", help="SGLang's admin endpoints' key (this engine serves none of them)")
    ap.add_argument("--device", choices=["cpu"], default="cpu", help="the reference engine runs on the CPU")
    ap.add_argument("--enable-metrics", action="store_true",
                    help="serve /metrics (Prometheus text) with SGLang's live gauges sglang:spec_accept_length and "
                         "sglang:gen_throughput, as SGLang does with the same flag")  # fmt: skip
    ap.add_argument("--decode-log-interval", type=int, default=40,
                    help="decode forwards per interval of the live gauges (SGLang's default 40)")
    ap.add_argument("--speculative-draft-window-size", type=int,
                    help="the draft's sliding window; the reference engine attends to everything, so it accepts a "
                         "window only when the window covers the whole context")  # fmt: skip
    args = ap.parse_args(argv)
    if args.speculative_algorithm:
        if args.speculative_num_steps is None or args.speculative_num_steps < 1:
            ap.error("--speculative-num-steps must be at least 1 with --speculative-algorithm")
        topk = args.speculative_eagle_topk or 1
        if topk == 1:
            # SGLang forces draft tokens = steps + 1 for chains; say so rather than do it silently.
            if args.speculative_num_draft_tokens not in (None, args.speculative_num_steps + 1):
                print(f"[server] topk 1: --speculative-num-draft-tokens {args.speculative_num_draft_tokens} becomes "
                      f"{args.speculative_num_steps + 1} (steps + 1)", file=sys.stderr)  # fmt: skip
            args.speculative_num_draft_tokens = args.speculative_num_steps + 1
        args.speculative_eagle_topk = topk
    return args


def make_handler(engine: Engine, args: argparse.Namespace, name: str):
    started = time.time()
    # Requests being answered: the engine decodes one at a time (the others wait), so at most one runs.
    in_flight = [0]
    in_flight_lock = threading.Lock()

    def loads() -> dict[str, Any]:
        with in_flight_lock:
            n = in_flight[0]
        core = {"dp_rank": 0, "timestamp": time.time(), "num_running_reqs": min(n, 1),
                "num_waiting_reqs": max(n - 1, 0)}  # fmt: skip
        return {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "version": "eagle3-ops-reference",
                "accelerator": None, "num_accelerators": 0, "loads": [core]}  # fmt: skip

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt: str, *a: Any) -> None:  # one line per request on stderr, like a server log
            sys.stderr.write(f"[server] {self.address_string()} {fmt % a}\n")

        def _send(self, code: int, body: Any, ctype: str = "application/json") -> None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _start_events(self) -> None:
            """A server-sent event stream, one response per connection (as SGLang streams)."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True

        def _body(self) -> dict[str, Any]:
            n = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(n) or b"{}")
            except ValueError as exc:
                raise BadRequest(f"the request body is not JSON: {exc}") from None
            if not isinstance(body, dict):
                raise BadRequest("the request body must be a JSON object")
            return body

        def _refused(self) -> bool:
            """Answer 401 as SGLang does when the request lacks the server's key (auth_status)."""
            status = auth_status(self.command, self.path.split("?")[0], self.headers.get("Authorization"), args.api_key)
            if status is None:
                return False
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)  # the body is read, so the connection stays usable
            self._send(status, {"error": "Unauthorized"})
            return True

        def do_GET(self) -> None:
            if self._refused():
                return
            path = self.path.split("?")[0]
            if path == "/health":
                self._send(200, b"", "text/plain")
            elif path == "/health_generate":
                engine.generate(engine.encode("ping"), 1)
                self._send(200, b"", "text/plain")
            elif path in ("/get_server_info", "/server_info"):
                self._send(200, server_info())
            elif path == "/v1/loads":
                self._send(200, loads())
            elif path == "/metrics" and args.enable_metrics:
                self._send(200, metrics().encode(), "text/plain; version=0.0.4")
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "eagle3-ops",
                                                             "root": args.model_path}]})  # fmt: skip
            else:
                self._send(404, {"error": {"message": f"no route {path}"}})

        def do_POST(self) -> None:
            if self._refused():
                return
            with in_flight_lock:
                in_flight[0] += 1
            try:
                self._post()
            finally:
                with in_flight_lock:
                    in_flight[0] -= 1

        def _post(self) -> None:
            path = self.path.split("?")[0]
            try:
                body = self._body()
                if path == "/generate":
                    self._native(body)
                elif path in ("/v1/completions", "/v1/chat/completions"):
                    self._openai(body, chat=path.endswith("chat/completions"))
                else:
                    self._send(404, {"error": {"message": f"no route {path}"}})
            except (BadRequest, ValueError) as exc:
                self._send(400, {"error": {"message": str(exc), "type": "invalid_request_error"}})
            except Exception as exc:  # a server answers with an error, it does not drop the connection
                self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}", "type": "server_error"}})

        def _params(self, temperature: Any, max_tokens: Any) -> int:
            if temperature not in (None, 0, 0.0):
                raise BadRequest(f"temperature {temperature}: the lab reference engine decodes greedily only; "
                                 "send temperature 0")  # fmt: skip
            if max_tokens is None:
                return 128
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise BadRequest(f"max tokens {max_tokens!r} must be a positive integer")
            return max_tokens

        def _native(self, body: dict[str, Any]) -> None:
            sp = body.get("sampling_params") or {}
            max_new = self._params(sp.get("temperature", 0), sp.get("max_new_tokens"))
            if sp.get("ignore_eos"):
                # bench_serving asks for it by default; decoding here always ends at EOS (run it with
                # --disable-ignore-eos), and a silently shorter output would skew its numbers.
                raise BadRequest("ignore_eos is not implemented by the lab reference engine: send ignore_eos false")
            ids = body.get("input_ids") or engine.encode(body.get("text", ""))
            t0 = time.monotonic()
            if body.get("stream"):
                # SGLang's stream: server-sent events, each carrying the text and token count so far.
                self._start_events()
                so_far: list[int] = []

                def emit(tokens: list[int]) -> None:
                    so_far.extend(tokens)
                    chunk = {"text": engine.decode(so_far), "output_ids": list(so_far), "meta_info": {
                        "prompt_tokens": len(ids), "completion_tokens": len(so_far)}}  # fmt: skip
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                result = engine.generate(list(ids), max_new, on_tokens=emit)
                steps = result["verify_steps"]
                last = {"text": engine.decode(so_far), "output_ids": list(so_far), "meta_info": {
                    "prompt_tokens": len(ids), "completion_tokens": len(so_far), "spec_verify_ct": steps,
                    "spec_accept_length": (1 + result["accepted_drafts"] / steps) if steps else None,
                    "e2e_latency": time.monotonic() - t0}}  # fmt: skip
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                return
            result = engine.generate(list(ids), max_new)
            out = result["output_ids"]
            steps = result["verify_steps"]
            self._send(200, {"text": engine.decode(out), "output_ids": out, "meta_info": {
                "prompt_tokens": len(ids), "completion_tokens": len(out), "spec_verify_ct": steps,
                "spec_accept_length": (1 + result["accepted_drafts"] / steps) if steps else None,
                "e2e_latency": time.monotonic() - t0}})  # fmt: skip

        def _openai(self, body: dict[str, Any], chat: bool) -> None:
            limit = body.get("max_tokens", body.get("max_completion_tokens"))
            max_new = self._params(body.get("temperature", 0), limit)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise BadRequest("messages must be a non-empty list")
                ids = engine.encode(messages=messages)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
                    ids = prompt
                elif isinstance(prompt, str):
                    ids = engine.encode(prompt)
                else:
                    raise BadRequest("prompt must be a string or a list of token ids")
            rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
            obj = "chat.completion" if chat else "text_completion"
            if body.get("stream"):
                self._start_events()

                def emit(tokens: list[int]) -> None:
                    text = engine.decode(tokens)
                    choice = ({"index": 0, "delta": {"content": text}, "finish_reason": None} if chat
                              else {"index": 0, "text": text, "finish_reason": None})  # fmt: skip
                    chunk = {"id": rid, "object": obj + ".chunk", "model": name, "choices": [choice],
                             "usage": {"completion_tokens": len(tokens)}}  # fmt: skip
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                result = engine.generate(list(ids), max_new, on_tokens=emit)
                usage = {"prompt_tokens": len(ids), "completion_tokens": len(result["output_ids"]),
                         "total_tokens": len(ids) + len(result["output_ids"])}  # fmt: skip
                choice: dict[str, Any] = {"index": 0, "finish_reason": finish(result, max_new),
                                          **({"delta": {}} if chat else {"text": ""})}  # fmt: skip
                last: dict[str, Any] = {"id": rid, "object": obj + ".chunk", "model": name, "usage": usage,
                                        "choices": [choice]}  # fmt: skip
                self.wfile.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
                self.wfile.flush()
                return
            result = engine.generate(list(ids), max_new)
            text = engine.decode(result["output_ids"])
            choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if chat
                      else {"index": 0, "text": text})  # fmt: skip
            choice["finish_reason"] = finish(result, max_new)
            n_out = len(result["output_ids"])
            self._send(200, {"id": rid, "object": obj, "created": int(time.time()), "model": name,
                             "choices": [choice], "usage": {"prompt_tokens": len(ids), "completion_tokens": n_out,
                                                            "total_tokens": len(ids) + n_out}})  # fmt: skip

    def finish(result: dict[str, Any], max_new: int) -> str:
        return "length" if len(result["output_ids"]) >= max_new and result["output_ids"][-1] != engine.eos else "stop"

    def metrics() -> str:
        """SGLang's live gauges in Prometheus' text format (sglang/srt/observability/metrics_collector.py: the same
        names, the last completed interval's values, 0 before the first)."""
        with engine.stats.lock:
            gauges = dict(engine.stats.gauges)
        labels = f'{{model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0"}}'
        lines = []
        for metric, what in (("gen_throughput", "The generation throughput (token/s)."),
                             ("spec_accept_length", "Mean acceptance length of speculative decoding (accepted drafts "
                                                    "+ bonus token per forward).")):  # fmt: skip
            lines += [f"# HELP sglang:{metric} {what}", f"# TYPE sglang:{metric} gauge",
                      f"sglang:{metric}{labels} {float(gauges.get(metric, 0.0))}"]  # fmt: skip
        # SGLang's per-request counters (observe_one_finished_request): requests and generated tokens by streaming or
        # not (one series here), verify forwards of speculative requests.
        streamed = labels[:-1] + ',is_streaming="false"}'
        with engine.stats.lock:
            counted = (("num_requests_total", "Number of requests processed.", streamed, engine.stats.requests),
                       ("generation_tokens_total", "Number of generation tokens processed.", streamed,
                        engine.stats.generated),
                       ("spec_verify_calls_total", "Number of speculative decoding verification calls.", labels,
                        engine.stats.verify_steps))  # fmt: skip
        for metric, what, where, value in counted:
            lines += [f"# HELP sglang:{metric} {what}", f"# TYPE sglang:{metric} counter",
                      f"sglang:{metric}{where} {float(value)}"]  # fmt: skip
        return "\n".join(lines) + "\n"

    def server_info() -> dict[str, Any]:
        state: dict[str, Any] = {"requests": engine.stats.requests, "generated_tokens": engine.stats.generated}
        if engine.draft is not None:
            state.update(avg_spec_accept_length=engine.stats.accept_length(), spec_verify_ct=engine.stats.verify_steps,
                         spec_accepted_drafts=engine.stats.accepted_drafts,
                         draft_aux_layer_ids=engine.draft_info["aux_layer_ids"],
                         draft_captured_layer_outputs=engine.draft_info["captured_layer_outputs"],
                         draft_dropped_keys=len(engine.draft_info["dropped"]))  # fmt: skip
        return {"version": "eagle3-ops-reference", "engine": "reference", "model_path": args.model_path,
                "served_model_name": name, "tp_size": args.tp_size, "speculative_algorithm": args.speculative_algorithm,
                "speculative_draft_model_path": args.speculative_draft_model_path,
                "speculative_num_steps": args.speculative_num_steps,
                "speculative_eagle_topk": args.speculative_eagle_topk,
                "speculative_num_draft_tokens": args.speculative_num_draft_tokens,
                "uptime_s": round(time.time() - started, 1), "internal_states": [state]}  # fmt: skip

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        engine = Engine(args.model_path, args.speculative_draft_model_path, args.speculative_algorithm,
                        args.speculative_num_steps or 0, args.speculative_eagle_topk or 1,
                        args.speculative_num_draft_tokens or 0,
                        # The SGLang release this stand-in plays (its loader's rules); set by sglang_serve.
                        sglang_version=os.environ.get("EAGLE3_REFERENCE_SGLANG_VERSION"))  # fmt: skip
    except DraftLoadError as exc:
        print(f"[server] cannot load the draft: {exc}", file=sys.stderr)
        return 2
    engine.stats.log_interval = max(1, args.decode_log_interval)
    context = int(getattr(engine.cfg, "max_position_embeddings", 0) or 0)
    if args.speculative_draft_window_size is not None and args.speculative_draft_window_size < context:
        print(f"[server] --speculative-draft-window-size {args.speculative_draft_window_size} is shorter than the "
              f"context ({context}): the reference engine's draft attends to the whole context and would compute "
              "something else", file=sys.stderr)  # fmt: skip
        return 2
    if engine.draft_info.get("dropped"):
        # SGLang drops unknown keys without a word; the lab says it once in the log.
        print(f"[server] draft keys not loaded (unknown to {args.speculative_algorithm}): "
              f"{', '.join(engine.draft_info['dropped'][:8])}", file=sys.stderr)  # fmt: skip
    name = args.served_model_name or args.model_path
    httpd = ThreadingHTTPServer((args.host, args.port), make_handler(engine, args, name))
    httpd.daemon_threads = True
    print(f"[server] serving {args.model_path} on http://{args.host}:{args.port} "
          f"(speculative: {args.speculative_algorithm or 'off'}, draft tokens {args.speculative_num_draft_tokens})",
          file=sys.stderr, flush=True)  # fmt: skip
    try:
        httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
