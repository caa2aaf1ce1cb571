"""Where a benchmark's figures go: one JSON line per run in benchmarks/results/<bench>.jsonl, with the date, the
checkout and the machine, so that scripts/timings.py can write docs/timings.md from them (never by hand)."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def checkout() -> str:
    """The commit measured, short, with ``+dirty`` when the product in the working tree differs from it (the benchmarks
    themselves do not count), "-" outside git."""
    product = ["--", ".", ":!benchmarks"]
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", *product], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return rev + ("+dirty" if dirty else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "-"


def record(bench: str, rows: list[dict[str, Any]], note: str = "", path: str | None = None) -> Path | None:
    """Append one run of ``bench`` (its table: ``rows``, flat dicts of short names to numbers or short strings) to its
    results file; EAGLE3_BENCH_RECORD=0 or an empty ``path`` keeps nothing. Returns the file written."""
    if os.environ.get("EAGLE3_BENCH_RECORD") == "0" or path == "":
        return None
    out = Path(path) if path else RESULTS / f"{bench}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    date = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    rows = [{k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()} for row in rows]
    entry = {"bench": bench, "date": date, "checkout": checkout(), "cores": os.cpu_count(), "cpu": cpu_model(),
             "note": note, "rows": rows}  # fmt: skip
    with out.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry, sort_keys=False) + "\n")
    print(f"recorded in {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return out
