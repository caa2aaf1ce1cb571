#!/usr/bin/env python3
"""Write docs/timings.md from the benchmarks' recorded runs (benchmarks/results/*.jsonl): one table per benchmark,
newest run first, one line per row of a run, short cells. ``--check`` exits 1 when docs/timings.md is not what the
records give (a test runs it, so the file is never edited by hand).

Usage: python scripts/timings.py [--check] [--results benchmarks/results] [--out docs/timings.md]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
HEAD = """# Measured times

Written by `scripts/timings.py` from `benchmarks/results/*.jsonl` (each benchmark appends one line per run, with its
date, checkout and machine); do not edit by hand. Rerun a benchmark, then `python scripts/timings.py`. Older figures,
measured before the benchmarks recorded their runs, are in `benchmarks/results/history.jsonl`, transcribed from the
README and this file of the checkout each names. `cores` is the machine's core count, `cpu` its model.
"""
SEP = " | "


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}" if abs(value) < 1 else f"{value:.1f}"
    return str(value).replace("|", "/").replace("\n", " ")


def load(results: Path) -> dict[str, list[dict[str, Any]]]:
    """Every recorded run, by benchmark, newest first (the order of the lines within a file breaks ties)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(results.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except ValueError as exc:
                raise SystemExit(f"{path}:{number} is not JSON ({exc}): fix or remove that line.") from None
            entry["_order"] = number
            runs.setdefault(str(entry.get("bench") or path.stem), []).append(entry)
    for entries in runs.values():
        entries.sort(key=lambda e: (str(e.get("date", "")), e["_order"]), reverse=True)
    return runs


def table(entries: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for entry in entries:
        for row in entry.get("rows") or [{}]:
            keys += [k for k in row if k not in keys]
    head = ["date", "checkout", "cores", *keys, "note"]
    lines = ["| " + SEP.join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    for entry in entries:
        for row in entry.get("rows") or [{}]:
            values = [entry.get("date"), entry.get("checkout"), entry.get("cores"), *(row.get(k) for k in keys),
                      entry.get("note")]  # fmt: skip
            lines.append("| " + SEP.join(cell(v) for v in values) + " |")
    return lines


def render(results: Path) -> str:
    runs = load(results)
    out = [HEAD]
    for bench in sorted(runs, key=lambda b: (b == "history", b)):
        entries = runs[bench]
        cpus = sorted({str(e.get("cpu")) for e in entries if e.get("cpu") and e.get("cpu") != "-"})
        out += [f"## {bench}", ""]
        if cpus:
            out += [f"Machines: {'; '.join(cpus)}.", ""]
        out += [*table(entries), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when the file differs from what the records give")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--out", default=str(ROOT / "docs" / "timings.md"))
    args = ap.parse_args()
    text = render(Path(args.results))
    out = Path(args.out)
    if args.check:
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            print(f"{out} is not what {args.results} gives: run python scripts/timings.py", file=sys.stderr)
            return 1
        return 0
    out.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
