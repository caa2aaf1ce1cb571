# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.eagle3_status: its arguments checked here, its reads run on the host as one
short script (plugin_utils/_probe.py), the module itself where that cannot run."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.eagle3.ops.plugins.module_utils._status import ARGUMENT_SPEC
from ansible_collections.eagle3.ops.plugins.plugin_utils import _probe

# module_utils the reader needs, dependencies first
_MODULES = ["_gpu", "_router", "_serving", "_status"]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        params, error = _probe.validated(ARGUMENT_SPEC, self._task.args)
        if params is None:
            result.update(failed=True, msg=f"eagle3_status: {error}")
            return result
        answer = _probe.run(self, task_vars, _MODULES, "_status", "read", params)
        if answer is None:
            answer = self._execute_module(module_name="eagle3.ops.eagle3_status", module_args=self._task.args,
                                          task_vars=task_vars)  # fmt: skip
        result.update(answer)
        return result
