#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A freshly started server's gates in one call: the smoke requests, then its server info (the accept length)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_gate
short_description: Send a server its smoke requests and read its server info in one call
description:
  - Sends each smoke prompt through O(api) (greedy, at most O(max_tokens) tokens each), in order, and fails at the
    first that does not answer 200 with a generated text, naming it; then reads the server info from the first of
    C(info_paths) that answers 200 (SGLang 0.5.23 serves C(/get_server_info); C(/server_info) is its newer name) and
    returns the average speculative accept length SGLang reports in C(internal_states).
  - One module call instead of one request per task. The gates of an already running server; after a restart,
    eagle3.ops.sglang_service sends the same requests in its own call and gates the accept length.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  url:
    description: Base URL of the server, as the serving host reaches it (for instance C(http://127.0.0.1:30000)).
    type: str
    required: true
extends_documentation_fragment:
  - eagle3.ops.gate
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
  description: One record per smoke prompt, in order (the prompt, the generated text's length in characters, the
    tokens generated where the server says, seconds).
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

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._gate import GATE_SPEC, Gate, GateError


def main() -> None:
    module = AnsibleModule(
        argument_spec={"url": {"type": "str", "required": True}, **GATE_SPEC},
        supports_check_mode=True,
    )
    try:
        module.exit_json(**Gate(module.params).run(module.check_mode))
    except GateError as exc:
        module.fail_json(msg=f"{str(exc)[0].upper()}{str(exc)[1:]}; the server log says why.")


if __name__ == "__main__":
    main()
