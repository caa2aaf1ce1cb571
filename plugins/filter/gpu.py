"""Filters for GPU facts: parse nvidia-smi CSV queries into typed records."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.eagle3.ops.plugins.module_utils._gpu import smi_rows


def nvidia_smi_csv(text: str, fields: list[str] | str) -> list[dict[str, Any]]:
    """Rows of ``--query-...=FIELDS --format=csv,noheader,nounits`` output as typed dicts.

    Keys are the field names with dots as underscores (``memory.used`` -> ``memory_used``), so Jinja's
    attribute lookups (``selectattr('memory_used', ...)``) work on them.
    """
    names = [f.strip() for f in (fields.split(",") if isinstance(fields, str) else fields) if f.strip()]
    try:
        return smi_rows(text, names)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from exc


def gpu_process_line(entry: dict[str, Any]) -> str:
    """One line for a process gpu_cleanup stops or spares: PID, GPUs, MiB, command, why."""
    gpus = entry.get("gpus") or []
    where = f"GPU {','.join(map(str, gpus))}" if gpus else "no GPU"
    mib = f" {entry['memory_mib']} MiB" if entry.get("memory_mib") else ""
    role = f" [{entry['role']}]" if entry.get("role") else ""
    cmd = str(entry.get("cmdline") or "")[:80]
    why = entry.get("reason") or entry.get("why") or ""
    return f"pid {entry.get('pid')}{role} {where}{mib}: {cmd} -- {why}".rstrip()


def gpu_unit_line(entry: dict[str, Any]) -> str:
    """One line for a systemd unit gpu_cleanup stops or leaves running, with its restart policy and why."""
    restart = f" (Restart={entry['restart']})" if entry.get("restart") else ""
    return f"{entry.get('action')} {entry.get('unit')}{restart}: {entry.get('why')}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_smi_csv": nvidia_smi_csv, "gpu_process_line": gpu_process_line,
                "gpu_unit_line": gpu_unit_line}  # fmt: skip
