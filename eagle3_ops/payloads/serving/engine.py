"""A CPU EAGLE-3 reference engine: the target in transformers, the draft exactly as SGLang loads it.

The draft is read the way SGLang's ``LlamaForCausalLMEagle3`` reads it, in the SGLang line the lab plays
(``EAGLE3_REFERENCE_SGLANG_VERSION``, the serving host's SGLang release; legacy when unset):
``architectures`` must name that class, shapes must match, and **any other key is dropped silently**.

* legacy line (before 0.5.23): the weights it knows are ``midlayer.*``, ``fc``, ``norm``, ``lm_head``,
  ``embed_tokens`` and ``d2t`` - so a draft whose keys still say ``layers.0.*`` loads, runs on untrained
  weights and accepts about one token per step, as it did under the seeds' SGLang.
* 0.5.23 and newer: ``layers.0.*`` (``midlayer.*`` mapped to it), plus ``input_norm`` over the
  concatenated features when ``eagle_config.norm_before_fc``, per-aux ``fc_norm.{i}`` when ``fc_norm``,
  and ``norm_output`` (the next draft step is fed the normed output). One draft layer here (SGLang
  serves several; this engine refuses them).

The auxiliary layers come from ``eagle_config.eagle_aux_hidden_state_layer_ids`` and are captured as SGLang
captures them: an explicit id ``k`` is the output of the target's decoder layer ``k`` (SGLang captures at the
start of layer ``k + 1``), while its default when the ids are absent, ``[2, N//2, N-3]``, names layer
*inputs* (the outputs of layers 1, N//2 - 1, N - 4).

Decoding is chain EAGLE-3 (top-k 1) with greedy verification, computed in float32: the target verifies
``[last token, d1 .. dk]`` in one forward, the longest agreeing prefix is kept plus the target's own next
token, so the output is the target's greedy output. The draft layer keeps a KV cache over the context
(one entry per target-verified position: embedding of token j+1 beside the target's features at j, at
position j+1); chain steps attend to that cache and to their own earlier steps, as in training.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"


class DraftLoadError(Exception):
    """The draft cannot be loaded (SGLang would refuse it too)."""


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama's default rotary embedding; x is [heads, seq, head_dim]."""
    dim = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    cos, sin = emb.cos(), emb.sin()
    half = dim // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class MidLayer(nn.Module):
    """SGLang's EAGLE-3 decoder layer: q/k/v read [norm(embeds) || hidden_norm(hidden)]; the residual is the
    hidden state before hidden_norm."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        self.head_dim = cfg.get("head_dim") or h // self.heads
        eps = cfg.get("rms_norm_eps", 1e-6)
        self.input_layernorm = RMSNorm(h, eps)
        self.hidden_norm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, self.heads * self.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * h, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * self.head_dim, h, bias=False)
        self.mlp = nn.Module()
        inter = cfg["intermediate_size"]
        self.mlp.gate_proj = nn.Linear(h, inter, bias=False)
        self.mlp.up_proj = nn.Linear(h, inter, bias=False)
        self.mlp.down_proj = nn.Linear(inter, h, bias=False)
        self.theta = float(cfg.get("rope_theta") or (cfg.get("rope_parameters") or {}).get("rope_theta") or 10000.0)

    def qkv(self, embeds: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)
        n = x.shape[0]
        q = self.self_attn.q_proj(x).view(n, self.heads, self.head_dim).transpose(0, 1)
        k = self.self_attn.k_proj(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        v = self.self_attn.v_proj(x).view(n, self.kv_heads, self.head_dim).transpose(0, 1)
        return _rope(q, positions, self.theta), _rope(k, positions, self.theta), v

    def finish(self, attn: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        h = residual + self.self_attn.o_proj(attn.transpose(0, 1).reshape(attn.shape[1], -1))
        m = self.post_attention_layernorm(h)
        return h + self.mlp.down_proj(nn.functional.silu(self.mlp.gate_proj(m)) * self.mlp.up_proj(m))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=0), v.repeat_interleave(rep, dim=0)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~mask, float("-inf"))
        return torch.softmax(scores, dim=-1) @ v


def modern_line(version: str | None) -> bool:
    """True for SGLang 0.5.23 and newer (the module_utils/_eagle3.py SGLANG_LINES boundary)."""
    import re

    m = re.match(r"v?(\d+(?:\.\d+)*)", (version or "").strip())
    if m is None:  # "legacy", unset
        return False
    return tuple(int(x) for x in m.group(1).split(".")) >= (0, 5, 23)


class Eagle3Draft(nn.Module):
    def __init__(self, cfg: dict[str, Any], target_hidden: int, n_aux: int, use_aux: bool, modern: bool) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        eps = cfg.get("rms_norm_eps", 1e-6)
        eagle = cfg.get("eagle_config") or {}
        width = (n_aux if use_aux else 1) * target_hidden
        # Features of SGLang 0.5.23's draft model; the legacy line knows none of them (their weights drop).
        self.input_norm: RMSNorm | None = None
        if modern and eagle.get("norm_before_fc", cfg.get("norm_before_fc")):
            self.input_norm = RMSNorm(width, eps)
        self.fc_norm: nn.ModuleList | None = None
        if modern and (cfg.get("fc_norm") or cfg.get("use_aux_norm")):
            self.fc_norm = nn.ModuleList([RMSNorm(target_hidden, eps) for _aux in range(n_aux)])
        self.norm_output = bool(modern and cfg.get("norm_output"))
        self.vocab = cfg["vocab_size"]
        self.draft_vocab = cfg.get("draft_vocab_size") or self.vocab
        self.embed_tokens = nn.Embedding(self.vocab, h)
        self.fc = nn.Linear(width, h, bias=False)
        self.midlayer = MidLayer(cfg)
        self.norm = RMSNorm(h, cfg.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(h, self.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(self.draft_vocab, dtype=torch.long))
        self.hidden_size = h

    def features(self, target_hidden: torch.Tensor) -> torch.Tensor:
        # As in SGLang: fc only when the captured features are wider than the draft's hidden size.
        if target_hidden.shape[-1] == self.hidden_size:
            return target_hidden
        if self.input_norm is not None:
            target_hidden = self.input_norm(target_hidden)
        if self.fc_norm is not None:
            chunks = target_hidden.chunk(len(self.fc_norm), dim=-1)
            target_hidden = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(target_hidden)

    def feed(self, h: torch.Tensor) -> torch.Tensor:
        """What the next draft step receives: the output before the final norm, or after it (norm_output)."""
        return self.norm(h) if self.norm_output else h

    def to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]


@dataclass
class Stats:
    requests: int = 0
    generated: int = 0
    verify_steps: int = 0
    accepted_drafts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    # SGLang's live figures (its /metrics gauges sglang:spec_accept_length and sglang:gen_throughput): measured over
    # one log interval of decode forwards, published when the interval ends, then counted afresh
    # (scheduler_components/metrics_reporter.py: the spec counters and the generated tokens reset at each log).
    log_interval: int = 40
    interval: dict[str, float] = field(default_factory=lambda: {"steps": 0, "accepted": 0, "tokens": 0, "since": 0.0})
    gauges: dict[str, float] = field(default_factory=dict)

    def accept_length(self) -> float | None:
        """Tokens per verify forward (accepted drafts + the target's own token), as SGLang reports it."""
        return (1 + self.accepted_drafts / self.verify_steps) if self.verify_steps else None

    def count_interval(self, generated: int, steps: int, accepted: int, seconds: float, now: float) -> None:
        """Add one request's forwards to the current interval (under ``lock``); publish the gauges when it holds
        ``log_interval`` forwards - a verify forward each with a draft, a decode step each without."""
        iv = self.interval
        if not iv["since"]:
            iv["since"] = now - seconds
        forwards = steps if steps else generated
        iv["steps"] += forwards
        iv["accepted"] += accepted + (steps if steps else 0)
        iv["tokens"] += generated
        if iv["steps"] < self.log_interval:
            return
        gap = max(now - iv["since"], 1e-6)
        self.gauges = {"gen_throughput": iv["tokens"] / gap,
                       "spec_accept_length": (iv["accepted"] / iv["steps"]) if steps else 0.0}  # fmt: skip
        self.interval = {"steps": 0, "accepted": 0, "tokens": 0, "since": now}


def load_draft(path: str, target_cfg: Any, algorithm: str,
               sglang_version: str | None = None) -> tuple[Eagle3Draft, list[int], dict[str, Any]]:  # fmt: skip
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        raise DraftLoadError(f"{cfg_path} is missing: point --speculative-draft-model-path at an exported draft")
    with open(cfg_path, encoding="utf-8") as fh:
        cfg = json.load(fh)
    archs = cfg.get("architectures") or []
    if DRAFT_ARCHITECTURE not in archs:
        raise DraftLoadError(f"{cfg_path} names architectures {archs}, not {DRAFT_ARCHITECTURE}: export the "
                             "speculators checkpoint first (eagle3_export)")  # fmt: skip
    for key in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"):
        if key not in cfg:
            raise DraftLoadError(f"{cfg_path} lacks {key!r}: the draft config is not a llama EAGLE-3 config")
    n_layers = int(target_cfg.num_hidden_layers)
    eagle = cfg.get("eagle_config") or {}
    explicit = eagle.get("eagle_aux_hidden_state_layer_ids")
    # As SGLang's set_eagle3_layers_to_capture: it captures at the start of layer val + 1 for an explicit id
    # (the output of layer val) and at the start of layers [2, N//2, N-3] by default (their inputs). Here the
    # forward hooks read layer outputs, so both become "output of layer k".
    aux = [int(i) for i in explicit] if explicit else [2 - 1, n_layers // 2 - 1, n_layers - 3 - 1]
    if any(not 0 <= i <= n_layers - 2 for i in aux):
        raise DraftLoadError(f"aux layer ids {explicit or 'by default'} capture outside layers 1..{n_layers - 1} of "
                             f"the {n_layers}-layer target (SGLang captures at the start of layer id + 1)")  # fmt: skip
    use_aux = algorithm == "EAGLE3" and eagle.get("use_aux_hidden_state", True)
    modern = modern_line(sglang_version)
    if int(cfg.get("num_hidden_layers", 1) or 1) > 1:
        raise DraftLoadError(f"{cfg_path} has {cfg['num_hidden_layers']} draft layers: SGLang 0.5.23 serves them, "
                             "the lab's reference engine implements one")  # fmt: skip
    draft = Eagle3Draft(cfg, int(target_cfg.hidden_size), len(aux), use_aux, modern)
    # A weight the checkpoint does not provide keeps what SGLang's torch.empty leaves there: arbitrary
    # values. Fixed unit-scale noise stands in for them (deterministic, and just as meaningless).
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in draft.parameters():
            p.copy_(torch.randn(p.shape, generator=gen))
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise DraftLoadError(f"{path} has no .safetensors weights")
    own = dict(draft.named_parameters()) | dict(draft.named_buffers())
    loaded, dropped, has_embed = [], [], False
    for name in files:
        for key, tensor in load_file(os.path.join(path, name)).items():
            if modern:  # SGLang 0.5.23 keeps layers.N and maps the legacy names to them
                key = _modern_key(key)
            if key not in own:
                dropped.append(key)
                continue
            if tuple(tensor.shape) != tuple(own[key].shape):
                raise DraftLoadError(f"{key} has shape {tuple(tensor.shape)} where the config implies "
                                     f"{tuple(own[key].shape)}: the draft config and weights disagree")  # fmt: skip
            with torch.no_grad():
                own[key].copy_(tensor.to(own[key].dtype))
            loaded.append(key)
            has_embed |= key == "embed_tokens.weight"
    if "d2t" not in loaded and draft.draft_vocab != draft.vocab:
        raise DraftLoadError(f"{path} has draft_vocab_size {draft.draft_vocab} < vocab_size {draft.vocab} but no d2t")
    info = {"aux_layer_ids": explicit, "captured_layer_outputs": aux, "loaded": len(loaded), "dropped": sorted(dropped),
            "embed_from_target": not has_embed, "sglang_line": "0.5.23" if modern else "legacy"}  # fmt: skip
    return draft.eval(), aux, info


def _modern_key(key: str) -> str:
    """A 0.5.23 weight name in this engine's module names (its one layer is called midlayer)."""
    for legacy, modern in (("aux_norm_low.", "fc_norm.0."), ("aux_norm_mid.", "fc_norm.1."),
                           ("aux_norm_high.", "fc_norm.2.")):  # fmt: skip
        if key.startswith(legacy):
            key = modern + key[len(legacy) :]
    if key.startswith("layers.0."):
        return "midlayer." + key[len("layers.0.") :]
    return key


def _importable_torchvision() -> None:
    """A server runs this engine in SGLang's environment, whose CPU build (the lab's) carries a torchvision linked
    against CUDA: transformers imports it, and it stops at its operators' registration. sglang_check's shim defines
    their two schemas first (cpu_shims.py); a torchvision that loads, or none, is left alone."""
    try:
        from sglang_check.cpu_shims import torchvision_operator_schemas
    except ImportError:  # a payload without sglang_check (the engine alone): nothing to define
        return
    torchvision_operator_schemas()


class Engine:
    """One request at a time (a lock), greedy, float32."""

    def __init__(self, model_path: str, draft_path: str | None = None, algorithm: str | None = None,
                 num_steps: int = 0, topk: int = 1, num_draft_tokens: int = 0,
                 sglang_version: str | None = None) -> None:  # fmt: skip
        _importable_torchvision()
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_grad_enabled(False)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        self.cfg = self.model.config
        self.algorithm = algorithm
        self.stats = Stats()
        self.lock = threading.Lock()
        self.draft: Eagle3Draft | None = None
        self.draft_info: dict[str, Any] = {}
        self.k = 0
        if algorithm:
            if algorithm not in ("EAGLE3", "EAGLE"):
                raise DraftLoadError(f"--speculative-algorithm {algorithm} is not implemented by the reference engine "
                                     "(EAGLE3 or EAGLE)")  # fmt: skip
            if topk != 1:
                raise DraftLoadError(f"--speculative-eagle-topk {topk}: the reference engine drafts chains only "
                                     "(topk 1)")  # fmt: skip
            if not draft_path:
                raise DraftLoadError("--speculative-draft-model-path is required with --speculative-algorithm")
            self.draft, self.aux, self.draft_info = load_draft(draft_path, self.cfg, algorithm, sglang_version)
            if self.draft_info["embed_from_target"]:
                self.draft.embed_tokens.weight.copy_(self.model.get_input_embeddings().weight)
            # With top-k 1 SGLang forces draft tokens = steps + 1: k drafted tokens per verify.
            self.k = num_steps
        self._captured: dict[int, torch.Tensor] = {}
        layers = self.model.model.layers
        wanted = set(self.aux) if self.draft is not None and algorithm == "EAGLE3" else set()
        wanted.add(len(layers) - 1)
        for i in wanted:
            layers[i].register_forward_hook(self._hook(i))
        self.eos = self.tokenizer.eos_token_id

    def _hook(self, i: int):
        def hook(_mod: nn.Module, _inp: Any, out: Any) -> None:
            self._captured[i] = (out[0] if isinstance(out, tuple) else out)[0]

        return hook

    def _target(self, ids: list[int], cache: Any) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Logits [n, vocab] and the draft's input features [n, F] for the new tokens."""
        out = self.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        if self.algorithm == "EAGLE3":
            feats = torch.cat([self._captured[i] for i in self.aux], dim=-1)
        else:
            # EAGLE-1/2 feeds the last layer's state only: an EAGLE-3 draft gets the wrong features.
            feats = self._captured[len(self.model.model.layers) - 1]
        return out.logits[0], feats, out.past_key_values

    def encode(self, text: str | None = None, messages: list[dict[str, str]] | None = None) -> list[int]:
        if messages is not None:
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        return self.tokenizer.encode(text or "", add_special_tokens=False)

    def generate(self, prompt_ids: list[int], max_new_tokens: int, on_tokens=None, speculative: bool = True,
                 gaps: list[float] | None = None) -> dict[str, Any]:  # fmt: skip
        """Greedy decoding. ``on_tokens`` gets each target forward's new tokens (streaming); ``gaps``, for plain
        decoding, collects the margin between the two best logits at every step (to tell ties from bugs)."""
        if not prompt_ids:
            raise ValueError("the prompt is empty")
        limit = int(getattr(self.cfg, "max_position_embeddings", 1 << 30))
        if len(prompt_ids) + max_new_tokens > limit:
            raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the "
                             f"model's context of {limit}")  # fmt: skip
        with self.lock:
            self._started = time.monotonic()  # the request's decode time, for the interval's throughput
            if self.draft is None or not speculative or self.k < 1:
                return self._plain(prompt_ids, max_new_tokens, on_tokens, gaps)
            return self._speculative(prompt_ids, max_new_tokens, on_tokens)

    def _plain(self, prompt_ids: list[int], max_new: int, on_tokens, gaps: list[float] | None = None) -> dict[str, Any]:
        from transformers import DynamicCache

        cache = DynamicCache()
        logits, _unused, cache = self._target(prompt_ids, cache)
        out: list[int] = []
        while len(out) < max_new:
            tok = int(torch.argmax(logits[-1]))
            if gaps is not None:
                top2 = torch.topk(logits[-1], 2).values
                gaps.append(float(top2[0] - top2[1]))
            out.append(tok)
            if on_tokens:
                on_tokens([tok])
            if tok == self.eos or len(out) >= max_new:
                break
            logits, _unused, cache = self._target([tok], cache)
        self._count(len(out), 0, 0)
        return {"output_ids": out, "verify_steps": 0, "accepted_drafts": 0}

    def _speculative(self, prompt_ids: list[int], max_new: int, on_tokens) -> dict[str, Any]:
        from transformers import DynamicCache

        d = self.draft
        assert d is not None
        m = d.midlayer
        cache = DynamicCache()
        logits, feats, cache = self._target(prompt_ids, cache)
        seq = list(prompt_ids)
        nxt = int(torch.argmax(logits[-1]))
        out = [nxt]
        if on_tokens:
            on_tokens([nxt])
        # Draft context cache: one K/V per target-verified position j (embedding of token j+1, features of j).
        ctx_k = torch.empty(m.kv_heads, 0, m.head_dim)
        ctx_v = torch.empty(m.kv_heads, 0, m.head_dim)
        pending_feats = feats  # features of positions not yet in the draft cache
        steps = accepted_total = 0
        while out[-1] != self.eos and len(out) < max_new:
            seq_all = seq + out  # every token so far; the target has processed all but the last
            start = ctx_k.shape[1]
            n_new = pending_feats.shape[0]
            js = torch.arange(start, start + n_new)
            emb = d.embed_tokens(torch.tensor(seq_all[start + 1 : start + 1 + n_new]))
            hid = d.features(pending_feats)
            q, k, v = m.qkv(emb, hid, js + 1)
            ctx_k, ctx_v = torch.cat([ctx_k, k], 1), torch.cat([ctx_v, v], 1)
            total = ctx_k.shape[1]
            mask = torch.arange(total)[None, :] <= js[:, None]
            h = m.finish(m.attend(q, ctx_k, ctx_v, mask), hid)
            # Chain drafting from the last context position.
            h_last = h[-1:]  # the layer's output before the final norm (logits always read it normed)
            drafts: list[int] = []
            chain_k, chain_v = ctx_k, ctx_v
            budget = min(self.k, max_new - len(out))
            pos = total  # position id of the token being embedded next (token index total)
            while True:
                tok = int(d.to_target(torch.argmax(d.lm_head(d.norm(h_last)), dim=-1))[0])
                drafts.append(tok)
                if len(drafts) >= budget:
                    break
                fed = d.feed(h_last)
                q, k, v = m.qkv(d.embed_tokens(torch.tensor([tok])), fed, torch.tensor([pos + 1]))
                chain_k, chain_v = torch.cat([chain_k, k], 1), torch.cat([chain_v, v], 1)
                mask = torch.ones(1, chain_k.shape[1], dtype=torch.bool)
                h_last = m.finish(m.attend(q, chain_k, chain_v, mask), fed)
                pos += 1
            # Verify [last token, d1..dk] in one target forward.
            logits, feats, cache = self._target([out[-1], *drafts], cache)
            greedy = torch.argmax(logits, dim=-1).tolist()
            n_ok = 0
            while n_ok < len(drafts) and drafts[n_ok] == greedy[n_ok] and drafts[n_ok] != self.eos:
                n_ok += 1
            new = [*drafts[:n_ok], greedy[n_ok]][: max_new - len(out)]
            if self.eos in new:
                new = new[: new.index(self.eos) + 1]
            # Keep the target cache and the features of the accepted positions only.
            surplus = cache.get_seq_length() - (len(seq_all) + n_ok)
            if surplus > 0:
                cache.crop(-surplus)
            pending_feats = feats[: n_ok + 1]
            out.extend(new)
            steps += 1
            accepted_total += n_ok
            if on_tokens:
                on_tokens(new)
        self._count(len(out), steps, accepted_total)
        return {"output_ids": out, "verify_steps": steps, "accepted_drafts": accepted_total}

    def _count(self, generated: int, steps: int, accepted: int) -> None:
        now = time.monotonic()
        seconds = now - getattr(self, "_started", now)
        with self.stats.lock:
            self.stats.requests += 1
            self.stats.generated += generated
            self.stats.verify_steps += steps
            self.stats.accepted_drafts += accepted
            self.stats.count_interval(generated, steps, accepted, seconds, now)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)
