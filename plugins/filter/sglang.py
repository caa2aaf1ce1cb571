"""Filters for SGLang deployments: speculative-decoding arguments derived from draft_tokens, validated."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

try:  # installed collection (and ansible-test); tests load the file directly and go through sys.path
    from ansible_collections.eagle3.ops.plugins.module_utils._bench import label as _label
    from ansible_collections.eagle3.ops.plugins.module_utils._eagle3 import RETRAIN_FLAGS, ExportError
    from ansible_collections.eagle3.ops.plugins.module_utils._eagle3 import sglang_line as _line
    from ansible_collections.eagle3.ops.plugins.module_utils._setting import served_setting
except ImportError:  # pragma: no cover
    _line = None  # type: ignore[assignment]
    _label = None  # type: ignore[assignment]
    served_setting = None  # type: ignore[assignment]

DOCUMENTATION = r"""
name: sglang_speculative_args
short_description: SGLang EAGLE-3 arguments from draft_tokens (chain) or topk/steps (tree), validated
description:
  - Chain mode (topk unset or 1) uses topk 1 and steps = draft_tokens - 1, which is what SGLang forces for chains.
  - Tree mode needs topk > 1 and steps, and draft_tokens between 2 and topk + (steps - 1) * topk^2 + 1 - SGLang
    0.5.23 drafts topk candidates at the first step and topk^2 at each later one, and verifies the best
    draft_tokens - 1 of them plus the root (C(organize_draft_results); one more fails at draft time with
    "selected index k out of range").
  - Raises a one-sentence error naming the bad value before anything is started.
