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
version_added: "0.2.0"
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
attributes:
  check_mode:
    description: Reads the same in check mode.
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
notes:
  - Read-only; C(changed) is always false.
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
  description: The served draft, its draft tokens and the average accept length, or null when no server answers.
  returned: always
  type: dict
router:
  description: The router's view of its servers (url, healthy, status, load), or null when no router answers.
  returned: always
  type: list
  elements: dict
"""

import json
import os
import subprocess
import urllib.error
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.eagle3.ops.plugins.module_utils._gpu import SMI_GPU_FIELDS, smi_rows
from ansible_collections.eagle3.ops.plugins.module_utils._router import worker_rows
from ansible_collections.eagle3.ops.plugins.module_utils._serving import reported_accept_length


class StatusReader:
    """The three reads of a status row, each on its own: one that fails leaves its part empty."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params

    def gpus(self) -> list[dict[str, Any]] | None:
        argv = [*self.p["nvidia_smi"], f"--query-gpu={','.join(SMI_GPU_FIELDS)}", "--format=csv,noheader,nounits"]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.p["timeout"], check=False)
            if proc.returncode != 0:
                return [] if "No devices were found" in proc.stdout else None
            return smi_rows(proc.stdout, SMI_GPU_FIELDS)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None

    def training(self) -> dict[str, Any] | None:
        state, python, payload = self.p["train_state"], self.p["python"], self.p["payload_dir"]
        if not (state and python and payload) or not os.path.isdir(state) or not os.path.exists(python):
            return None
        try:
            argv = [python, "-m", "training.monitor", "--state", state, "--no-record"]
            proc = subprocess.run(argv, cwd=payload, capture_output=True, text=True, timeout=self.p["timeout"] * 4,
                                  check=False)  # fmt: skip
            sample = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout else {}
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        return sample if isinstance(sample, dict) and sample.get("attempt") is not None else None

    def serving(self) -> dict[str, Any] | None:
        if not self.p["server_url"]:
            return None
        info = self._json(self.p["server_url"].rstrip("/") + "/get_server_info")
        if not isinstance(info, dict):
            return None
        return {"draft": info.get("speculative_draft_model_path"),
                "draft_tokens": info.get("speculative_num_draft_tokens"),
                "accept_length": reported_accept_length(info)}  # fmt: skip

    def _json(self, url: str) -> Any:
        try:
            with open_url(url, timeout=self.p["timeout"]) as resp:
                return json.loads(resp.read().decode("utf-8", "replace"))
        except (OSError, urllib.error.URLError, ValueError):
            return None

    def router(self) -> list[dict[str, Any]] | None:
        if not self.p["router_url"]:
            return None
        listed = self._json(self.p["router_url"].rstrip("/") + "/workers")
        if not isinstance(listed, dict):
            return None
        return worker_rows(listed.get("workers"))

    def read(self) -> dict[str, Any]:
        gpus = self.gpus()
        return {"changed": False, "gpus": gpus or [], "gpus_read": gpus is not None, "training": self.training(),
                "serving": self.serving(), "router": self.router()}  # fmt: skip


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "nvidia_smi": {"type": "list", "elements": "str", "default": ["nvidia-smi"]},
            "train_state": {"type": "path"},
            "python": {"type": "path"},
            "payload_dir": {"type": "path"},
            "server_url": {"type": "str", "default": ""},
            "router_url": {"type": "str", "default": ""},
            "timeout": {"type": "float", "default": 5},
        },
        supports_check_mode=True,
    )
    module.exit_json(**StatusReader(module.params).read())


if __name__ == "__main__":
    main()
