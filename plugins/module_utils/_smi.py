# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia-smi's CSV queries, run and typed: what eagle3_status, gpu_facts' filter and gpu_cleanup read of the GPUs.

A module of its own, standard library only and small: eagle3_status runs on every container of a fleet-wide status,
and its module carries this file, not the whole of the cleanup's process logic (_gpu.py).
"""

from __future__ import annotations

import subprocess
from typing import Any

SMI_INT_FIELDS = frozenset({"index", "memory.used", "memory.total", "memory.free", "memory.reserved",
                            "utilization.gpu", "utilization.memory", "temperature.gpu", "pid", "used_memory",
                            "used_gpu_memory", "count"})  # fmt: skip
SMI_FLOAT_FIELDS = frozenset({"power.draw", "power.limit"})
SMI_MISSING = ("[N/A]", "N/A", "[Not Supported]", "[Unknown Error]")
# What gpu_facts and eagle3_status read of each GPU, in query order.
SMI_GPU_FIELDS = ["index", "uuid", "name", "memory.used", "memory.total", "power.draw", "power.limit",
                  "utilization.gpu"]  # fmt: skip


def smi_value(field: str, value: str) -> Any:
    """One nvidia-smi CSV value, typed (ints, floats; None for N/A); ValueError names a non-numeric one."""
    if value in SMI_MISSING:
        return None
    try:
        if field in SMI_INT_FIELDS:
            return int(float(value))
        if field in SMI_FLOAT_FIELDS:
            return float(value)
    except ValueError:
        raise ValueError(f"nvidia-smi field {field} has the non-numeric value {value!r}") from None
    return value


def smi_rows(text: str, fields: list[str]) -> list[dict[str, Any]]:
    """Rows of ``--query-...=FIELDS --format=csv,noheader,nounits`` output as dicts keyed memory_used etc."""
    rows = []
    for line in str(text).splitlines():
        if not line.strip():
            continue
        values = [v.strip() for v in line.split(", ")]
        if len(values) != len(fields):
            raise ValueError(f"nvidia-smi printed {len(values)} columns where {len(fields)} were queried ({line!r}): "
                             "query with --format=csv,noheader,nounits")  # fmt: skip
        rows.append({n.replace(".", "_"): smi_value(n, v) for n, v in zip(fields, values, strict=True)})
    return rows


def smi_argv(nvidia_smi: list[str], fields: list[str] | str, query: str = "query-gpu") -> list[str]:
    """The argv of one nvidia-smi CSV query, without header and units: the form smi_rows and run_smi read."""
    names = fields if isinstance(fields, str) else ",".join(fields)
    return [*nvidia_smi, f"--{query}={names}", "--format=csv,noheader,nounits"]


def run_smi(nvidia_smi: list[str], query: str, fields: str) -> list[list[str]] | None:
    """Rows of an nvidia-smi CSV query, or None when nvidia-smi cannot answer."""
    try:
        proc = subprocess.run(
            smi_argv(nvidia_smi, fields, query),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [[c.strip() for c in line.split(",")] for line in proc.stdout.splitlines() if line.strip()]


def gpu_memory(nvidia_smi: list[str]) -> list[dict[str, Any]] | None:
    rows = run_smi(nvidia_smi, "query-gpu", "index,uuid,memory.used,memory.total")
    if rows is None:
        return None
    out = []
    for r in rows:
        try:
            out.append({"index": int(r[0]), "uuid": r[1], "memory_used": int(r[2]), "memory_total": int(r[3])})
        except (ValueError, IndexError):
            continue
    return out


def app_memory(nvidia_smi: list[str]) -> dict[int, int]:
    """PID -> MiB from --query-compute-apps, summed over GPUs (nothing when idle or when PIDs do not map)."""
    rows = run_smi(nvidia_smi, "query-compute-apps", "gpu_uuid,pid,used_memory") or []
    out: dict[int, int] = {}
    for r in rows:
        try:
            out[int(r[1])] = out.get(int(r[1]), 0) + int(r[2])
        except (ValueError, IndexError):
            continue
    return out
