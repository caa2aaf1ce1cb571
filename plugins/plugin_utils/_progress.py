# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Progress lines for the long waits of the eagle3.ops roles, from what one poll printed, and the fleet's status table.

Shared by the eagle3.ops.progress stdout callback (plain ansible-playbook) and the eagle3-ops CLI, so both
show the same line: training epochs with tokens/s and power from the monitor's JSON sample, regeneration
and extraction counts from a data job's last line; and the same table after status.yml. Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any


def progress_bar(done: float, total: float, width: int = 24) -> str:
    frac = 0.0 if total <= 0 else max(0.0, min(1.0, done / total))
    filled = round(frac * width)
    return f"[{'#' * filled}{'.' * (width - filled)}] {frac:4.0%}"


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


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
            eta = (f", ETA epoch {_hours(s['eta_epoch_s'])}, run {_hours(s['eta_s'])}"
                   if s.get("eta_s") is not None else "")  # fmt: skip
            return (f"{progress_bar(s['epoch'] - 1, s['epochs'])} epoch {s['epoch']}/{s['epochs']} "
                    f"step {s.get('step', '-')}{tps}{eta} (attempt {s.get('attempt')}, "
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


def status_table_rows(records: Iterable[Mapping[str, Any]], unreachable: Iterable[str] = (), failed: Iterable[str] = (),
                      nodes: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:  # fmt: skip
    """The status table's rows: one per host that answered (eagle3_status's set_stats records, as the filter
    status_rows makes them), and one per host that could not be reached or whose read failed, so that a fleet-wide
    status names every host it could not read; each with its Proxmox node where ``nodes`` (the filter status_nodes)
    names one."""
    rows: dict[str, dict[str, Any]] = {host: {"state": "unreachable"} for host in unreachable}
    rows.update({host: {"state": "failed"} for host in failed if host not in rows})
    rows.update({record["host"]: {**record, "state": "running"} for record in records})
    for host, node in (nodes or {}).items():
        if host in rows:
            rows[host]["node"] = node
    return rows


def served_cell(serving: Mapping[str, Any]) -> str:
    """What a server serves: the draft and its draft tokens, the accept length since it started, the live one over
    SGLang's last log interval and its tokens per second (its /metrics), and the gate's figure at deploy."""
    if not serving:
        return "-"

    def number(key: str) -> float | None:
        value = serving.get(key)
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    parts = str(serving.get("draft") or "no draft").rstrip("/").rsplit("/", 2)
    name = parts[-1]
    if len(parts) > 1 and re.fullmatch(r"[0-9a-f]{16}", name):  # an immutable version: its root's name and its own
        name = f"{parts[-2]}@{name[:8]}"
    cell = f"{name} x{serving.get('draft_tokens') or '-'}"
    figures = [(label, number(key)) for label, key in (("accept", "accept_length"), ("live", "live_accept_length"),
                                                       ("gate", "gate_accept_length"))]  # fmt: skip
    cell += "".join(f" {label} {value:.2f}" for label, value in figures if value is not None)
    tps = number("tokens_per_s")
    return cell + (f" {tps:.0f} tok/s" if tps is not None else "")


def render_status(rows: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per container: its node (a column only where some row names one), state, GPUs (memory used/total,
    power, utilisation), training job, served draft; then each router's view of its servers."""
    width = max((len(str(row.get("node") or "")) for row in rows.values()), default=0)
    node_width = max(width + 2, 12) if width else 0

    def node_of(row: Mapping[str, Any]) -> str:
        return f"{row.get('node') or '-':<{node_width}}" if node_width else ""

    header = (f"{'HOST':<16}{node_of({'node': 'NODE'})}{'STATE':<13}{'GPUS':>5}  {'MEMORY USED/TOTAL':<22}"
              f"{'POWER':<14}{'UTIL':<7}{'TRAINING':<44}SERVING")  # fmt: skip
    lines = [header]
    for host in sorted(rows):
        row = rows[host]
        gpus = row.get("gpus") or []
        used = sum(g.get("memory_used") or 0 for g in gpus)
        total = sum(g.get("memory_total") or 0 for g in gpus)
        power = sum(g.get("power_draw") or 0 for g in gpus)
        limit = sum(g.get("power_limit") or 0 for g in gpus)
        util = sum(g.get("utilization_gpu") or 0 for g in gpus) / len(gpus) if gpus else 0
        train = row.get("training") or {}
        job = "-"
        if train:
            where = (f" epoch {train['epoch']}/{train['epochs']} step {train.get('step', '-')}"
                     if train.get("epochs") else "")  # fmt: skip
            state = "done" if train.get("result") else train.get("cause")
            job = f"#{train.get('attempt', train.get('n'))} seq {train.get('total_seq_len')} {state}{where}"
        served = served_cell(row.get("serving") or {})
        memory = f"{used / 1024:.1f}/{total / 1024:.1f} GiB" if gpus else "-"
        watts = f"{power:.0f}/{limit:.0f} W" if gpus else "-"
        count = len(gpus) if row["state"] == "running" else "-"  # a host not read has GPUs nobody counted
        lines.append(f"{host:<16}{node_of(row)}{row['state']:<13}{count:>5}  {memory:<22}{watts:<14}"
                     f"{(f'{util:.0f}%' if gpus else '-'):<7}{job:<44}{served}")  # fmt: skip
    for host in sorted(h for h in rows if (rows[h].get("serving") or {}).get("drift_warning")):
        lines.append(f"WARNING: {host} {rows[host]['serving']['drift_warning']}")
    for host in sorted(h for h in rows if rows[h].get("router") is not None):
        workers = rows[host]["router"]
        lines.append(f"router on {host}: {len(workers)} server(s)" + "".join(
            f"\n  {w.get('url')}  {'healthy' if w.get('healthy') else 'UNHEALTHY'}  {w.get('status') or '-'}  "
            f"load {w.get('load') if w.get('load') is not None else '-'}" for w in workers))  # fmt: skip
    return "\n".join(lines)
