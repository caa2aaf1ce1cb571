# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark reports: speedups within one engine, the markdown table and the PNG plot.

Input: the points spec_bench collects, one per (configuration, concurrency), each with ``draft_tokens`` (null
for the baseline), ``engine``, ``max_concurrency`` and the client's fields (``output_throughput``,
``median_ttft_ms``, ``p99_ttft_ms``, ``median_itl_ms``, ``p99_itl_ms``, ``accept_length``). A speedup divides a
point's throughput by the baseline of the same engine at the same concurrency, measured in the same sweep (a
ratio across engines would measure the engines, not the drafter). Used by the module eagle3.ops.bench_report,
which runs on the controller; matplotlib is needed for the plot only.
"""

from __future__ import annotations

from typing import Any

COLUMNS = ("draft tokens", "engine", "concurrency", "output tok/s", "speedup", "TTFT p50 ms", "TTFT p99 ms",
           "ITL p50 ms", "ITL p99 ms", "accept length")  # fmt: skip
META_KEYS = ("draft", "engine", "client", "hosts", "date")


def fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, (int, float)) else str(value))


def label(p: dict[str, Any]) -> str:
    """A configuration's name: ``baseline``, ``N`` (a chain of N draft tokens) or ``N (tree topk K, S steps)``."""
    if p.get("draft_tokens") is None:
        return "baseline"
    topk = p.get("topk") or 1
    return str(p["draft_tokens"]) if topk == 1 else f"{p['draft_tokens']} (tree topk {topk}, {p.get('steps')} steps)"


OBJECTIVES = {"throughput": ("output_throughput", max, "output tok/s"), "itl": ("median_itl_ms", min, "ITL p50 ms")}


