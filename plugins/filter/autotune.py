"""Filters for draft_tokens=auto: the search space as SGLang settings (checked by SGLang's rules) and the choice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError

try:  # installed collection (and ansible-test); tests load the file directly and go through sys.path
    from ansible_collections.eagle3.ops.plugins.filter.sglang import sglang_speculative_args
    from ansible_collections.eagle3.ops.plugins.module_utils._bench import choose
except ImportError:  # pragma: no cover - the file loaded from plugins/filter with the checkout on sys.path
    from plugins.filter.sglang import sglang_speculative_args  # type: ignore[no-redef]
    from plugins.module_utils._bench import choose  # type: ignore[no-redef]


def bench_settings(space: Any, engine: str = "sglang", max_draft_tokens: Any = 64) -> list[dict[str, Any]]:
    """Each entry of a search space - an integer (a chain of that many draft tokens) or a mapping with
    draft_tokens, topk and steps (a tree) - as the settings SGLang runs, refused in one sentence where SGLang
    would refuse it or silently run something else (a chain whose steps are not draft_tokens - 1), and trees on
    the reference engine (it drafts chains only)."""
    if not isinstance(space, list) or not space:
        raise AnsibleFilterError("the search space (eagle3_auto_space) must be a non-empty list of draft_tokens values "
                                 "or {draft_tokens, topk, steps} mappings")  # fmt: skip
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(space):
        where = f"search space entry {i + 1} ({entry!r})"
        if isinstance(entry, Mapping):
            unknown = sorted(set(entry) - {"draft_tokens", "topk", "steps"})
            if unknown or "draft_tokens" not in entry:
                raise AnsibleFilterError(f"{where}: a setting has draft_tokens and optionally topk and steps "
                                         f"(unknown: {', '.join(unknown) or 'none'})")  # fmt: skip
            tokens, topk, steps = entry["draft_tokens"], entry.get("topk"), entry.get("steps")
        else:
            tokens, topk, steps = entry, None, None
        try:
            args = sglang_speculative_args(tokens, topk, steps, max_draft_tokens)
        except AnsibleFilterError as exc:
            raise AnsibleFilterError(f"{where}: {exc.message if hasattr(exc, 'message') else exc}") from None
        if args["mode"] == "tree" and engine == "reference":
            raise AnsibleFilterError(f"{where}: the lab's reference engine drafts chains only; drop the tree settings")
        setting = {"draft_tokens": args["num_draft_tokens"], "topk": args["eagle_topk"], "steps": args["num_steps"]}
        if setting in out:
            raise AnsibleFilterError(f"{where} repeats a setting: each setting once")
        out.append(setting)
    return out


def bench_settings_problem(space: Any, engine: str = "sglang", max_draft_tokens: Any = 64) -> str:
    """Why the search space is refused, as one sentence, or "" (for an assert's fail_msg)."""
    try:
        bench_settings(space, engine, max_draft_tokens)
    except AnsibleFilterError as exc:
        return f"{exc.message if hasattr(exc, 'message') else exc}."
    return ""


def bench_choice(points: Any, objective: str = "throughput", concurrency: Any = None, engine: Any = None,
                 insist: Any = False) -> dict[str, Any]:  # fmt: skip
    """The best setting of a sweep by the objective (module_utils/_bench.py choose)."""
    try:
        return choose(list(points), objective, None if concurrency is None else int(concurrency), engine, bool(insist))
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"bench_settings": bench_settings, "bench_settings_problem": bench_settings_problem,
                "bench_choice": bench_choice}  # fmt: skip
