# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.eagle3_status: its arguments checked here, its reads run on the host as one
short script (plugin_utils/_probe.py), the module itself where that cannot run."""

from __future__ import annotations

from ansible_collections.eagle3.ops.plugins.module_utils._status import ARGUMENT_SPEC
from ansible_collections.eagle3.ops.plugins.plugin_utils._probe import ProbeAction


class ActionModule(ProbeAction):
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)
    MODULE = "eagle3.ops.eagle3_status"
    SPEC = ARGUMENT_SPEC
    MODULES = ("_smi", "_router", "_serving", "_status")
    ENTRY = ("_status", "read")
