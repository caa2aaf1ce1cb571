# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The controller's half of eagle3.ops.stage_stamp: digests of the stage's declared inputs (the variables each role the
stage runs lists in its meta/inputs.yml, and those the call names), controller files and the collection itself,
computed once per check and handed to the module, which compares them with the host's stamp."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import yaml
from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase
from ansible_collections.eagle3.ops.plugins.module_utils._stamp import digest, file_digest
from ansible_collections.eagle3.ops.plugins.plugin_utils._collection import COLLECTION, collection_digest

# Never fingerprinted, whatever a role declares: a digest of a short secret can be guessed.
_SECRET = re.compile(r"(?i).*(password|passphrase|secret|api_?key|admin_?key|private_key)")
_declared: dict[Path, list[str]] = {}


def declared_inputs(role: str, roles_dir: Path = COLLECTION / "roles") -> list[str]:
    """The inputs a role declares (its meta/inputs.yml, read once per process)."""
    path = roles_dir / role / "meta" / "inputs.yml"
    if path not in _declared:
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise AnsibleError(f"stage_stamp: the inputs of role {role} cannot be read from {path} ({exc}): "
                               "declare them there (inputs: [names])") from None  # fmt: skip
        inputs = data.get("inputs") if isinstance(data, dict) else None
        if not isinstance(inputs, list) or not all(isinstance(name, str) for name in inputs):
            raise AnsibleError(f"stage_stamp: {path} has no list of names under 'inputs': declare the role's inputs "
                               "there")  # fmt: skip
        _declared[path] = inputs
    return _declared[path]


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset({"stage", "state", "dir", "vars", "roles", "controller_files", "controller", "paths",
                             "contents", "units", "urls", "router", "timeout", "reads", "probes"})  # fmt: skip

    def _var_digests(self, task_vars: dict[str, Any], names: list[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in sorted(set(names)):
            if name not in task_vars or _SECRET.match(name):
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
            names = [str(name) for name in args.get("vars") or []]
            for role in args.get("roles") or []:
                names += declared_inputs(str(role))
            controller = self._var_digests(task_vars, names)
            for path in args.get("controller_files") or []:
                controller[f"file:{path}"] = file_digest(os.path.expanduser(str(path)))
            controller["collection"] = collection_digest()
            args["controller"] = controller
        result.update(self._execute_module(module_name="eagle3.ops.stage_stamp", module_args=args, task_vars=task_vars))
        return result
