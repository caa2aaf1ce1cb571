# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The serving plane's keys as the modules send them: SGLang's servers and smg's data plane take
``Authorization: Bearer <api key>``, smg's control plane (``/workers``, ``/get_loads``) its admin key (smg 1.13's
``--control-plane-api-keys``); a refusal (401, 403) is named with the key it wanted and the fix."""

from __future__ import annotations

from typing import Any

# The options of a module that talks to a server (its API key) or to the router's control plane (its admin key).
API_KEY_SPEC: dict[str, dict[str, Any]] = {"api_key": {"type": "str", "no_log": True}}
ADMIN_KEY_SPEC: dict[str, dict[str, Any]] = {"admin_key": {"type": "str", "no_log": True}}


def bearer(key: str | None, headers: dict[str, str] | None = None) -> dict[str, str]:
    """``headers`` (or none) with ``Authorization: Bearer <key>`` when a key is set."""
    out = dict(headers or {})
    if key:
        out["Authorization"] = f"Bearer {key}"
    return out


def refused(code: int | None, what: str, key: str | None, which: str) -> str | None:
    """The sentence for an HTTP 401/403 from ``what`` (None for any other status): the ``which`` key was refused, or
    none was sent."""
    if code not in (401, 403):
        return None
    if key:
        return (f"{what} refused the serving plane's {which} key (HTTP {code}): the key it runs with differs from the "
                "keys file's - rerun deploy.yml to roll the keys file's keys out.")  # fmt: skip
    return (f"{what} asks for a key (HTTP {code}) and none was sent: set eagle3_serving_keys=true (the default) or "
            "pass the keys file's key.")  # fmt: skip
