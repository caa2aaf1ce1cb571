# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters for the units the roles template (sglang_router's; sglang_service writes sglang_serve's): the ExecStart
line and the environment file that holds the secrets it names, rendered as the sglang_service module renders them
(module_utils/_unit.py)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.eagle3.ops.plugins.module_utils._unit import (
    environment_assignment,
    environment_text,
    exec_line,
)


def systemd_exec(argv: Iterable[Any]) -> str:
    """``argv`` as an ExecStart line: each argument shell-quoted, ``${EAGLE3_...}`` references left for systemd."""
    return exec_line(argv)


def systemd_assignment(name: Any, value: Any) -> str:
    """``name`` and ``value`` as a unit's quoted ``Environment=`` assignment."""
    return environment_assignment(str(name), value)


def systemd_env(env: Mapping[str, Any]) -> str:
    """``env`` as EnvironmentFile lines (NAME="value", escaped); a bad name or a value with a line break fails."""
    try:
        return environment_text(env)
    except ValueError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"systemd_exec": systemd_exec, "systemd_env": systemd_env, "systemd_assignment": systemd_assignment}
