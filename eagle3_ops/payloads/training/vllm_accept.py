"""vLLM as the judge of a trained drafter: its measured acceptance on real prompts, from its own counters.

vLLM reads speculators' checkpoint format natively (``--speculative-config '{"method": "eagle3", "model":
CHECKPOINT, "num_speculative_tokens": N}'``). This client sends the prompts (the data stage's ``messages``
rows, or ``prompt`` rows) as chat requests (greedy, a few at a time) to such a server and reads its
Prometheus counters before and after, so only its own requests count: ``vllm:spec_decode_num_drafts``
(verification steps that carried drafts), ``vllm:spec_decode_num_accepted_tokens`` and the per-position
acceptance. The mean acceptance length is
1 + accepted / drafts - the same quantity as the trainer's estimate tau = 1 + sum of full accuracies.
Standard library only. Prints one JSON line.

Usage: python3 -m training.vllm_accept --endpoint http://127.0.0.1:30300 --model TARGET --prompts P.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

COUNTER = re.compile(r'^vllm:(spec_decode_num_\w+?)_total\{([^}]*)\}\s+([0-9.eE+-]+)$')


def counters(endpoint: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{endpoint}/metrics", timeout=30) as resp:  # noqa: S310 - loopback URL from the role
        return parse_counters(resp.read().decode())


def parse_counters(text: str) -> dict[str, float]:
    """The spec-decode counters, summed over engines; per-position ones keyed 'accepted_per_pos.<k>'."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = COUNTER.match(line)
        if not m:
            continue
        name, labels, value = m.groups()
        pos = re.search(r'position="(\d+)"', labels)
        key = f"accepted_per_pos.{pos.group(1)}" if name == "spec_decode_num_accepted_tokens_per_pos" and pos else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


def ask(endpoint: str, model: str, messages: list[dict[str, str]], max_tokens: int, timeout: float) -> int:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
    req = urllib.request.Request(f"{endpoint}/v1/chat/completions", data=json.dumps(body).encode(),  # noqa: S310
                                 headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310
        return int(json.load(resp)["usage"]["completion_tokens"])


def judge(before: dict[str, float], after: dict[str, float], tokens: int, prompts: int) -> dict[str, Any]:
    def delta(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    drafts, accepted, proposed = (delta("spec_decode_num_drafts"), delta("spec_decode_num_accepted_tokens"),
                                  delta("spec_decode_num_draft_tokens"))  # fmt: skip
    positions = sorted(int(k.split(".")[1]) for k in after if k.startswith("accepted_per_pos."))
    return {
        "prompts": prompts,
        "completion_tokens": tokens,
        "drafts": int(drafts),
        "draft_tokens": int(proposed),
        "accepted_tokens": int(accepted),
        "accept_length": round(1 + accepted / drafts, 4) if drafts else None,
        "acceptance_rate": round(accepted / proposed, 4) if proposed else None,
        "per_position": [round(delta(f"accepted_per_pos.{k}") / drafts, 4) if drafts else None for k in positions],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="vllm_accept", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--endpoint", required=True, help="the server's base URL, without /v1")
    ap.add_argument("--model", required=True, help="the served model name (the target path by default)")
    ap.add_argument("--prompts", required=True, help="JSONL with 'messages' (the data stage's prompts) or 'prompt'")
    ap.add_argument("--limit", type=int, default=0, help="first N prompts (0: all)")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args(argv)
    with open(args.prompts, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    prompts = [row["messages"] if "messages" in row else [{"role": "user", "content": row["prompt"]}] for row in rows]
    if args.limit:
        prompts = prompts[: args.limit]
    if not prompts:
        ap.error(f"{args.prompts} has no prompts")
    endpoint = args.endpoint.rstrip("/")
    before = counters(endpoint)
    with ThreadPoolExecutor(max_workers=max(args.concurrency, 1)) as pool:
        tokens = sum(pool.map(lambda p: ask(endpoint, args.model, p, args.max_tokens, args.timeout), prompts))
    result = judge(before, counters(endpoint), tokens, len(prompts))
    if result["drafts"] == 0:
        print(json.dumps(result))
        print("the server drafted nothing: it is not serving a speculative model", file=sys.stderr)
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
