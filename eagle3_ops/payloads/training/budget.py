"""Token budget for speculators EAGLE-3 training: a memory estimate, and the back-off ladder.

speculators packs samples into one row of ``total_seq_len`` tokens (there is no batch size), so the
budget is the knob that decides whether a GPU runs full or out of memory. The estimate is a linear
model, static memory plus memory per token, calibrated on the seeds' run (hidden 7168, draft vocab
32000, target vocab 163840, TTT 5, bf16 on 96 GB cards): 8192 tokens used 39.8 GB, 16384 fit, 24576
and 32768 ran out of memory. It is a starting point, not a promise: the launcher backs off down the
ladder when a run dies of out-of-memory and records why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

LADDER = (65536, 49152, 32768, 24576, 16384, 12288, 8192, 6144, 4096, 2048, 1024, 512, 256)
OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
    r"Tried to allocate [\d.]+ [GM]iB",
    re.IGNORECASE,
)
GIB = 1024**3


@dataclass(frozen=True)
class Shapes:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    draft_vocab: int
    target_vocab: int
    target_hidden: int | None = None
    layers: int = 1
    ttt_steps: int = 3

    @property
    def trainable_params(self) -> int:
        h, th = self.hidden, self.target_hidden or self.hidden
        head_dim = h // self.heads
        attn = h * 2 * h + 2 * (self.kv_heads * head_dim) * 2 * h + h * h  # q, k, v take 2h; o
        mlp = 3 * h * self.intermediate
        return 3 * th * h + self.layers * (attn + mlp) + self.draft_vocab * h  # fc, layers, lm_head


def static_bytes(s: Shapes) -> int:
    """Weights, gradients and optimizer state of what trains, plus the frozen target embeddings (bf16)."""
    return s.trainable_params * 6 + s.target_vocab * s.hidden * 2


def bytes_per_token(s: Shapes) -> int:
    """Per packed token: per TTT step the fp32 logits/softmax/grad over the draft vocabulary and the layer's
    activations, plus the three aux hidden states that come in (bf16)."""
    th = s.target_hidden or s.hidden
    return s.ttt_steps * (s.draft_vocab * 20 + s.hidden * 20 * s.layers) + 3 * th * 2


def estimate_memory(s: Shapes, total_seq_len: int) -> int:
    return static_bytes(s) + total_seq_len * bytes_per_token(s)


def estimate_total_seq_len(s: Shapes, gpu_memory_bytes: int, headroom: float = 0.15) -> int:
    """The largest ladder budget whose estimate fits in (1 - headroom) of the GPU's memory."""
    usable = gpu_memory_bytes * (1 - headroom)
    for budget in LADDER:
        if estimate_memory(s, budget) <= usable:
            return budget
    raise ValueError(
        f"even {LADDER[-1]} tokens need {estimate_memory(s, LADDER[-1]) / GIB:.1f} GiB, more than the "
        f"{usable / GIB:.1f} GiB usable on this GPU: use a GPU with more memory or shard the draft vocabulary"
    )


def ladder_from(start: int, floor: int = 1024) -> list[int]:
    """The budgets to try, from ``start`` down to ``floor`` (start itself first, even off the ladder)."""
    steps = [start] + [b for b in LADDER if b < start and b >= floor]
    return steps


def died_of_oom(returncode: int, log_tail: str) -> bool:
    """A failed run whose log shows an allocation failure (a SIGKILL alone may be the host's OOM killer)."""
    return returncode != 0 and bool(OOM_PATTERNS.search(log_tail))


def shapes_from_configs(target: dict, draft_vocab: int | None, ttt_steps: int) -> Shapes:
    """Draft shapes for a verifier config.json (the draft copies the verifier's layer shape)."""
    text = target.get("text_config") or target
    heads = int(text["num_attention_heads"])
    return Shapes(hidden=int(text["hidden_size"]), intermediate=int(text["intermediate_size"]), heads=heads,
                  kv_heads=int(text.get("num_key_value_heads") or heads),
                  draft_vocab=int(draft_vocab or text["vocab_size"]), target_vocab=int(text["vocab_size"]),
                  ttt_steps=ttt_steps)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """``python3 -m training.budget``: the starting total_seq_len for a target and a GPU, as JSON."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="budget", description="Starting total_seq_len from a memory estimate.")
    ap.add_argument("--target-config", required=True, help="the verifier's config.json")
    ap.add_argument("--gpu-memory-mib", type=int, required=True, help="memory of one GPU (nvidia-smi memory.total)")
    ap.add_argument("--draft-vocab", type=int)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--headroom", type=float, default=0.15)
    ap.add_argument("--max", type=int, default=32768, help="never start above this budget")
    args = ap.parse_args(argv)
    with open(args.target_config, encoding="utf-8") as fh:
        shapes = shapes_from_configs(json.load(fh), args.draft_vocab, args.ttt_steps)
    try:
        start = min(estimate_total_seq_len(shapes, args.gpu_memory_mib * 1024**2, args.headroom), args.max)
    except ValueError as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps({"total_seq_len": start, "estimate_gib": round(estimate_memory(shapes, start) / GIB, 1),
                      "gpu_gib": round(args.gpu_memory_mib / 1024, 1)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
