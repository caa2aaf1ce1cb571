#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read what one host runs - its GPUs, its training job, its server - in one module call."""

from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3_status
short_description: Read a host's GPUs, training job and served draft in one call, changing nothing
description:
  - One call per host gathers everything the fleet's status row needs, so a fleet-wide C(status.yml) costs one
    round trip per container; each part that cannot be read is left empty and never fails the host.
  - GPUs from one C(nvidia-smi --query-gpu) (the fields gpu_facts reads); the training job from the payload's
    read-only monitor (C(training.monitor --no-record)) over its state directory; the server from SGLang's
    C(/get_server_info); on the router's host, the router's C(/workers).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  nvidia_smi:
    description: The nvidia-smi command, as a list of words.
    type: list
    elements: str
    default: [nvidia-smi]
  train_state:
    description: The training job's state directory (attempts.json); nothing is read when it does not exist.
    type: path
  python:
    description: The payload runtime's Python that runs the monitor.
    type: path
  payload_dir:
    description: The directory holding the training payload.
    type: path
  server_url:
    description: Base URL of the host's server, asked for C(/get_server_info); empty reads no server.
    type: str
    default: ""
  router_url:
    description: Base URL of SGLang's router on this host, asked for C(/workers); empty reads no router.
    type: str
    default: ""
  timeout:
    description: Seconds each read may take.
    type: float
    default: 5
  served_record:
    description:
      - The record the server's last deploy left (O(eagle3.ops.sglang_service#module:record)), whose accept length -
        the gate's figure at deploy time - the live one is compared with.
    type: path
  accept_drift_percent:
    description: How far below the gate's figure (in percent) the live accept length may fall before a warning.
    type: float
    default: 15
  api_key:
    description: The server's API key (SGLang's C(--api-key)), sent with the server-info read. Never logged.
    type: str
  admin_key:
    description: The router's control-plane admin key, sent with the C(/workers) read. Never logged.
    type: str
attributes:
  check_mode:
    description: Reads the same in check mode.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
notes:
  - Read-only; C(changed) is always false.
  - A server or router that refuses the key it was sent (or asks for one) reads as one that does not answer.
"""

EXAMPLES = r"""
- name: Read the host's status
  eagle3.ops.eagle3_status:
    train_state: /srv/eagle3/runs/tiny-llama/train/state
    python: /opt/eagle3-ops/venv/bin/python
    payload_dir: /opt/eagle3-ops/payloads
    server_url: http://127.0.0.1:30000
"""

RETURN = r"""
gpus:
  description: One record per GPU (index, uuid, name, memory_used, memory_total, power_draw, power_limit,
    utilization_gpu), as gpu_facts_gpus; empty when nvidia-smi cannot be read (see gpus_read).
  returned: always
  type: list
  elements: dict
gpus_read:
  description: Whether nvidia-smi answered.
  returned: always
  type: bool
training:
  description: The monitor's sample of the job (attempt, total_seq_len, cause, epoch and step, result), or null
    when there is no job.
  returned: always
  type: dict
serving:
  description:
    - The served draft, its draft tokens, the average accept length since the server started (C(accept_length)),
      the live one and the generation throughput over SGLang's last log interval (C(live_accept_length),
      C(tokens_per_s), from its C(/metrics); null without C(--enable-metrics) or before any traffic), the gate's
      figure at deploy (C(gate_accept_length)) and C(drift_warning), the sentence when the live figure is more
      than O(accept_drift_percent) below the gate's; or null when no server answers.
  returned: always
  type: dict
router:
  description: The router's view of its servers (url, healthy, status, load), or null when no router answers.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._status import ARGUMENT_SPEC, StatusReader


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**StatusReader(module.params).read())


if __name__ == "__main__":
    main()