positional: draft_tokens
options:
  draft_tokens: {description: Tokens verified per step (the draft's proposals plus one)., type: raw, required: true}
  topk: {description: Branching per step (tree mode when above 1)., type: raw}
  steps: {description: Drafting depth (required in tree mode)., type: raw}
  max_draft_tokens: {description: Upper bound for draft_tokens (an integer or its digits)., type: raw, default: 64}
  context_length: {description: The draft's max_position_embeddings; steps must stay below it., type: raw}
"""


def _int(name: str, value: Any, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or value is None:
        raise AnsibleFilterError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise AnsibleFilterError(f"{name} must be a whole number, got {value!r}")
        value = int(value)
    if isinstance(value, str):
        if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
            raise AnsibleFilterError(f"{name} must be an integer, got {value!r}")
        value = int(value)
    if not isinstance(value, int):
        raise AnsibleFilterError(f"{name} must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise AnsibleFilterError(f"{name} is {value}; it must be {bound}")
    return value


def tree_limit(topk: int, steps: int) -> int:
    """The most draft tokens SGLang 0.5.23 verifies for a tree: the root plus every candidate drafted.

    ``select_top_k_tokens`` keeps topk candidates at the first step and topk * topk at each later one;
    ``organize_draft_results`` takes the best ``num_draft_tokens - 1`` of them with ``torch.topk``, which fails
    past that count ("selected index k out of range"). topk 4, steps 3: 4 + 2 * 16 + 1 = 37.
    """
    return topk + (steps - 1) * topk * topk + 1


def sglang_speculative_args(draft_tokens: Any, topk: Any = None, steps: Any = None, max_draft_tokens: Any = 64,
                            context_length: Any = None) -> dict[str, Any]:  # fmt: skip
    cap = _int("max_draft_tokens", max_draft_tokens, 2)
    tokens = _int("draft_tokens", draft_tokens, 2, cap)
    k = 1 if topk in (None, "") else _int("speculative topk", topk, 1)
    s = None if steps in (None, "") else _int("speculative steps", steps, 1)
    if k == 1:
        if s is not None and s != tokens - 1:
            raise AnsibleFilterError(
                f"chain drafting (topk 1) verifies steps + 1 tokens: steps {s} contradicts draft_tokens {tokens}; "
                f"drop steps or set it to {tokens - 1}"
            )
        s, mode = tokens - 1, "chain"
    else:
        if s is None:
            raise AnsibleFilterError(f"tree drafting (topk {k}) needs steps as well: set both topk and steps")
        if tokens > tree_limit(k, s):
            raise AnsibleFilterError(
                f"draft_tokens {tokens} exceeds what a tree of topk {k} and {s} steps drafts for SGLang to verify "
                f"({k} + {s - 1}*{k}*{k} + 1 = {tree_limit(k, s)}); lower draft_tokens or raise topk/steps"
            )
        mode = "tree"
    if context_length not in (None, "") and s >= _int("context_length", context_length, 1):
        raise AnsibleFilterError(f"{s} draft steps do not fit the draft's context of {context_length} positions")
    argv = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(s), "--speculative-eagle-topk", str(k),
            "--speculative-num-draft-tokens", str(tokens)]  # fmt: skip
    return {"algorithm": "EAGLE3", "mode": mode, "num_steps": s, "eagle_topk": k, "num_draft_tokens": tokens,
            "argv": argv}  # fmt: skip


def sglang_speculative_problem(draft_tokens: Any, topk: Any = None, steps: Any = None,
                               max_draft_tokens: Any = 64) -> str:
    """Why these speculative values are refused, as one sentence, or "" when they are valid.

    For an assert's fail_msg: validation then fails with the sentence alone, not inside a templating error.
    """
    try:
        sglang_speculative_args(draft_tokens, topk, steps, max_draft_tokens)
    except AnsibleFilterError as exc:
        return f"{exc.message if hasattr(exc, 'message') else exc}."
    return ""


BENCH_FIELDS = ("completed", "duration", "total_output_tokens", "output_throughput", "request_throughput",
                "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
                "accept_length")  # fmt: skip


def bench_point(pair: Any, draft_tokens: Any, host: str) -> dict[str, Any]:
    """One benchmark point from (client result, concurrency): bench_serving's fields, labelled with its setting
    (draft_tokens: a number, null for the baseline, or a {draft_tokens, topk, steps} setting)."""
    result, concurrency = pair
    if not isinstance(result, dict):
        raise AnsibleFilterError(f"benchmark output is not a JSON object: {result!r}")
    point = {k: result.get(k) for k in BENCH_FIELDS}
    if point["accept_length"] is None:  # older bench_serving names
        point["accept_length"] = result.get("spec_accept_length") or result.get("avg_spec_accept_length")
    setting = draft_tokens if isinstance(draft_tokens, dict) else {"draft_tokens": draft_tokens}
    dt = None if setting.get("draft_tokens") in (None, "", "baseline") else int(setting["draft_tokens"])
    topk = int(setting.get("topk") or 1) if dt is not None else None
    steps = (int(setting["steps"]) if setting.get("steps") else dt - 1) if dt is not None else None
    point.update(max_concurrency=int(concurrency), draft_tokens=dt, topk=topk, steps=steps, host=host)
    point["label"] = _label(point) if _label is not None else str(dt or "baseline")
    return point


def sglang_line(version: Any) -> dict[str, Any]:
    """The SGLang line of a release (module_utils/_eagle3.py SGLANG_LINES), for roles that follow its rules."""
    if _line is None:
        raise AnsibleFilterError("sglang_line needs the eagle3.ops collection's module_utils")
    try:
        line = _line(None if version is None else str(version))
    except ExportError as exc:
        raise AnsibleFilterError(str(exc)) from None
    # speculators' architecture defaults this line does not compute, as the training flags that turn them off.
    train_flags = [part for key in ("norm_before_fc", "norm_output", "norm_before_residual", "sliding_window")
                   if key not in line.computes for part in RETRAIN_FLAGS[key].split()]  # fmt: skip
    return {"name": line.name, "label": line.label, "native_layer_names": line.native_layer_names,
            "computes": sorted(line.computes), "first_layer_prefix": line.layer_prefix(0),
            "train_flags": train_flags}  # fmt: skip


def sglang_release_query(python: str) -> list[str]:
    """The argv that prints the SGLang release installed for ``python`` (sglang_runtime's read, and deploy.yml's
    fingerprint check, which takes it in the same call on a setting switch)."""
    return [str(python), "-c", "from importlib.metadata import version; print(version('sglang'))"]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"sglang_speculative_args": sglang_speculative_args, "bench_point": bench_point,
                "sglang_speculative_problem": sglang_speculative_problem, "sglang_line": sglang_line,
                "sglang_release_query": sglang_release_query, "served_setting": served_setting}
