# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A plan at the target's scale: bytes, GPU memory and time for every stage, from its config.json, before anything runs.

The one place the project estimates. Each figure comes from the target's own config.json (layers, hidden size,
vocabulary, attention and expert shapes, quantization) and the inventory's settings:

- hidden states: speculators' file layout (``hidden_states`` [T, aux + 1, H] in bf16, or e4m3 with a float32 scale
  per token in the fp8 store, plus ``token_ids`` int64 [T]; FACTS "Hidden states at the seeds' scale");
- training: a linear memory model (static + per packed token) calibrated on the seeds' run (hidden 7168, draft vocab
  32000, target vocab 163840, TTT 5, bf16 on 96 GB cards: 8192 tokens used 39.8 GB, 16384 fit, 24576 and 32768 ran
  out of memory), and speculators' packing (samples packed into rows of total_seq_len tokens, longer ones
  truncated; an epoch is each rank's share of the rows);
- serving: target weights by their quantization (bf16, fp8 blocks, compressed-tensors int4 experts), the draft,
  and the KV cache (MLA's latent cache, replicated on every tensor-parallel rank; GQA's heads, split over them)
  against SGLang's static memory fraction of one GPU.

The planner only reads: it never writes, so it runs in check mode on a host that has nothing installed.
"""

from __future__ import annotations

import math
import os
import random
from bisect import bisect_right
from dataclasses import dataclass, field
from heapq import heapreplace
from itertools import accumulate
from typing import Any

GIB = 1024**3
GB = 1000**3
TB = 1000**4
# The budgets the launcher tries, largest first: the plan starts at the largest that fits, the launcher backs off
# down this ladder when a run dies of out-of-memory anyway.
LADDER = (65536, 49152, 32768, 24576, 16384, 12288, 8192, 6144, 4096, 2048, 1024, 512, 256)
SAFETENSORS_HEADER = 512  # bytes of JSON header and alignment per hidden-state file (two tensors)
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "fp8": 1, "float8_e4m3fn": 1}


class PlanError(ValueError):
    """Input the planner cannot use (a config.json without the shapes it needs)."""


def _int(cfg: dict[str, Any], *names: str, default: int | None = None) -> int:
    for name in names:
        value = cfg.get(name)
        if value is not None:
            return int(value)
    if default is None:
        raise PlanError(f"The target's config.json has no {names[0]}: point eagle3_target_path at a Hugging Face model "
                        "directory whose config.json names its shapes")  # fmt: skip
    return default


@dataclass(frozen=True)
class Quantization:
    """How the checkpoint stores its linear layers' weights."""

    method: str = "none"  # none | fp8 | compressed-tensors | other
    bits: int = 16
    group_size: int = 0  # compressed-tensors: one bf16 scale per group; fp8: a float32 scale per block
    experts_only: bool = False  # compressed-tensors as Kimi-K2.5 ships it: only the routed experts are int4

    def bytes_per_param(self, dtype_bytes: int) -> float:
        if self.method == "none":
            return dtype_bytes
        scale = (2 / self.group_size) if self.method == "compressed-tensors" and self.group_size else 0.0
        if self.method == "fp8" and self.group_size:
            scale = 4 / self.group_size
        return self.bits / 8 + scale

    @classmethod
    def from_config(cls, qc: dict[str, Any] | None) -> Quantization:
        if not qc:
            return cls()
        method = str(qc.get("quant_method") or qc.get("format") or "other")
        if method == "fp8":
            block = qc.get("weight_block_size") or [128, 128]
            return cls("fp8", 8, int(block[0]) * int(block[1]))
        if method == "compressed-tensors":
            bits, group, targets = 16, 0, ""
            for group_cfg in (qc.get("config_groups") or {}).values():
                weights = group_cfg.get("weights") or {}
                bits = int(weights.get("num_bits") or bits)
                group = int(weights.get("group_size") or group)
                targets = " ".join(str(t) for t in group_cfg.get("targets") or [])
            ignore = " ".join(str(i) for i in qc.get("ignore") or [])
            # Kimi-K2.5's checkpoint quantizes the routed experts only: its ignore list names attention, the shared
            # experts, the dense layers and lm_head (ROCm/ATOM recipes/Kimi-K2.5.md: "native INT4 quantization
            # (compressed-tensors, group_size=32) for the routed MoE expert weights").
            experts_only = "self_attn" in ignore or "shared_experts" in ignore or "experts" in targets
            return cls("compressed-tensors", bits, group, experts_only)
        bits = int(qc.get("bits") or qc.get("num_bits") or 16)
        return cls(method, bits, int(qc.get("group_size") or 0))


