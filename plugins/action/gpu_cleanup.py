# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.gpu_cleanup: a dry run (check mode) - what a fleet-wide cleanup runs on every
host, and all it runs on a host with nothing to stop - is checked here and run on the host as one short script
(plugin_utils/_probe.py); a run that signals anything is always the module itself."""

from __future__ import annotations

from typing import Any

from ansible.plugins.action import ActionBase
from ansible_collections.eagle3.ops.plugins.module_utils._cleanup import ARGUMENT_SPEC
from ansible_collections.eagle3.ops.plugins.plugin_utils import _probe

# module_utils a dry run needs, dependencies first
_MODULES = ["_gpu", "_safetensors", "_cleanup"]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        answer = None
        if self._play_context.check_mode:
            params, error = _probe.validated(ARGUMENT_SPEC, self._task.args)
            if params is None:
                result.update(failed=True, msg=f"gpu_cleanup: {error}")
                return result
            answer = _probe.run(self, task_vars, _MODULES, "_cleanup", "dry_run", params)
        if answer is None:
            answer = self._execute_module(module_name="eagle3.ops.gpu_cleanup", module_args=self._task.args,
                                          task_vars=task_vars)  # fmt: skip
        result.update(answer)
        return result