def choose(points: list[dict[str, Any]], objective: str = "throughput", concurrency: int | None = None,
           engine: str | None = None, insist: bool = False) -> dict[str, Any]:  # fmt: skip
    """The best configuration at one concurrency of one engine by the objective - output throughput (higher is
    better) or p50 inter-token latency (lower is better) - against that engine's baseline of the same sweep.

    When no drafted configuration beats the baseline the choice is no speculation, unless ``insist``.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    field, pick, unit = OBJECTIVES[objective]
    here = [p for p in points if (engine is None or p.get("engine") == engine) and p.get(field) is not None
            and (concurrency is None or p["max_concurrency"] == int(concurrency))]  # fmt: skip
    base = next((p for p in here if p.get("draft_tokens") is None), None)
    drafted = [p for p in here if p.get("draft_tokens") is not None]
    if base is None or not drafted:
        raise ValueError(f"the sweep has no baseline and drafted points with {field} at concurrency {concurrency} "
                         f"of engine {engine}: nothing to choose from")  # fmt: skip
    best = pick(drafted, key=lambda p: p[field])
    beats = pick(best[field], base[field]) == best[field] and best[field] != base[field]
    chosen = best if beats or insist else base
    ratio = round(best[field] / base[field], 3) if base[field] else None
    verdict = (f"{label(best)} draft tokens: {fmt(best[field])} {unit} against {fmt(base[field])} without speculation "
               f"({ratio}x)")  # fmt: skip
    if beats:
        sentence = f"Chosen {verdict}, the best of {len(drafted)} settings at concurrency {best['max_concurrency']}."
    elif insist:
        sentence = f"No setting beats the baseline; serving the best anyway (insisted): {verdict}."
    else:
        sentence = f"No setting beats the baseline (best: {verdict}): serving without speculation."
    return {"speculative": chosen is not base, "draft_tokens": chosen.get("draft_tokens"),
            "topk": chosen.get("topk") or (1 if chosen is not base else None), "steps": chosen.get("steps"),
            "label": label(chosen), "objective": objective, "value": chosen[field], "baseline_value": base[field],
            "best_label": label(best), "best_value": best[field], "ratio": ratio, "beats_baseline": beats,
            "concurrency": best["max_concurrency"], "engine": best.get("engine"), "sentence": sentence}  # fmt: skip


def check_points(points: Any) -> list[str]:
    """What is wrong with the points, one sentence each (empty when they can be reported)."""
    if not isinstance(points, list) or not points:
        return ["no benchmark points: run the sweep (spec_bench) first, nothing to report"]
    problems = []
    for i, p in enumerate(points):
        missing = [k for k in ("max_concurrency", "output_throughput") if not isinstance(p, dict) or p.get(k) is None]
        if missing:
            problems.append(f"point {i} lacks {', '.join(missing)}: pass the points spec_bench recorded")
    return problems


def speedups(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {(p["max_concurrency"], p.get("engine")): p["output_throughput"] for p in points
            if p.get("draft_tokens") is None}  # fmt: skip
    out = []
    for p in points:
        b = base.get((p["max_concurrency"], p.get("engine")))
        out.append({**p, "speedup": round(p["output_throughput"] / b, 3) if b and p.get("draft_tokens") else None})
    return out


def markdown(points: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    order = sorted(points, key=lambda p: (p.get("draft_tokens") or 0, p.get("topk") or 1, str(p.get("engine")),
                                          p["max_concurrency"]))  # fmt: skip
    chosen = meta.get("chosen") if isinstance(meta.get("chosen"), dict) else None
    lines = [f"# EAGLE-3 benchmark: {meta.get('target', '?')}", ""]
    lines += [f"- {k}: {meta[k]}" for k in META_KEYS if meta.get(k)]
    if chosen:
        lines += [f"- choice ({chosen.get('objective')}): {chosen.get('sentence')}"]
    lines += ["", "Speedup: output throughput over the same engine's baseline (no speculation) at the same "
              "concurrency.", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for p in order:
        mark = " (chosen)" if chosen and _is_chosen(p, chosen) else ""
        cells = [label(p) + mark, str(p.get("engine") or "?"),
                 str(p["max_concurrency"]), fmt(p.get("output_throughput")), fmt(p.get("speedup"), 2),
                 fmt(p.get("median_ttft_ms")), fmt(p.get("p99_ttft_ms")), fmt(p.get("median_itl_ms")),
                 fmt(p.get("p99_itl_ms")), fmt(p.get("accept_length"), 2)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _is_chosen(p: dict[str, Any], chosen: dict[str, Any]) -> bool:
    return (label(p) == chosen.get("label") and p["max_concurrency"] == chosen.get("concurrency")
            and p.get("engine") == chosen.get("engine"))  # fmt: skip


def plot(points: list[dict[str, Any]], path: str, title: str, chosen: dict[str, Any] | None = None) -> None:
    """Speedup over each engine's own baseline (the dashed 1.0 line) and accept length, axes from 0 and 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(p.get("engine") or "?", p["max_concurrency"], p.get("topk") or 1) for p in points
                     if p.get("draft_tokens")})  # fmt: skip
    top_speed, top_acc = 1.0, 1.0
    for engine, conc, topk in series:
        spec = sorted((p for p in points if p.get("draft_tokens") and p["max_concurrency"] == conc
                       and (p.get("engine") or "?") == engine and (p.get("topk") or 1) == topk),
                      key=lambda p: p["draft_tokens"])  # fmt: skip
        name = f"{engine}, concurrency {conc}" + (f", tree topk {topk}" if topk > 1 else "")
        sped = [p for p in spec if p.get("speedup") is not None]
        color = None
        if sped:
            color = ax1.plot([p["draft_tokens"] for p in sped], [p["speedup"] for p in sped], marker="o",
                             label=name)[0].get_color()  # fmt: skip
            top_speed = max(top_speed, *(p["speedup"] for p in sped))
        acc = [p for p in spec if p.get("accept_length") is not None]
        if acc:
            ax2.plot([p["draft_tokens"] for p in acc], [p["accept_length"] for p in acc], marker="o", color=color,
                     label=name)  # fmt: skip
            top_acc = max(top_acc, *(p["accept_length"] for p in acc))
    picked = [p for p in points if chosen and p.get("draft_tokens") and p.get("speedup") is not None
              and _is_chosen(p, chosen)]  # fmt: skip
    if picked:
        ax1.scatter([p["draft_tokens"] for p in picked], [p["speedup"] for p in picked], marker="*", s=260,
                    color="gold", edgecolors="black", zorder=5,
                    label=f"chosen: {(chosen or {}).get('label')}")  # fmt: skip
    ax1.axhline(1.0, linestyle="--", color="grey", label="no speculation (same engine)" + (
        " - chosen" if chosen and not chosen.get("speculative") else ""))  # fmt: skip
    ax1.set_ylim(0, top_speed * 1.15)
    ax2.set_ylim(1, top_acc * 1.1 + 0.1)
    ax1.set(xlabel="draft tokens", ylabel="speedup over the baseline", title="Output throughput vs no speculation")
    ax2.set(xlabel="draft tokens", ylabel="accept length (tokens/step)", title="Accept length")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)
