# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress lines for the long waits of the eagle3.ops roles, from what one poll printed.

Shared by the eagle3.ops.progress stdout callback (plain ansible-playbook) and the eagle3-ops CLI, so both
show the same line: training epochs with tokens/s and power from the monitor's JSON sample, regeneration
and extraction counts from a data job's last line. Standard library only.
"""

from __future__ import annotations

import json


def progress_bar(done: float, total: float, width: int = 24) -> str:
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, done / total))
    filled = round(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {frac:4.0%}"


def wait_line(stdout: str) -> str | None:
    """A progress line for a poll of a long stage: training epochs (the monitor's JSON sample) or a data job."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    sample = next((line for line in reversed(lines) if line.startswith("{")), None)
    if sample:
        try:
            s = json.loads(sample)
        except ValueError:
            s = {}
        if s.get("epochs"):
            gpus = s.get("gpus") or []
            power = sum(g.get("power_draw") or 0 for g in gpus)
            limit = sum(g.get("power_limit") or 0 for g in gpus)
            extra = f" {power:.0f}/{limit:.0f} W" if gpus else ""
            tps = f" {s['tokens_per_s']:.0f} tok/s" if s.get("tokens_per_s") else ""
            return (f"{progress_bar(s['epoch'] - 1, s['epochs'])} epoch {s['epoch']}/{s['epochs']} "
                    f"step {s.get('step', '-')}{tps} (attempt {s.get('attempt')}, "
                    f"total_seq_len {s.get('total_seq_len')}){extra}")  # fmt: skip
        if s.get("attempt"):
            return f"attempt {s['attempt']}, total_seq_len {s.get('total_seq_len')}: starting"
    tail = lines[-1] if lines else ""
    if tail.startswith("[") and "/" in tail:  # "[regen] 40/160 (8.4/s)", "[hidden] 150/160 ..."
        head, _unused, rest = tail.partition(" ")
        done, _unused, total = rest.split(" ")[0].partition("/")
        if done.isdigit() and total.isdigit():
            return f"{progress_bar(int(done), int(total))} {head} {rest}"
    return None
