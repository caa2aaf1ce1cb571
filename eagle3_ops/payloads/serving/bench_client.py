"""Load generator for an SGLang-compatible server, reporting what ``sglang.bench_serving`` reports.

Sends ``--num-prompts`` streaming ``/v1/chat/completions`` requests (one user turn each, so the target's chat
template applies as in production traffic) with at most ``--max-concurrency`` in flight,
greedy, ``--max-tokens`` each, and measures per request the time to first token (TTFT) and the gaps
between streamed chunks (ITL; with speculative decoding one chunk may carry several tokens, as in SGLang's
stream). Output throughput is completion tokens over wall time. The accept length is the server's own
count over this run (``/get_server_info`` before and after). Prints one JSON object with bench_serving's
field names (``output_throughput``, ``median_ttft_ms``, ``p99_itl_ms``, ``accept_length`` ...) and writes it
to ``--output-file`` when given.

The server's API key, when it asks for one, comes from ``OPENAI_API_KEY`` in the environment (as SGLang's
bench_serving reads it), never from the command line.

Usage: python3 -m serving.bench_client --base-url http://127.0.0.1:30000 --prompts p.jsonl --num-prompts 32 \\
           --max-concurrency 4 --max-tokens 96
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[idx]


def auth_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` with the server's API key as SGLang's bench_serving sends it (``OPENAI_API_KEY``, a bearer)."""
    out = dict(headers or {})
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        out["Authorization"] = f"Bearer {key}"
    return out


def server_info(base: str) -> dict[str, Any]:
    for path in ("/get_server_info", "/server_info"):
        try:
            req = urllib.request.Request(base + path, headers=auth_headers())  # noqa: S310 -- the server under test
            with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 -- the server under test
                return (json.load(resp).get("internal_states") or [{}])[0]
        except OSError:
            continue
    return {}


def one(base: str, prompt: str, max_tokens: int, model: str | None) -> dict[str, Any]:
    # include_usage: SGLang (like OpenAI) reports the token count of a stream only when asked, in a last chunk.
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    if model:
        body["model"] = model
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),  # noqa: S310 -- checked in main
                                 headers=auth_headers({"Content-Type": "application/json"}))  # fmt: skip
    start = time.perf_counter()
    arrivals: list[float] = []
    tokens = 0
    with urllib.request.urlopen(req, timeout=600) as resp:  # noqa: S310 -- the server under test (http URL)
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            choice = (chunk.get("choices") or [{}])[0]
            if choice.get("text") or (choice.get("delta") or {}).get("content"):
                arrivals.append(time.perf_counter())
            if (chunk.get("usage") or {}).get("completion_tokens") is not None:
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft": (arrivals[0] - start) if arrivals else None, "latency": end - start, "tokens": tokens,
            "itl": [b - a for a, b in itertools.pairwise(arrivals)]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_client", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--prompts", required=True, help="JSONL with a 'prompt' field (or 'messages')")
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-concurrency", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--model")
    ap.add_argument("--output-file")
    args = ap.parse_args(argv)
    base = args.base_url.rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise SystemExit(f"--base-url {args.base_url!r} must be an http:// or https:// URL")
    prompts = []
    with open(args.prompts, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                prompts.append(row.get("prompt") or next(m["content"] for m in row["messages"] if m["role"] == "user"))
    if not prompts:
        raise SystemExit(f"{args.prompts} has no prompts")
    work = [prompts[i % len(prompts)] for i in range(args.num_prompts)]
    before = server_info(base)
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, args.max_concurrency)) as pool:
        results = list(pool.map(lambda p: one(base, p, args.max_tokens, args.model), work))
    duration = time.perf_counter() - started
    after = server_info(base)
    ttft = [r["ttft"] * 1000 for r in results if r["ttft"] is not None]
    itl = [g * 1000 for r in results for g in r["itl"]]
    out_tokens = sum(r["tokens"] for r in results)
    steps = (after.get("spec_verify_ct") or 0) - (before.get("spec_verify_ct") or 0)
    accepted = (after.get("spec_accepted_drafts") or 0) - (before.get("spec_accepted_drafts") or 0)
    accept = (1 + accepted / steps) if steps > 0 else after.get("avg_spec_accept_length")
    report = {"completed": len(results), "max_concurrency": args.max_concurrency, "duration": round(duration, 3),
              "total_output_tokens": out_tokens, "output_throughput": round(out_tokens / duration, 2),
              "request_throughput": round(len(results) / duration, 3),
              "mean_ttft_ms": round(statistics.fmean(ttft), 2) if ttft else None,
              "median_ttft_ms": pct(ttft, 50), "p99_ttft_ms": pct(ttft, 99),
              "mean_itl_ms": round(statistics.fmean(itl), 2) if itl else None,
              "median_itl_ms": pct(itl, 50), "p99_itl_ms": pct(itl, 99),
              "accept_length": round(accept, 3) if accept else None}  # fmt: skip
    text = json.dumps(report)
    if args.output_file:
        with open(args.output_file, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
