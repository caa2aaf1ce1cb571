"""Regenerate responses with the target model: prompts JSONL -> responses JSONL, resumable.

Each prompt line is ``{"id": ..., "messages": [...]}`` (or ``{"id", "prompt"}``); each output line is
the prompt's id, its messages and the target's reply. Requests go to an OpenAI-compatible endpoint
(SGLang's ``/v1/chat/completions``) with a pool of workers, retries with exponential back-off on
connection errors, 429 and 5xx, and a per-request timeout. Output lines are appended and fsynced one
by one; a rerun reads the ids already written and sends only the rest, so an interrupted run continues
where it stopped and never duplicates a sample. Progress goes to stderr as one line per N samples.

Usage: python3 -m training.regen --endpoint http://127.0.0.1:30000 --model target --prompts p.jsonl \\
           --out responses.jsonl [--concurrency 32] [--max-tokens 2048] [--retries 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


class GiveUp(Exception):
    """A sample that failed on every retry."""


def read_done(path: str) -> set[str]:
    """Ids already in the output; a torn last line (a crash mid-write) is dropped and rewritten later."""
    done: set[str] = set()
    if not os.path.exists(path):
        return done
    with open(path, "rb") as fh:
        data = fh.read()
    good_end = 0
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            done.add(str(json.loads(line)["id"]))
        except (ValueError, KeyError):
            break
        good_end += len(line)
    if good_end != len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
    return done


def load_prompts(path: str) -> list[dict[str, Any]]:
    prompts = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise SystemExit(f"{path}:{n} is not JSON ({exc}): fix or remove that line") from None
            row_id = str(row.get("id", n))
            if row_id in seen:
                raise SystemExit(f"{path}:{n} repeats id {row_id!r}: ids must be unique for resume to work")
            seen.add(row_id)
            messages = row.get("messages") or [{"role": "user", "content": row.get("prompt", "")}]
            prompts.append({"id": row_id, "messages": messages})
    return prompts


def complete(endpoint: str, model: str, messages: list[dict[str, str]], max_tokens: int, temperature: float,
             timeout: float, retries: int, api_key: str | None) -> dict[str, Any]:  # fmt: skip
    body = json.dumps({"model": model, "messages": messages, "max_tokens": max_tokens,
                       "temperature": temperature}).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    delay = 0.5
    last = ""
    for attempt in range(retries + 1):
        url = f"{endpoint.rstrip('/')}/v1/chat/completions"
        req = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 -- http(s) checked in main
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 -- the target's own endpoint
                return json.load(resp)
        except urllib.error.HTTPError as exc:
            last = f"HTTP {exc.code}"
            if exc.code not in RETRY_STATUS:
                raise GiveUp(f"{last}: {exc.read()[:200]!r}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
            last = str(exc)
        if attempt < retries:
            time.sleep(delay)
            delay = min(delay * 2, 30)
    raise GiveUp(f"{retries + 1} tries failed, last: {last}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="regen", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--endpoint", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--retries", type=int, default=5)
    ap.add_argument("--progress-every", type=int, default=100)
    ap.add_argument("--max-failures", type=int, default=0, help="give up after this many failed samples")
    args = ap.parse_args(argv)
    if not args.endpoint.startswith(("http://", "https://")):
        raise SystemExit(f"--endpoint {args.endpoint!r} must be an http:// or https:// URL")
    api_key = os.environ.get("OPENAI_API_KEY")
    prompts = load_prompts(args.prompts)
    done = read_done(args.out)
    todo = [p for p in prompts if p["id"] not in done]
    print(f"[regen] {len(prompts)} prompts, {len(done)} already done, {len(todo)} to go", file=sys.stderr, flush=True)
    lock = threading.Lock()
    written = failures = 0
    started = time.monotonic()
    out = open(args.out, "a", encoding="utf-8")  # noqa: SIM115 -- kept open for the whole run

    def work(p: dict[str, Any]) -> dict[str, Any]:
        reply = complete(args.endpoint, args.model, p["messages"], args.max_tokens, args.temperature, args.timeout,
                         args.retries, api_key)  # fmt: skip
        text = reply["choices"][0]["message"]["content"]
        return {"id": p["id"], "messages": [*p["messages"], {"role": "assistant", "content": text}],
                "usage": reply.get("usage", {})}  # fmt: skip

    try:
        with ThreadPoolExecutor(max_workers=max(1, args.concurrency)) as pool:
            pending: set[Future] = set()
            queue = iter(todo)
            for p in queue:
                pending.add(pool.submit(work, p))
                if len(pending) >= args.concurrency * 2:
                    break
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    try:
                        row = fut.result()
                    except GiveUp as exc:
                        failures += 1
                        print(f"[regen] a sample failed: {exc}", file=sys.stderr, flush=True)
                        if failures > args.max_failures:
                            raise SystemExit(f"[regen] {failures} samples failed; rerun to continue") from None
                        continue
                    with lock:
                        out.write(json.dumps(row, ensure_ascii=False) + "\n")
                        out.flush()
                        os.fsync(out.fileno())
                        written += 1
                        if written % args.progress_every == 0 or written == len(todo):
                            rate = written / max(time.monotonic() - started, 1e-6)
                            print(f"[regen] {len(done) + written}/{len(prompts)} ({rate:.1f}/s)", file=sys.stderr,
                                  flush=True)  # fmt: skip
                    nxt = next(queue, None)
                    if nxt is not None:
                        pending.add(pool.submit(work, nxt))
    finally:
        out.close()
    print(f"[regen] done: {len(done) + written}/{len(prompts)}, {failures} failed", file=sys.stderr, flush=True)
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
