#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: gpu_cleanup
short_description: Free GPUs by stopping exactly the processes that hold them, gracefully, and verify
description:
  - Finds GPU holders from C(/proc/*/fd) links to C(/dev/nvidia*) (works in any PID namespace), joined
    with C(nvidia-smi --query-compute-apps) for memory where its PIDs map.
  - Stops them with a ladder, optionally stopping a systemd unit first, then SIGTERM to each job's root
    (a torchrun-like agent, so it cannot restart workers) and to each holder's process group, C(grace)
    seconds, then SIGKILL to whatever selected process is left, inherited-fd orphans included, after
    checking its PID was not reused.
  - Never touches processes that hold no GPU (unless O(include_non_gpu)), allow-listed daemons
    (nvidia-persistenced, nv-hostengine, dcgm-exporter, Xorg), or the module's own process tree.
  - Verifies within O(timeout) that every selected GPU is at or below O(free_threshold_mib) and no selected
    holder is left; otherwise fails listing the survivors with their state (D-state, zombie) and memory.
  - Refuses to stop anything while a file in O(require_paths) is missing or incomplete (the job may still be
    writing its last checkpoint), unless O(force).
version_added: "0.1.0"
author: eagle3-ops
options:
  gpus:
    description: GPU indices or UUIDs to free. Default, every GPU.
    type: list
    elements: str
    default: []
  match:
    description: Regular expressions; only holders whose command line matches one are stopped.
    type: list
    elements: str
    default: []
  exclude:
    description:
      - Process names (exact) or regular expressions (on the command line) never to stop. The default protects
        the NVIDIA and DCGM daemons and X; the module's own process tree is always protected.
    type: list
    elements: str
    default: [nvidia-persistenced, nv-hostengine, dcgm-exporter, dcgmi, Xorg, X, nvidia-smi]
  include_non_gpu:
    description: Also stop processes that match O(match) but hold no GPU (needs O(match)).
    type: bool
    default: false
  stop_unit:
    description: A systemd unit to stop first (the supervised training job), so it is not restarted.
    type: str
  grace:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 10
  timeout:
    description: Seconds to wait, after SIGKILL, for the GPUs to be free.
    type: float
    default: 30
  free_threshold_mib:
    description: A GPU counts as free at or below this memory.used (an idle GPU still reports a few MiB).
    type: int
    default: 512
  require_paths:
    description:
      - Files that must exist and be complete (C(.safetensors) headers valid, C(.json) parseable, nothing empty)
        before anything is stopped, e.g. the final epoch's model.safetensors and config.json.
    type: list
    elements: path
    default: []
  force:
    description: Stop the holders even when O(require_paths) are not complete.
    type: bool
    default: false
  nvidia_smi:
    description: The nvidia-smi command (a path, or a command line split on spaces).
    type: str
    default: nvidia-smi
  device_dir:
    description: Where the NVIDIA device nodes live.
    type: path
    default: /dev
attributes:
  check_mode:
    support: full
    details: Reports exactly the holders it would signal and changes nothing.
  diff_mode:
    support: none
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Free the GPUs of a finished training job, checkpoint guard on
  gpu_cleanup:
    stop_unit: eagle3-train.service
    match: ['speculators\.train', 'torchrun']
    require_paths:
      - /srv/train/run/4/model.safetensors
      - /srv/train/run/4/config.json

- name: Free GPUs 2 and 3 only, whoever holds them (daemons excepted)
  gpu_cleanup:
    gpus: ["2", "3"]
    grace: 5
"""

RETURN = r"""
holders:
  description: The selected holders before anything was signalled.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 102, pgid: 102, sid: 102, state: S, cmdline: python3 -m speculators.train, gpus: [0]}]
roots:
  description: Job roots (agents) stopped first; they hold no GPU themselves.
  returned: always
  type: list
  elements: dict
spared:
  description: Holders left alone (allow-listed, other GPUs, not matching).
  returned: always
  type: list
  elements: dict
signalled:
  description: PIDs sent SIGTERM.
  returned: always
  type: list
  elements: int
killed:
  description: PIDs sent SIGKILL after the grace period.
  returned: always
  type: list
  elements: int
survivors:
  description: Selected processes still alive, with their state and memory (empty on success).
  returned: always
  type: list
  elements: dict
gpus_before:
  description: Per-GPU memory before (index, uuid, memory_used, memory_total).
  returned: always
  type: list
  elements: dict
gpus_after:
  description: Per-GPU memory after.
  returned: always
  type: list
  elements: dict
freed_mib:
  description: Memory freed on the selected GPUs.
  returned: always
  type: int
"""

import shlex
import subprocess
import time
import traceback

from ansible.module_utils._gpu import (
    DEFAULT_EXCLUDE,
    alive,
    app_memory,
    check_complete,
    gpu_memory,
    kill,
    read_stat,
    resolve_gpus,
    scan,
    select,
    state_word,
    terminate,
    wait_gone,
)
from ansible.module_utils.basic import AnsibleModule


def _stop_unit(module: AnsibleModule, unit: str, timeout: float) -> bool:
    """systemctl stop UNIT; True when it was active. Missing systemd is an error only if a unit is named."""
    active = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False).returncode == 0
    if not active:
        return False
    proc = subprocess.run(
        ["systemctl", "stop", unit], capture_output=True, text=True, timeout=max(timeout, 10), check=False
    )
    if proc.returncode != 0:
        module.fail_json(msg=f"systemctl stop {unit} failed ({proc.stderr.strip()}): check the unit's ExecStop.")
    return True


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gpus": {"type": "list", "elements": "str", "default": []},
            "match": {"type": "list", "elements": "str", "default": []},
            "exclude": {"type": "list", "elements": "str", "default": list(DEFAULT_EXCLUDE)},
            "include_non_gpu": {"type": "bool", "default": False},
            "stop_unit": {"type": "str"},
            "grace": {"type": "float", "default": 10},
            "timeout": {"type": "float", "default": 30},
            "free_threshold_mib": {"type": "int", "default": 512},
            "require_paths": {"type": "list", "elements": "path", "default": []},
            "force": {"type": "bool", "default": False},
            "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
            "device_dir": {"type": "path", "default": "/dev"},
        },
        supports_check_mode=True,
    )
    p = module.params
    result: dict = {
        "changed": False, "holders": [], "roots": [], "spared": [], "signalled": [], "killed": [],
        "survivors": [], "gpus_before": [], "gpus_after": [], "freed_mib": 0, "unit_stopped": False,
    }  # fmt: skip
    for name in ("grace", "timeout"):
        if p[name] < 0:
            module.fail_json(msg=f"{name} must be 0 or more seconds, not {p[name]}.", **result)
    if p["include_non_gpu"] and not p["match"]:
        module.fail_json(msg="include_non_gpu needs match patterns, or it would stop every process.", **result)
    smi = shlex.split(p["nvidia_smi"])
    try:
        before = gpu_memory(smi)
        result["gpus_before"] = before or []
        procs = scan(dev_dir=p["device_dir"])
        try:
            wanted = resolve_gpus(p["gpus"], before)
        except ValueError as exc:
            module.fail_json(msg=f"{exc}: list indices from 'nvidia-smi -L'.", **result)
        mem = app_memory(smi)
        for q in procs.values():
            q.memory_mib = mem.get(q.pid)
        sel = select(procs, wanted, p["match"], p["exclude"], p["include_non_gpu"])
        result["holders"] = [h.describe() for h in sel.holders]
        result["roots"] = [r.describe() for r in sel.roots]
        result["spared"] = [s.describe() for s in sel.spared]
        if not sel.holders and not p["stop_unit"]:
            result["gpus_after"] = result["gpus_before"]
            module.exit_json(**result)

        if sel.holders and not p["force"]:
            problems = [why for why in map(check_complete, p["require_paths"]) if why]
            if problems:
                module.fail_json(
                    msg=f"Refusing to stop {len(sel.holders)} GPU holders: {'; '.join(problems)}; the job may still be "
                    "writing its last checkpoint, so wait for it or set force: true.",
                    **result,
                )
        if module.check_mode:
            result["changed"] = bool(sel.holders)
            result["signalled"] = sorted({q.pid for q in [*sel.roots, *sel.holders]})
            module.exit_json(**result)

        if p["stop_unit"]:
            result["unit_stopped"] = _stop_unit(module, p["stop_unit"], p["timeout"])
        targets = [*sel.roots, *sel.holders]
        result["signalled"] = sorted(terminate(sel, procs))
        left = wait_gone(targets, p["grace"])
        result["killed"] = sorted(kill(left))
        result["changed"] = bool(result["signalled"] or result["killed"] or result["unit_stopped"])

        # Verify: selected holders gone and selected GPUs at or below the threshold, within the timeout.
        deadline = time.monotonic() + p["timeout"]
        while True:
            survivors = [q for q in targets if alive(q)]
            after = gpu_memory(smi)
            busy = [
                g for g in after or []
                if (wanted is None or g["index"] in wanted) and g["memory_used"] > p["free_threshold_mib"]
            ]  # fmt: skip
            if (not survivors and not busy) or time.monotonic() >= deadline:
                break
            if survivors:
                kill(survivors)  # a holder that came back from SIGSTOP or was mid-fork
            time.sleep(0.2)
        result["gpus_after"] = after or []
        selected = [g for g in before or [] if wanted is None or g["index"] in wanted]
        used_after = {g["index"]: g["memory_used"] for g in after or []}
        result["freed_mib"] = sum(max(0, g["memory_used"] - used_after.get(g["index"], 0)) for g in selected)
        zombies = {q.pid for q in survivors}
        leftover_holders = [
            q.describe() for q in scan(dev_dir=p["device_dir"]).values()
            if q.pid in zombies or (q.holds_gpu and q.pid in {h.pid for h in sel.holders})
        ]  # fmt: skip
        for q in survivors:
            st = read_stat(q.pid)
            q.state = st[0] if st else q.state
        result["survivors"] = [{**q.describe(), "state": state_word(q.state)} for q in survivors] or leftover_holders
        if survivors or busy:
            parts = [
                f"pid {q.pid} ({state_word(q.state)}, {q.memory_mib or '?'} MiB) {q.cmdline[:80]}" for q in survivors
            ]
            parts += [f"GPU {g['index']} still uses {g['memory_used']} MiB" for g in busy]
            module.fail_json(
                msg=f"GPUs are not free after {p['grace'] + p['timeout']:.0f} s: {'; '.join(parts)}; processes in "
                "D state or zombies wait on the driver, so check dmesg and, if they persist, reset the GPU.",
                **result,
            )
    except Exception as exc:  # the unexpected gets a traceback
        module.fail_json(msg=f"gpu_cleanup failed unexpectedly: {exc}", exception=traceback.format_exc(), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
