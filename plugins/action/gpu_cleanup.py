# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.gpu_cleanup: a dry run (check mode) - what a fleet-wide cleanup runs on every
host, and all it runs on a host with nothing to stop - is checked here and run on the host as one short script
(plugin_utils/_probe.py); a run that signals anything is always the module itself."""

from __future__ import annotations

from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._cleanup import ARGUMENT_SPEC
from ansible_collections.eagle3.ops.plugins.plugin_utils._probe import ProbeAction


class ActionModule(ProbeAction):
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    MODULE = "eagle3.ops.gpu_cleanup"
    SPEC = ARGUMENT_SPEC
    MODULES = ("_smi", "_gpu", "_safetensors", "_cleanup")
    ENTRY = ("_cleanup", "dry_run")

    def probe_wanted(self) -> bool:
        return bool(self._play_context.check_mode)

    def probe_modules(self, params: dict[str, Any]) -> tuple[str, ...]:
        """The checkpoint guard's reader (_safetensors, the largest of them) only where there are paths to guard:
        most hosts of a fleet-wide cleanup have none, and each would compile it."""
        return self.MODULES if params.get("require_paths") else tuple(m for m in self.MODULES if m != "_safetensors")
