#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A freshly started server's gates in one call: the smoke requests, then its server info (the accept length)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gate
short_description: Send a server its smoke requests and read its server info in one call
description:
  - Posts each smoke prompt to the server's C(/generate) (greedy, C(max_new_tokens) each), in order, and fails at the
    first that does not answer 200 with a generated text, naming it; then reads the server info from the first of
    C(info_paths) that answers 200 (SGLang 0.5.23 serves C(/get_server_info); C(/server_info) is its newer name) and
    returns the average speculative accept length SGLang reports in C(internal_states).
  - One module call instead of one request per task, so a setting switch or a rollout pays one round trip for its
    gates; the accept-length gate itself stays a task of the role (its message names the draft).
version_added: "0.3.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  url:
    description: Base URL of the server, as the serving host reaches it (for instance C(http://127.0.0.1:30000)).
    type: str
    required: true
  prompts:
    description: The smoke prompts; empty sends none and only reads the server info.
    type: list
    elements: str
    default: []
  max_tokens:
    description: C(max_new_tokens) of each smoke request.
    type: int
    default: 64
  timeout:
    description: Seconds each request may take.
    type: float
    default: 300
  info_paths:
    description: Where to read the server info, tried in order; the first that answers 200 with JSON wins.
    type: list
    elements: str
    default: [get_server_info, server_info]
attributes:
  check_mode:
    description: Sends nothing in check mode (a server that check mode did not start cannot be asked).
    support: full
  diff_mode:
    description: Nothing changes, so there is no diff.
    support: none
notes:
  - Changes nothing on the server; C(changed) is always false.
"""

EXAMPLES = r"""
- name: Send the smoke requests and read the accept length
  eagle3.ops.sglang_gate:
    url: http://127.0.0.1:30000
    prompts: [Explain speculative decoding in two sentences.]
    max_tokens: 64
  register: gate
"""

RETURN = r"""
smoke:
  description: One record per smoke prompt, in order (the prompt, the generated text's length in characters, seconds).
  returned: always
  type: list
  elements: dict
info:
  description: The server info (the first of info_paths that answered), or an empty dict when none did.
  returned: always
  type: dict
info_path:
  description: The path that answered, or null.
  returned: always
  type: str
accept_length:
  description: C(internal_states[0].avg_spec_accept_length) of the server info, or null when the server reports none.
  returned: always
  type: float
"""

import json
import time
import urllib.error
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.eagle3.ops.plugins.module_utils._serving import reported_accept_length


class GateError(Exception):
    pass


class Gate:
    """The smoke requests and the server info of one server."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.base = params["url"].rstrip("/")

    def smoke(self) -> list[dict[str, Any]]:
        done: list[dict[str, Any]] = []
        prompts, where = self.p["prompts"], f"{self.base}/generate"
        for i, prompt in enumerate(prompts, 1):
            body = {"text": prompt, "sampling_params": {"max_new_tokens": self.p["max_tokens"], "temperature": 0}}
            started = time.monotonic()
            try:
                with open_url(where, method="POST", data=json.dumps(body),
                              headers={"Content-Type": "application/json"}, timeout=self.p["timeout"]) as resp:
                    answer = json.loads(resp.read().decode("utf-8", "replace"))
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300] if exc.fp else ""
                raise GateError(f"the smoke request {i} of {len(prompts)} to {where} answered HTTP "
                                f"{exc.code} {detail}".rstrip()) from exc  # fmt: skip
            except (OSError, urllib.error.URLError, ValueError) as exc:
                raise GateError(f"the smoke request {i} of {len(prompts)} to {where} failed: {exc}") from exc
            text = answer.get("text") if isinstance(answer, dict) else None
            if not isinstance(text, str):
                raise GateError(f"the smoke request {i} of {len(prompts)} to {where} answered without a "
                                f"generated text: {json.dumps(answer)[:300]}")  # fmt: skip
            done.append({"prompt": prompt, "chars": len(text), "seconds": round(time.monotonic() - started, 3)})
        return done

    def info(self) -> tuple[dict[str, Any], str | None]:
        for path in self.p["info_paths"]:
            try:
                with open_url(f"{self.base}/{path.lstrip('/')}", timeout=self.p["timeout"]) as resp:
                    got = json.loads(resp.read().decode("utf-8", "replace"))
            except (OSError, urllib.error.URLError, ValueError):
                continue
            if isinstance(got, dict):
                return got, path
        return {}, None

    @staticmethod
    def accept_length(info: dict[str, Any]) -> float | None:
        value = reported_accept_length(info)
        return float(value) if isinstance(value, (int, float)) else None

    def run(self, check_mode: bool) -> dict[str, Any]:
        if check_mode:
            return {"changed": False, "smoke": [], "info": {}, "info_path": None, "accept_length": None}
        smoke = self.smoke()
        info, path = self.info()
        return {"changed": False, "smoke": smoke, "info": info, "info_path": path,
                "accept_length": self.accept_length(info)}  # fmt: skip


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "prompts": {"type": "list", "elements": "str", "default": []},
            "max_tokens": {"type": "int", "default": 64, "no_log": False},  # a count, not a secret
            "timeout": {"type": "float", "default": 300},
            "info_paths": {"type": "list", "elements": "str", "default": ["get_server_info", "server_info"]},
        },
        supports_check_mode=True,
    )
    try:
        module.exit_json(**Gate(module.params).run(module.check_mode))
    except GateError as exc:
        module.fail_json(msg=f"{str(exc)[0].upper()}{str(exc)[1:]}; the server log says why.")


if __name__ == "__main__":
    main()
