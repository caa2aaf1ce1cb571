# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the options of a server's gates (module_utils/_gate.py's GATE_SPEC), shared by sglang_gate
and sglang_service."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  prompts:
    description: The smoke prompts, sent in order through O(api); empty sends none.
    type: list
    elements: str
    default: []
  api:
    description:
      - How each smoke prompt reaches the server. V(chat) posts it as a user message to C(/v1/chat/completions), where
        the server applies the model's chat template as a user's client does; V(generate) posts the bare text to
        SGLang's C(/generate) (a base model without a chat template).
      - A chat model may answer a bare text with its end token at once; a speculative server then verifies no draft
        and reports no accept length.
    type: str
    choices: [chat, generate]
    default: chat
  max_tokens:
    description: The most tokens each smoke reply may have (C(max_tokens), C(max_new_tokens) for V(generate)).
    type: int
    default: 64
  timeout:
    description: Seconds each smoke request or server-info read may take.
    type: float
    default: 300
  info_paths:
    description:
      - Where to read the server info, tried in order; the first that answers 200 with JSON wins (SGLang 0.5.23 serves
        C(/get_server_info); C(/server_info) is its newer name).
    type: list
    elements: str
    default: [get_server_info, server_info]
  api_key:
    description:
      - The server's API key (SGLang's C(--api-key)), sent as an C(Authorization) bearer with the smoke requests and the
        server-info read (C(/health) asks for none); left out, none is sent. Never logged.
    type: str
"""
