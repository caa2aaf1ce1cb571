"""``python -m sglang_check.bench_serving [--cpu-shims] [--prompts-jsonl FILE] [--concurrency N ... --output-prefix P]
-- BENCH_SERVING ARGS``.

SGLang's own ``sglang.bench_serving``, run unchanged, with what it lacks where eagle3-ops runs it:

* ``--prompts-jsonl``: the project's prompts (JSONL rows with ``prompt`` or ``messages``) as a ShareGPT file
  for ``--dataset-name sharegpt --dataset-path`` - bench_serving's random dataset downloads ShareGPT from the
  Hugging Face Hub, which an air-gapped container (the lab) cannot reach.
* ``--cpu-shims``: cpu_shims.py before SGLang is imported (a CPU-only host with the pinned CPU SGLang).
* ``--concurrency N`` (repeated) with ``--output-prefix P``: one run per concurrency level (``--max-concurrency N
  --output-file PN.jsonl``) in this one process, so SGLang is imported once per sweep point instead of once per level
  (15 s a time on the lab's CPUs); a level that fails stops the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
import tempfile

try:
    from . import cpu_shims
except ImportError:  # pragma: no cover - run as a loose script
    import cpu_shims  # type: ignore[no-redef]


def sharegpt_file(prompts_jsonl: str) -> str:
    """Write the prompts as ShareGPT conversations (a human turn, and the empty reply bench_serving expects)."""
    rows = []
    with open(prompts_jsonl, encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if not line.strip():
                continue
            row = json.loads(line)
            text = row.get("prompt") or next((m["content"] for m in row.get("messages", []) if m.get("role") == "user"),
                                             None)  # fmt: skip
            if not text:
                raise SystemExit(f"{prompts_jsonl} line {n + 1} has neither 'prompt' nor a user message")
            rows.append({"id": str(row.get("id", n)), "conversations": [{"from": "human", "value": text},
                                                                        {"from": "gpt", "value": "."}]})  # fmt: skip
    fd, path = tempfile.mkstemp(prefix="bench-sharegpt-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        json.dump(rows, out)
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(prog="sglang_check.bench_serving", description=__doc__.splitlines()[0])
    ap.add_argument("--cpu-shims", action="store_true")
    ap.add_argument("--prompts-jsonl")
    ap.add_argument("--concurrency", type=int, action="append", default=[])
    ap.add_argument("--output-prefix")
    ns = ap.parse_args(argv[:split])
    rest = argv[split + 1 :]
    if ns.concurrency and not ns.output_prefix:
        ap.error("--concurrency needs --output-prefix (each level's results go to PREFIX<level>.jsonl)")
    if any(level < 1 for level in ns.concurrency):
        ap.error(f"--concurrency levels must be 1 or more, not {ns.concurrency}")
    if ns.cpu_shims:
        cpu_shims.apply()
    dataset = None
    if ns.prompts_jsonl:
        dataset = sharegpt_file(ns.prompts_jsonl)
        rest = ["--dataset-name", "sharegpt", "--dataset-path", dataset, *rest]
    runs = [[*rest, "--max-concurrency", str(level), "--output-file", f"{ns.output_prefix}{level}.jsonl"]
            for level in ns.concurrency] or [rest]  # fmt: skip
    try:
        for run in runs:
            code = run_bench_serving(run)
            if code:
                return code
    finally:
        if dataset:
            os.unlink(dataset)
    return 0


def run_bench_serving(args: list[str]) -> int:
    """One ``python -m sglang.bench_serving ARGS`` in this process (its imports stay loaded for the next)."""
    sys.argv = ["sglang.bench_serving", *args]
    try:
        runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return int(exc.code or 0) if not isinstance(exc.code, str) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