@dataclass(frozen=True)
class Target:
    """The shapes of a verifier, read from its config.json (``text_config`` for a multimodal one such as Kimi-K2.5)."""

    layers: int
    hidden: int
    vocab: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    max_positions: int
    dtype_bytes: int = 2
    tied: bool = False
    # MLA (DeepSeek-V3 family): the latent KV cache and the attention's projections
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    # mixture of experts
    routed_experts: int = 0
    shared_experts: int = 0
    moe_intermediate: int = 0
    dense_layers: int = 0
    quantization: Quantization = field(default_factory=Quantization)

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Target:
        text = config.get("text_config") or config
        qc = text.get("quantization_config") or config.get("quantization_config")
        heads = _int(text, "num_attention_heads")
        hidden = _int(text, "hidden_size")
        layers = _int(text, "num_hidden_layers")
        experts = _int(text, "n_routed_experts", "num_experts", "num_local_experts", default=0)
        dtype = str(text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16")
        return cls(layers=layers, hidden=hidden, vocab=_int(text, "vocab_size"),
                   intermediate=_int(text, "intermediate_size", default=4 * hidden), heads=heads,
                   kv_heads=_int(text, "num_key_value_heads", default=heads),
                   head_dim=_int(text, "head_dim", default=hidden // heads),
                   max_positions=_int(text, "max_position_embeddings", default=4096),
                   dtype_bytes=DTYPE_BYTES.get(dtype.replace("torch.", ""), 2),
                   tied=bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False))),
                   kv_lora_rank=_int(text, "kv_lora_rank", default=0), q_lora_rank=_int(text, "q_lora_rank", default=0),
                   qk_rope_head_dim=_int(text, "qk_rope_head_dim", default=0),
                   qk_nope_head_dim=_int(text, "qk_nope_head_dim", default=0),
                   v_head_dim=_int(text, "v_head_dim", default=0), routed_experts=experts,
                   shared_experts=_int(text, "n_shared_experts", "num_shared_experts", default=0),
                   moe_intermediate=_int(text, "moe_intermediate_size", default=0),
                   dense_layers=_int(text, "first_k_dense_replace", default=0) if experts else layers,
                   quantization=Quantization.from_config(qc))  # fmt: skip

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def attention_params(self) -> int:
        h = self.hidden
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (h * self.q_lora_rank + self.q_lora_rank * self.heads * qk) if self.q_lora_rank else h * self.heads * qk
            kv = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv += self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.heads * self.v_head_dim * h
        return h * self.heads * self.head_dim * 2 + 2 * h * self.kv_heads * self.head_dim

    def params(self) -> dict[str, int]:
        """Parameters by the part of the model that holds them (what a quantization treats differently)."""
        h = self.hidden
        moe_layers = self.layers - self.dense_layers if self.routed_experts else 0
        return {"embeddings": self.vocab * h * (1 if self.tied else 2),
                "attention": self.layers * self.attention_params(),
                "dense_mlp": (self.layers - moe_layers) * 3 * h * self.intermediate,
                "routed_experts": moe_layers * self.routed_experts * 3 * h * self.moe_intermediate,
                "shared_experts": moe_layers * (self.shared_experts * 3 * h * self.moe_intermediate
                                                + self.routed_experts * h)}  # fmt: skip

    def weight_bytes(self) -> int:
        q, d = self.quantization, self.dtype_bytes
        total = 0.0
        for part, n in self.params().items():
            quantized = q.method != "none" and part != "embeddings" and (not q.experts_only or part == "routed_experts")
            total += n * (q.bytes_per_param(d) if quantized else d)
        return int(total)

    def kv_bytes_per_token(self, kv_dtype_bytes: int, tp: int) -> int:
        """KV cache per token on one GPU: MLA keeps one latent per layer on every rank; GQA splits the heads."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * kv_dtype_bytes
        return self.layers * 2 * max(1, math.ceil(self.kv_heads / tp)) * self.head_dim * kv_dtype_bytes


# --- hidden states -----------------------------------------------------------------------------------------------


def hidden_bytes_per_token(hidden: int, slots: int, store: str, dtype_bytes: int = 2) -> int:
    """One token's bytes in a hidden-state file: ``slots`` states (the aux layers and the last one) and its id."""
    if store == "fp8":
        return hidden * slots + 4 + 8  # e4m3 values, a float32 scale, the int64 token id
    return hidden * slots * dtype_bytes + 8


