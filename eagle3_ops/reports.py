"""Benchmark reports on the controller: JSON, a markdown table and a PNG plot.

Input: the list of benchmark points ``bench.yml`` collects, one per (configuration, concurrency), each with
``label`` ("baseline" or the draft tokens), ``draft_tokens`` (null for the baseline), ``max_concurrency`` and
the client's fields (``output_throughput``, ``median_ttft_ms``, ``p99_ttft_ms``, ``median_itl_ms``,
``p99_itl_ms``, ``accept_length``). The speedup column divides each point's throughput by the baseline's at
the same concurrency, measured in the same sweep.

Usage: python -m eagle3_ops.reports bench --results points.json --out reports/bench-<stamp>
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else (f"{value:.{digits}f}" if isinstance(value, (int, float)) else str(value))


def speedups(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each speculative point against the baseline of the same engine at the same concurrency (a ratio across
    engines would measure the engines, not the drafter)."""
    base = {(p["max_concurrency"], p.get("engine")): p["output_throughput"] for p in points
            if p.get("draft_tokens") is None}  # fmt: skip
    out = []
    for p in points:
        b = base.get((p["max_concurrency"], p.get("engine")))
        out.append({**p, "speedup": round(p["output_throughput"] / b, 3) if b and p.get("draft_tokens") else None})
    return out


def markdown(points: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table, from the collection's templates/bench-report.md.j2 (the layout lives with the other templates)."""
    import jinja2

    templates = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "templates")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, autoescape=False)  # noqa: S701 -- markdown, not HTML
    env.filters["num"] = _fmt
    order = sorted(points, key=lambda p: (p.get("draft_tokens") or 0, p["max_concurrency"]))
    rows = [{**p, "label": "baseline" if p.get("draft_tokens") is None else str(p["draft_tokens"])} for p in order]
    return env.get_template("bench-report.md.j2").render(points=rows, meta=meta)


def plot(points: list[dict[str, Any]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for conc in sorted({p["max_concurrency"] for p in points}):
        spec = sorted((p for p in points if p["max_concurrency"] == conc and p.get("draft_tokens")),
                      key=lambda p: p["draft_tokens"])  # fmt: skip
        if spec:
            line = ax1.plot([p["draft_tokens"] for p in spec], [p["output_throughput"] for p in spec], marker="o",
                            label=f"concurrency {conc}")[0]  # fmt: skip
            base = [p for p in points if p["max_concurrency"] == conc and p.get("draft_tokens") is None]
            if base:
                ax1.axhline(base[0]["output_throughput"], linestyle="--", color=line.get_color(), alpha=0.6)
            acc = [p for p in spec if p.get("accept_length") is not None]
            ax2.plot([p["draft_tokens"] for p in acc], [p["accept_length"] for p in acc], marker="o",
                     color=line.get_color(), label=f"concurrency {conc}")  # fmt: skip
    ax1.set(xlabel="draft tokens", ylabel="output tokens/s", title="Throughput (dashed: no speculation)")
    ax2.set(xlabel="draft tokens", ylabel="accept length (tokens/step)", title="Accept length")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def bench_report(points: list[dict[str, Any]], out_dir: str, meta: dict[str, Any] | None = None) -> dict[str, str]:
    if not points:
        raise ValueError("no benchmark points: nothing to report")
    meta = meta or {}
    points = speedups(points)
    os.makedirs(out_dir, exist_ok=True)
    paths = {k: os.path.join(out_dir, f"bench.{k}") for k in ("json", "md", "png")}
    with open(paths["json"], "w", encoding="utf-8") as fh:
        json.dump({"meta": meta, "points": points}, fh, indent=1)
    with open(paths["md"], "w", encoding="utf-8") as fh:
        fh.write(markdown(points, meta))
    plot(points, paths["png"], f"EAGLE-3: {meta.get('target', '')}")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="eagle3_ops.reports", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="kind", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--results", required=True, help="JSON: {meta: {...}, points: [...]} or a list of points")
    b.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    with open(args.results, encoding="utf-8") as fh:
        data = json.load(fh)
    points, meta = (data, {}) if isinstance(data, list) else (data["points"], data.get("meta", {}))
    try:
        paths = bench_report(points, args.out, meta)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 1
    print(json.dumps(paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
