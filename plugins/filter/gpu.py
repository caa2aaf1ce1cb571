"""Filters for GPU facts: parse nvidia-smi CSV queries into typed records."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.eagle3.ops.plugins.module_utils._smi import SMI_GPU_FIELDS, smi_argv, smi_rows

# The fields gpu_facts reads, in query order (nvidia-smi --help-query-gpu names them): eagle3_status's too.
GPU_FIELDS = SMI_GPU_FIELDS


def nvidia_smi_query(nvidia_smi: str, fields: list[str] | None = None) -> list[str]:
    """The argv of gpu_facts' read, one CSV row per GPU (``nvidia_smi_csv`` parses it): one home for the role's own
    read and for a fingerprint check that takes it in the same call (deploy.yml's setting switch)."""
    return smi_argv([str(nvidia_smi)], fields or GPU_FIELDS)


def nvidia_smi_csv(text: str, fields: list[str] | str | None = None) -> list[dict[str, Any]]:
    """Rows of ``--query-...=FIELDS --format=csv,noheader,nounits`` output as typed dicts.

    Keys are the field names with dots as underscores (``memory.used`` -> ``memory_used``), so Jinja's
    attribute lookups (``selectattr('memory_used', ...)``) work on them.
    """
    fields = GPU_FIELDS if fields is None else fields
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
    """One line for a systemd unit gpu_cleanup stops or leaves running, with its restart policy and why (and whether
    it is, or would be, disabled so that it does not start again at the next boot)."""
    restart = f" (Restart={entry['restart']})" if entry.get("restart") else ""
    boot = ""
    if entry.get("boot") and entry.get("action") in ("stop", "stopped", "inactive"):
        boot = (", and disabled: it started at boot" if entry.get("disabled")
                else ", and disable it: it starts at boot")  # fmt: skip
    return f"{entry.get('action')} {entry.get('unit')}{restart}: {entry.get('why')}{boot}"


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_smi_csv": nvidia_smi_csv, "nvidia_smi_query": nvidia_smi_query,
                "gpu_process_line": gpu_process_line, "gpu_unit_line": gpu_unit_line}  # fmt: skip
