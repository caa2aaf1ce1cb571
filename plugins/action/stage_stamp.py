# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.stage_stamp: digests of the stage's variables, controller files and the
collection itself, computed once per check and handed to the module, which compares them with the host's stamp."""

from __future__ import annotations

import os
import re
from typing import Any

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.eagle3.ops.plugins.module_utils._stamp import digest, file_digest
from ansible_collections.eagle3.ops.plugins.plugin_utils._collection import collection_digest

# Never fingerprinted, whatever the patterns say: a digest of a short secret can be guessed.
_SECRET = re.compile(r"(?i).*(password|passphrase|secret|api_?key|private_key)")


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset({"stage", "state", "dir", "vars", "exclude_vars", "controller_files", "controller",
                             "paths", "contents", "units", "urls", "router", "timeout", "reads", "probes"})  # fmt: skip

    def _var_digests(self, task_vars: dict[str, Any], patterns: list[str], exclude: list[str]) -> dict[str, str]:
        try:
            wanted = [re.compile(p) for p in patterns]
            unwanted = [re.compile(p) for p in exclude]
        except re.error as exc:
            raise AnsibleError(f"stage_stamp: a variable pattern is not a regular expression ({exc}).") from None
        out: dict[str, str] = {}
        for name in sorted(task_vars):
            if not any(p.match(name) for p in wanted) or any(p.match(name) for p in unwanted) or _SECRET.match(name):
                continue
            raw = task_vars[name]
            try:
                value = self._templar.template(raw)
            except Exception:
                value = raw  # a value that needs a later fact is kept as written
            out[f"var:{name}"] = digest(value)
        return out

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = dict(self._task.args)
        if args.get("state", "check") == "check" and not args.get("controller"):
            controller = self._var_digests(task_vars, list(args.get("vars") or []),
                                           list(args.get("exclude_vars") or []))
            for path in args.get("controller_files") or []:
                controller[f"file:{path}"] = file_digest(os.path.expanduser(str(path)))
            controller["collection"] = collection_digest()
            args["controller"] = controller
        result.update(self._execute_module(module_name="eagle3.ops.stage_stamp", module_args=args, task_vars=task_vars))
        return result
