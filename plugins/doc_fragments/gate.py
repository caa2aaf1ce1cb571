# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Documentation fragment: the options of a server's gates (module_utils/_gate.py's GATE_SPEC), shared by sglang_gate
and sglang_service."""

from __future__ import annotations


class ModuleDocFragment:
    DOCUMENTATION = r"""
options:
  prompts:
    description: The smoke prompts posted to the server's C(/generate), in order; empty sends none.
    type: list
    elements: str
    default: []
  max_tokens:
    description: C(max_new_tokens) of each smoke request.
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
"""
