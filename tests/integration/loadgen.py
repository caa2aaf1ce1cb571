"""A load generator for the rolling-switch and canary tests: runs in a lab container (stdlib only), sends greedy
/generate requests through the router with a fixed concurrency, at a paced rate (--rate: the tests need traffic in
every moment of a rollout, not the servers' whole capacity, which the other tests' work needs on a few cores), until a
stop file appears, and writes one record per request (start, end, HTTP status, error) as JSON. The requests are the
prompts of a JSON-lines file (its "prompt" fields) in the target's chat format, as a chat client's are: traffic like
the drafter's training data, so that a draft's live accept length means what it means in serving (a bare text the
tiny target never saw outside its template is answered without a draft's help from any draft)."""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--rate", type=float, default=0.0, help="requests a second over all workers at most (0: no pacing)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--stop", required=True, help="stop once this file exists")
    ap.add_argument("--out", required=True)
    ap.add_argument("--key", default="", help="the serving plane's API key (the router forwards it to the server)")
    ap.add_argument("--prompts", required=True, help="a JSON-lines file whose rows have a 'prompt' field")
    ap.add_argument("--format", required=True, help="the target's chat format of one user turn, {} for the prompt")
    args = ap.parse_args()
    records: list[dict] = []
    lock = threading.Lock()
    with open(args.prompts, encoding="utf-8") as fh:
        prompts = [args.format.replace("{}", json.loads(line)["prompt"]) for line in fh if line.strip()]

    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {args.key}"} if args.key else {})}

    # each worker starts its requests this many seconds apart (or at once after a slower answer)
    interval = args.concurrency / args.rate if args.rate > 0 else 0.0

    def worker(n: int) -> None:
        i = 0
        due = time.time() + n * interval / max(args.concurrency, 1)  # the workers' starts spread over one interval
        while not os.path.exists(args.stop):
            time.sleep(max(0.0, due - time.time()))
            body = json.dumps({"text": prompts[(n + i) % len(prompts)],
                               "sampling_params": {"max_new_tokens": args.max_tokens, "temperature": 0}}).encode()
            req = urllib.request.Request(args.url + "/generate", data=body,  # noqa: S310 - the lab's own router
                                         headers=headers)  # fmt: skip
            t0 = time.time()
            rec: dict = {"start": t0}
            try:
                with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - the lab's own router
                    out = json.loads(resp.read())
                rec.update(status=resp.status, tokens=(out.get("meta_info") or {}).get("completion_tokens"))
            except urllib.error.HTTPError as exc:
                rec.update(status=exc.code, error=exc.read().decode("utf-8", "replace")[:300])
            except Exception as exc:  # every failure is a record
                rec.update(status=0, error=repr(exc)[:300])
            rec["end"] = time.time()
            with lock:
                records.append(rec)
            i += 1
            due = max(due + interval, rec["end"]) if interval else rec["end"]

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(args.concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tmp = args.out + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(records, fh)
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