def hidden_state_bytes(token_counts: list[int] | None, samples: int, mean_tokens: float, hidden: int, slots: int,
                       store: str, dtype_bytes: int = 2) -> int:  # fmt: skip
    tokens = sum(token_counts) if token_counts else samples * mean_tokens
    files = len(token_counts) if token_counts else samples
    return int(tokens * hidden_bytes_per_token(hidden, slots, store, dtype_bytes) + files * SAFETENSORS_HEADER)


def free_bytes(path: str) -> tuple[int, str]:
    """Free bytes for an unprivileged writer where ``path`` is (or will be created), and the directory measured."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe.rstrip("/")) or "/"
        if parent == probe:
            break
        probe = parent
    st = os.statvfs(probe)
    return st.f_bavail * st.f_frsize, probe


# speculators' profile line in a training attempt's log (``profile/tokens_per_s=T``), and how much of the log's end
# holds the newest figures: read by the plan (a measured throughput) and the training monitor (its polls).
THROUGHPUT = r"tokens_per_s=([\d.]+(?:e[+-]?\d+)?)"
LOG_TAIL_BYTES = 256 * 1024


def log_tail(path: str) -> str:
    """The end of a training attempt's log (its last LOG_TAIL_BYTES), where its newest figures are."""
    with open(path, "rb") as fh:
        fh.seek(max(0, os.path.getsize(path) - LOG_TAIL_BYTES))
        return fh.read().decode("utf-8", "replace")


def bytes_under(path: str) -> int:
    """Bytes already written under ``path`` (an earlier run's share: a resume needs only the rest)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


# --- training ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Draft:
    """The EAGLE-3 draft speculators trains for a target: one decoder layer of the target's shape (dense)."""

    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    draft_vocab: int
    target_vocab: int
    target_hidden: int | None = None
    layers: int = 1
    ttt_steps: int = 3

    @classmethod
    def for_target(cls, t: Target, draft_vocab: int | None, ttt_steps: int) -> Draft:
        return cls(hidden=t.hidden, intermediate=t.intermediate, heads=t.heads, kv_heads=t.kv_heads,
                   draft_vocab=int(draft_vocab or t.vocab), target_vocab=t.vocab, ttt_steps=ttt_steps)  # fmt: skip

    @property
    def trainable_params(self) -> int:
        h, th = self.hidden, self.target_hidden or self.hidden
        head_dim = h // self.heads
        attn = h * 2 * h + 2 * (self.kv_heads * head_dim) * 2 * h + h * h  # q, k, v take 2h; o
        mlp = 3 * h * self.intermediate
        return 3 * th * h + self.layers * (attn + mlp) + self.draft_vocab * h  # fc, layers, lm_head

    def static_bytes(self) -> int:
        """Weights, gradients and optimizer state of what trains, plus the frozen target embeddings (bf16)."""
        return self.trainable_params * 6 + self.target_vocab * self.hidden * 2

    def bytes_per_token(self) -> int:
        """Per packed token: per TTT step the fp32 logits/softmax/grad over the draft vocabulary and the layer's
        activations, plus the three aux hidden states that come in (bf16)."""
        th = self.target_hidden or self.hidden
        return self.ttt_steps * (self.draft_vocab * 20 + self.hidden * 20 * self.layers) + 3 * th * 2

    def memory(self, total_seq_len: int) -> int:
        return self.static_bytes() + total_seq_len * self.bytes_per_token()

    def export_bytes(self) -> int:
        """The exported draft: its weights in bf16, the target's embeddings it carries, the vocabulary maps."""
        maps = self.draft_vocab * 8 + self.target_vocab  # d2t int64, t2d bool
        return self.trainable_params * 2 + self.target_vocab * self.hidden * 2 + maps


