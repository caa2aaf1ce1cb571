"""Prompts for regeneration from a JSONL file or a dataset (a Hub name or a local ``datasets`` directory).

Each output row is ``{"id", "messages"}`` with the conversation up to and including its first user turn (a
system turn is kept): the target writes the reply itself. Recognised shapes: ``messages`` /
``conversations`` lists (OpenAI ``role``/``content`` or ShareGPT ``from``/``value``), or a single text field
``prompt`` / ``instruction`` / ``question``. Ids come from an ``id`` field or the row number; they must be
unique, because the regeneration resumes by id. The file is written under a temporary name of its own and renamed.

Usage: python3 -m training.prompts --source NAME_OR_PATH --out prompts.jsonl [--split train] [--limit N]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

try:  # shipped beside this file (a link to the collection's module_utils/_atomic.py)
    from . import _atomic as st
except ImportError:  # pragma: no cover - run as a loose script
    import _atomic as st  # type: ignore[no-redef]

ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}


def to_messages(row: dict[str, Any]) -> list[dict[str, str]] | None:
    turns = row.get("messages") or row.get("conversations")
    if isinstance(turns, list):
        out = []
        for turn in turns:
            role = ROLES.get(str(turn.get("role") or turn.get("from") or "").lower())
            content = turn.get("content", turn.get("value"))
            if role is None or not isinstance(content, str):
                continue
            out.append({"role": role, "content": content})
            if role == "user":
                return out
        return None
    for key in ("prompt", "instruction", "question"):
        if isinstance(row.get(key), str) and row[key].strip():
            return [{"role": "user", "content": row[key]}]
    return None


def rows_from(source: str, split: str) -> Iterable[dict[str, Any]]:
    if source.endswith((".jsonl", ".json")) and os.path.isfile(source):
        with open(source, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if line.strip():
                    try:
                        yield json.loads(line)
                    except ValueError as exc:
                        raise SystemExit(f"{source}:{n} is not JSON ({exc}): fix or remove that line") from None
        return
    import datasets

    if os.path.isdir(source) and os.path.exists(os.path.join(source, "state.json")):
        yield from datasets.load_from_disk(source)
    else:
        yield from datasets.load_dataset(source, split=split)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="prompts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--source", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--split", default="train")
    ap.add_argument("--limit", type=int, default=0, help="keep the first N prompts (0: all)")
    args = ap.parse_args(argv)
    seen: set[str] = set()
    kept = skipped = 0

    def lines() -> Iterable[str]:
        nonlocal kept, skipped
        for n, row in enumerate(rows_from(args.source, args.split)):
            messages = to_messages(row)
            if not messages:
                skipped += 1
                continue
            row_id = str(row.get("id", n))
            if row_id in seen:
                raise SystemExit(f"{args.source} repeats id {row_id!r}: ids must be unique for resume to work")
            seen.add(row_id)
            yield json.dumps({"id": row_id, "messages": messages}, ensure_ascii=False) + "\n"
            kept += 1
            if args.limit and kept >= args.limit:
                break
        if not kept:
            raise SystemExit(f"{args.source} has no usable prompts (fields messages/conversations/prompt/instruction)")

    # Every shard host of a fleet normalises the prompts into the one shared data directory: each writes a
    # temporary of its own and renames it, so the file is always one host's complete output.
    st.write_lines_atomic(args.out, lines())
    print(json.dumps({"prompts": kept, "skipped": skipped, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
