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
  - Stops them with a ladder, stopping the systemd units that run the jobs first (O(stop_unit), C(auto) finds
    them from the holders' cgroups), then SIGTERM to each job's root (a torchrun-like agent, so it cannot restart
    workers), to every process between the root and the holders (a C(while true; do python train.py; done) loop
    would start them again) and to each holder's process group, C(grace) seconds, then SIGKILL to whatever
    selected process is left, inherited-fd orphans included, after checking its PID was not reused. A holder the
    job's own processes start again during the wait is stopped too.
  - Check mode, and the result of every run, list each process that is (or would be) stopped in RV(targets) with
    its PID, command, GPUs, MiB and why, and each unit in RV(units).
  - Never touches processes that hold no GPU (unless O(include_non_gpu)), allow-listed daemons
    (nvidia-persistenced, nv-hostengine, dcgm-exporter, Xorg), or the module's own process tree.
  - A job's root is never a person's session. An interactive or login shell, a terminal multiplexer pane or a
    login session above the job is recognised from kernel facts (controlling terminal, session leadership,
    the C(-) login prefix, the shell's interactive flags, a terminal on stdin), left alone and reported in
    RV(spared_ancestors) with the reason; the job's own agent or launcher script is stopped first instead.
  - Holders that keep device nodes open without a compute context (monitoring and NVML exporters, 0 MiB,
    absent from C(--query-compute-apps)) are observers, spared unless O(include_observers).
  - Verifies within O(timeout) that every selected GPU is at or below O(free_threshold_mib) and no selected
    holder is left; otherwise scans again and fails naming who holds the memory now -- a new PID is a
    restart (its parent is named), a survivor is listed with its state (D-state, zombie), a spared process
    with the reason it was spared.
  - Refuses to stop anything while a file in O(require_paths) is missing or incomplete (the job may still be
    writing its last checkpoint), unless O(force).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
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
  include_observers:
    description:
      - Also stop observers, holders of device nodes with no compute context (an NVML exporter, a monitor).
    type: bool
    default: false
  stop_unit:
    description:
      - A systemd unit to stop first (the supervised training job), so it is not restarted; a unit enabled to start
        at boot is disabled too (the playbook that starts the job enables it again).
      - C(auto) stops every service unit that runs a selected job, read from the holders' C(/proc/PID/cgroup),
        whose main process is part of that job (the holder, its root or the chain between them); a unit whose
        main process is not (C(ssh.service) above a job started from a login, C(cron.service)) is named in
        RV(units) and left running.
    type: str
  grace:
    description: Seconds between SIGTERM and SIGKILL.
    type: float
    default: 10
  timeout:
    description: Seconds to wait, after SIGKILL, for the GPUs to be free.
    type: float
    default: 30
  settle:
    description:
      - Seconds the GPUs must stay free before the cleanup counts as done, within O(timeout). A supervisor that
        restarts its workers (torchrun's agent, a unit with C(Restart=)) frees the memory for a moment only.
    type: float
    default: 2
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
  require_paths_optional:
    description:
      - Guard only the O(require_paths) whose directory exists (a checkpoint directory that was never made guards
        nothing); a missing or incomplete file in an existing directory still refuses.
    type: bool
    default: false
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
extends_documentation_fragment:
  - eagle3.ops.attributes
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
  description: Holders left alone, each with its C(reason) (allow-listed, other GPUs, not matching).
  returned: always
  type: list
  elements: dict
observers:
  description: Holders with no compute context, left alone (see O(include_observers)), each with its C(reason).
  returned: always
  type: list
  elements: dict
spared_ancestors:
  description:
    - Processes above a job that are a person's session (interactive or login shell, multiplexer pane, login
      session), never signalled, each with the C(reason) the kernel's facts gave.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 311, cmdline: bash -i, reason: "interactive shell (bash -i)"}]
targets:
  description:
    - Every process stopped (check mode, that would be stopped), top down, with C(pid), C(cmdline), C(gpus),
      C(memory_mib), C(role) (root, chain or holder) and C(reason).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 311, cmdline: "bash -c while true; do python train.py; done", gpus: [], role: chain,
            reason: "runs between the job root and a holder: a loop there would start it again"}]
units:
  description:
    - The systemd services the selected jobs run in, with C(unit), C(main_pid), C(restart), C(action) (C(stop),
      C(stopped), C(leave)), C(why), C(boot) (the unit is enabled, so it would start again at the next boot; a unit
      that is stopped is disabled first, and C(disabled) says it was) and C(spans) (the hosts of a job over several
      nodes, from C(EAGLE3_TRAIN_HOSTS) in the unit's environment; the gpu_cleanup role stops and disables the unit
      on the others too).
  returned: always
  type: list
  elements: dict
  sample: [{unit: train.service, main_pid: 120, restart: always, action: stopped, why: "its main process is the job"}]
holders_after:
  description: Who holds the busy selected GPUs after the ladder, when memory stayed in use (C(new) marks a restart).
  returned: when the GPUs are not free
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
idle:
  description:
    - Nothing to signal and no unit to stop (in check mode, nothing would be). The gpu_cleanup role skips the real
      pass and the verification of a host whose dry run is idle.
  returned: always
  type: bool
summary:
  description:
    - The counts a fleet-wide summary prints - C(holders), C(signalled), C(killed), C(survivors), C(freed_mib),
      C(observers), C(spared_sessions) -, C(units_stopped) (names) and C(targets).
  returned: always
  type: dict
  sample:
    holders: 0
    signalled: 0
    killed: 0
    survivors: 0
    freed_mib: 0
    observers: 0
    spared_sessions: 0
    units_stopped: []
    targets: []
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._cleanup import ARGUMENT_SPEC, outcome


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    result, msg, trace = outcome(module.params, module.check_mode)
    if msg is not None:
        module.fail_json(msg=msg, **({"exception": trace} if trace else {}), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