def start_budget(d: Draft, gpu_bytes: int, headroom: float = 0.15, ceiling: int = LADDER[0]) -> int | None:
    """The largest ladder budget (≤ ceiling) whose estimate fits in (1 - headroom) of one GPU; None when none does."""
    usable = gpu_bytes * (1 - headroom)
    for budget in LADDER:
        if budget <= ceiling and d.memory(budget) <= usable:
            return budget
    return None


def ladder_from(start: int, floor: int) -> list[int]:
    """The budgets the launcher tries, from ``start`` (even off the ladder) down to ``floor``."""
    return [start] + [b for b in LADDER if floor <= b < start]


def _lpt_fits(lengths: list[int], max_len: int, replicas: int) -> bool:
    """Whether longest-first onto the least full of ``replicas`` rows fits every length in ``max_len`` tokens."""
    heap = [0] * replicas
    for n in sorted(lengths, reverse=True):
        if heap[0] + n > max_len:
            return False
        heapreplace(heap, heap[0] + n)
    return True


def steps_per_epoch(token_counts: list[int], budget: int, world: int, seed: int = 0) -> int:
    """Optimizer steps in one epoch the way speculators 0.9.0's MultipackDistributedBatchSamplerV2 makes them
    (speculators/train/distributed_batch_sampler.py, read here): longer samples truncated to ``budget``; in a
    shuffled order, each step takes the most next samples that longest-first packing fits into ``world`` rows of
    ``budget`` tokens (a binary search), one row per rank; fewer than ``world`` samples left over are dropped. The
    shuffle is speculators' own per epoch; another order changes the count by a step or two."""
    lengths = [min(int(c), budget) for c in token_counts]
    random.Random(seed).shuffle(lengths)  # noqa: S311 - an order to pack in, no secret
    cumsum = list(accumulate(lengths))
    steps, ind, so_far = 0, 0, 0
    while len(lengths) - ind >= world:
        left, right = 1, 1 + bisect_right(cumsum, so_far + budget * world, lo=ind) - ind
        while right - left > 1 and right > world:
            mid = (left + right) // 2
            if _lpt_fits(lengths[ind : ind + mid], budget, world):
                left = mid
            else:
                right = mid
        ind += left
        so_far = cumsum[ind - 1]
        steps += 1
    return steps


# --- the plan ----------------------------------------------------------------------------------------------------


