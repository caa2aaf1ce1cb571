# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's server info (``/get_server_info``), as the modules read it."""

from __future__ import annotations

from typing import Any


def reported_accept_length(info: dict[str, Any]) -> Any:
    """``internal_states[0].avg_spec_accept_length`` as the server reports it, or None when it reports none."""
    states = info.get("internal_states") or [{}]
    first = states[0] if isinstance(states, list) and isinstance(states[0], dict) else {}
    return first.get("avg_spec_accept_length")
