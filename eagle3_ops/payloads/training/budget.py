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
