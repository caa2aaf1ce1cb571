"""Regenerated conversations -> pre-tokenized training rows for ``speculators prepare-data``.

Each output row is ``{"id", "input_ids", "loss_mask"}``: the prompt rendered with the target's chat template
(with the generation prompt) has mask 0, the target's reply and its end token have mask 1, so the drafter
learns only where the target itself generated. Rows are written to a temporary file of their own and renamed
into place; the output is rebuilt only when the input is newer. Replies that came back empty are dropped and counted.

Usage: python3 -m training.dataset --target DIR --responses responses.jsonl --out rows.jsonl [--max-len 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator

try:  # shipped beside this file (a link to the collection's module_utils/_atomic.py)
    from . import _atomic as st
except ImportError:  # pragma: no cover - run as a loose script
    import _atomic as st  # type: ignore[no-redef]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dataset", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--target", required=True, help="the target model directory (its tokenizer and chat template)")
    ap.add_argument("--responses", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-len", type=int, default=4096, help="rows are cut to this many tokens")
    args = ap.parse_args(argv)
    if os.path.exists(args.out) and os.path.getmtime(args.out) >= os.path.getmtime(args.responses):
        print("unchanged")
        return 0
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target)
    kept = empty = tokens = 0

    def rows() -> Iterator[str]:
        nonlocal kept, empty, tokens
        with open(args.responses, encoding="utf-8") as src:
            for n, line in enumerate(src, 1):
                if not line.strip():
                    continue
                row = json.loads(line)
                messages = row["messages"]
                if not messages or messages[-1].get("role") != "assistant":
                    raise SystemExit(
                        f"{args.responses}:{n} does not end with the assistant's reply: rerun regeneration"
                    )
                reply = messages[-1]["content"]
                if not reply:
                    empty += 1
                    continue
                prompt = tok.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=True)
                prompt_ids = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
                reply_ids = [*tok.encode(reply, add_special_tokens=False), tok.eos_token_id]
                ids = (prompt_ids + reply_ids)[: args.max_len]
                mask = ([0] * len(prompt_ids) + [1] * len(reply_ids))[: args.max_len]
                if sum(mask) == 0:
                    empty += 1
                    continue
                yield json.dumps({"id": row["id"], "input_ids": ids, "loss_mask": mask}) + "\n"
                kept += 1
                tokens += len(ids)

    st.write_lines_atomic(args.out, rows())
    st.write_json_atomic(args.out + ".summary.json", {"rows": kept, "tokens": tokens, "empty": empty})
    print(f"{kept} rows ({tokens} tokens) written to {args.out}, {empty} empty replies dropped")
    return 0 if kept else 1


if __name__ == "__main__":
    sys.exit(main())
