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
    order = sorted(points, key=lambda p: (p.get("draft_tokens") or 0, str(p.get("engine")), p["max_concurrency"]))
    lines = [f"# EAGLE-3 benchmark: {meta.get('target', '?')}", ""]
    lines += [f"- {k}: {meta[k]}" for k in META_KEYS if meta.get(k)]
    lines += ["", "Speedup: output throughput over the same engine's baseline (no speculation) at the same "
              "concurrency.", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for p in order:
        cells = ["baseline" if p.get("draft_tokens") is None else str(p["draft_tokens"]), str(p.get("engine") or "?"),
                 str(p["max_concurrency"]), fmt(p.get("output_throughput")), fmt(p.get("speedup"), 2),
                 fmt(p.get("median_ttft_ms")), fmt(p.get("p99_ttft_ms")), fmt(p.get("median_itl_ms")),
                 fmt(p.get("p99_itl_ms")), fmt(p.get("accept_length"), 2)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(points: list[dict[str, Any]], path: str, title: str) -> None:
    """Speedup over each engine's own baseline (the dashed 1.0 line) and accept length, axes from 0 and 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    series = sorted({(p.get("engine") or "?", p["max_concurrency"]) for p in points if p.get("draft_tokens")})
    top_speed, top_acc = 1.0, 1.0
    for engine, conc in series:
        spec = sorted((p for p in points if p.get("draft_tokens") and p["max_concurrency"] == conc
                       and (p.get("engine") or "?") == engine), key=lambda p: p["draft_tokens"])  # fmt: skip
        label = f"{engine}, concurrency {conc}"
        sped = [p for p in spec if p.get("speedup") is not None]
        color = None
        if sped:
            color = ax1.plot([p["draft_tokens"] for p in sped], [p["speedup"] for p in sped], marker="o",
                             label=label)[0].get_color()  # fmt: skip
            top_speed = max(top_speed, *(p["speedup"] for p in sped))
        acc = [p for p in spec if p.get("accept_length") is not None]
        if acc:
            ax2.plot([p["draft_tokens"] for p in acc], [p["accept_length"] for p in acc], marker="o", color=color,
                     label=label)  # fmt: skip
            top_acc = max(top_acc, *(p["accept_length"] for p in acc))
    ax1.axhline(1.0, linestyle="--", color="grey", label="no speculation (same engine)")
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