def _h(n: float) -> str:
    for unit, size in (("TB", TB), ("GB", GB), ("MB", 1000**2)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


@dataclass
class Plan:
    stages: dict[str, dict[str, Any]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {"stages": self.stages, "refusals": self.refusals, "warnings": self.warnings,
                "table": self.table()}  # fmt: skip

    def table(self) -> list[str]:
        rows = [("stage", "what", "needs", "against", "verdict")]
        for name, s in self.stages.items():
            rows.append((name, s["what"], s.get("needs_text", "-"), s.get("against_text", "-"), s["verdict"]))
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        return [" | ".join(r[i].ljust(widths[i]) for i in range(4)) + " | " + r[4] for r in rows]


def plan_regen(p: Plan, prompts: int, max_tokens: int, prompt_tokens: float) -> float:
    mean = prompt_tokens + max_tokens
    p.stages["regeneration"] = {"what": f"{prompts:,} prompts, up to {max_tokens} new tokens each",
                                "prompts": prompts, "expected_tokens": int(prompts * mean), "mean_tokens": mean,
                                "needs_text": f"~{prompts * mean / 1e6:,.1f}M tokens",
                                "verdict": "ok" if prompts else "unknown"}  # fmt: skip
    if not prompts:
        p.warnings.append("The prompts are not counted yet (a source the data stage downloads): the plan sizes "
                          "nothing from them; set eagle3_data_prompts_limit, or rerun the plan once the data stage "
                          "has prepared them.")  # fmt: skip
    return mean


def plan_hidden_states(p: Plan, t: Target, *, samples: int, mean_tokens: float, token_counts: list[int] | None,
                       aux_layers: int, store: str, path: str, shards: int, shared: bool, margin: float,
                       already: int = 0, dtype_bytes: int = 2) -> None:  # fmt: skip
    """Hidden states per shard against the free space where each shard is written (all of them, on shared storage)."""
    slots = aux_layers + 1
    if store == "online":
        p.stages["hidden_states"] = {"what": "online: the trainer asks the vLLM server per sample", "bytes": 0,
                                     "needs_text": "0 B on disk", "verdict": "ok"}  # fmt: skip
        return
    total = hidden_state_bytes(token_counts, samples, mean_tokens, t.hidden, slots, store, dtype_bytes)
    here = total if shared or shards <= 1 else -(-total // shards)
    needed = max(0, here - already)
    free, measured = free_bytes(path)
    want = int(needed * (1 + margin))
    fits = want <= free
    kind = "fp8" if store == "fp8" else {4: "fp32", 2: "bf16"}.get(dtype_bytes, f"{dtype_bytes}-byte")
    fp8_total = hidden_state_bytes(token_counts, samples, mean_tokens, t.hidden, slots, "fp8")
    share = "" if shared or shards <= 1 else f", 1/{shards} here"
    s: dict[str, Any] = {
        "what": f"{samples:,} samples x {slots} states x {t.hidden} {kind}{share}",
        "bytes": total, "bytes_here": here, "already": already, "needed": needed, "free": free, "path": path,
        "measured_at": measured, "store": store, "slots": slots, "margin": margin,
        "needs_text": _h(needed) + (f" (+{_h(already)} written)" if already else ""),
        "against_text": f"{_h(free)} free at {measured}", "verdict": "ok" if fits else "REFUSED",
    }  # fmt: skip
    if store != "fp8":
        s["fp8_bytes"] = fp8_total
    p.stages["hidden_states"] = s
    if not fits:
        ways = []
        if store != "fp8":
            fp8_here = fp8_total if shared or shards <= 1 else -(-fp8_total // shards)
            # another store empties this one first (hs_store): what it wrote is free again
            fits_fp8 = "fits" if fp8_here * (1 + margin) <= free + already else "does not fit either"
            ways.append(f"the fp8 store needs {_h(fp8_here)} and {fits_fp8} (eagle3_data_hidden_store: fp8)")
        ways += ["online training keeps none on disk (eagle3_hidden_states: online)",
                 "another path (eagle3_data_hidden_dir)"]  # fmt: skip
        if not shared:
            ways.append("more trainers (each keeps its shard)")
        p.refusals.append(f"Hidden states need {_h(needed)} (+{margin:.0%} margin) at {path} but {_h(free)} are free: "
                          f"{'; '.join(ways)}.")  # fmt: skip


def plan_training(p: Plan, t: Target, *, gpu_bytes: int, gpus_per_node: int, nodes: int, draft_vocab: int | None,
                  ttt_steps: int, total_seq_len: int | None, max_seq_len: int, min_seq_len: int, epochs: int,
                  val_ratio: float, samples: int, mean_tokens: float, token_counts: list[int] | None,
                  tokens_per_second: float, throughput_source: str, headroom: float = 0.15) -> None:  # fmt: skip
    d = Draft.for_target(t, draft_vocab, ttt_steps)
    fit = start_budget(d, gpu_bytes, headroom, max_seq_len)
    start = total_seq_len or fit
    world = max(1, gpus_per_node) * max(1, nodes)
    s: dict[str, Any] = {"gpu_bytes": gpu_bytes, "draft_params": d.trainable_params, "world_size": world,
                         "fits_at": fit, "start": start, "explicit": total_seq_len is not None}  # fmt: skip
    if start is None or start < min_seq_len:
        smallest = LADDER[-1]
        s.update(what="no budget fits one GPU", verdict="REFUSED", against_text=f"{gpu_bytes / GIB:.1f} GiB GPU",
                 needs_text=f"{d.memory(max(min_seq_len, smallest)) / GIB:.1f} GiB at {max(min_seq_len, smallest)}")
        p.stages["training"] = s
        p.refusals.append(f"Training needs {d.memory(min_seq_len) / GIB:.1f} GiB per GPU at its smallest budget "
                          f"({min_seq_len} tokens, eagle3_train_min_seq_len) but a GPU has {gpu_bytes / GIB:.1f} GiB: "
                          "use GPUs with more memory, a smaller draft vocabulary (eagle3_train_draft_vocab_size) or "
                          "fewer TTT steps (eagle3_train_ttt_steps).")  # fmt: skip
        return
    train_samples = int(samples * (1 - val_ratio))
    if token_counts:
        steps = steps_per_epoch(token_counts[:train_samples], start, world)
    else:  # samples of the mean length, as many per row as fit
        per_row = max(1, start // max(1, int(min(mean_tokens, start))))
        steps = train_samples // (world * per_row) if train_samples >= world else 0
    tokens = sum(min(c, start) for c in token_counts[:train_samples]) if token_counts else train_samples * min(
        mean_tokens, start)
    seconds = tokens * epochs / max(tokens_per_second * world, 1e-9)
    s.update(what=f"start total_seq_len {start} on {world} GPU(s), {epochs} epochs",
             memory=d.memory(start), ladder=ladder_from(start, min_seq_len), steps_per_epoch=steps,
             train_samples=train_samples, tokens_per_epoch=int(tokens), seconds=int(seconds),
             tokens_per_second_per_gpu=tokens_per_second, throughput_source=throughput_source,
             needs_text=f"{d.memory(start) / GIB:.1f} GiB/GPU, {steps:,} steps/epoch, ~{_duration(seconds)}"
                        f" ({throughput_source} {tokens_per_second:,.0f} tok/s/GPU)",
             against_text=f"{gpu_bytes / GIB:.1f} GiB GPU", verdict="ok")  # fmt: skip
    if total_seq_len is not None and fit is not None and total_seq_len > fit:
        p.warnings.append(f"The total_seq_len {total_seq_len} is set above the {fit} the memory model fits in "
                          f"{gpu_bytes / GIB:.1f} GiB: the launcher backs off on out-of-memory.")  # fmt: skip
    p.stages["training"] = s
    p.stages["export"] = {"what": f"draft: 1 layer, draft vocabulary {d.draft_vocab}", "bytes": d.export_bytes(),
                          "needs_text": _h(d.export_bytes()), "verdict": "ok"}  # fmt: skip


def plan_serving(p: Plan, t: Target, *, gpu_bytes: int, gpus: int, tp: int, mem_fraction: float, context: int,
                 concurrency: int, kv_dtype_bytes: int, draft_bytes: int, host: str) -> None:  # fmt: skip
    tp = max(1, tp)
    weights = t.weight_bytes()
    per_gpu = weights / tp
    kv = t.kv_bytes_per_token(kv_dtype_bytes, tp) * context * max(1, concurrency)
    need = per_gpu + draft_bytes + kv
    usable = gpu_bytes * mem_fraction
    s = {"what": f"target {_h(weights)} ({t.quantization.method}) over TP {tp}, draft, KV {context} x {concurrency}",
         "weights": weights, "weights_per_gpu": int(per_gpu), "draft_bytes": draft_bytes, "kv_bytes": int(kv),
         "needed_per_gpu": int(need), "usable_per_gpu": int(usable), "gpu_bytes": gpu_bytes, "tp": tp, "gpus": gpus,
         "needs_text": f"{need / GIB:.1f} GiB/GPU (weights {per_gpu / GIB:.1f}, KV {kv / GIB:.1f})",
         "against_text": f"{usable / GIB:.1f} GiB ({mem_fraction:.2f} of {gpu_bytes / GIB:.1f})",
         "verdict": "ok" if need <= usable and tp <= max(gpus, 1) else "REFUSED"}  # fmt: skip
    p.stages["serving"] = s
    if tp > max(gpus, 1):
        p.refusals.append(f"{host} has {gpus} GPU(s) but serving asks for tensor parallelism {tp}: lower "
                          "sglang_serve_tp_size or serve from a host with more GPUs.")  # fmt: skip
    elif need > usable:
        p.refusals.append(f"{host}'s GPUs cannot hold what it would load: {need / GIB:.1f} GiB per GPU (target "
                          f"{per_gpu / GIB:.1f}, draft {draft_bytes / GIB:.1f}, KV cache {kv / GIB:.1f} for "
                          f"{concurrency} x {context} tokens) against {usable / GIB:.1f} GiB ({mem_fraction:.2f} of "
                          f"{gpu_bytes / GIB:.1f}): raise the tensor parallelism, serve a quantized target, or lower "
                          "the context or concurrency.")  # fmt: skip
