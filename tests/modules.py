"""Run project modules in-process with patched arguments, as ansible-core's own unit tests do."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parent.parent


class _ProjectModuleUtils(importlib.abc.MetaPathFinder):
    """Resolve ansible.module_utils._x to plugins/module_utils/_x.py, as AnsiballZ does on targets."""

    def find_spec(self, fullname, path=None, target=None):
        prefix = "ansible.module_utils._"
        if not fullname.startswith(prefix) or "." in fullname[len(prefix) :]:
            return None
        candidate = ROOT / "plugins" / "module_utils" / f"{fullname[len('ansible.module_utils.') :]}.py"
        return importlib.util.spec_from_file_location(fullname, candidate) if candidate.exists() else None


def _alias_module_utils() -> None:
    if not any(isinstance(f, _ProjectModuleUtils) for f in sys.meta_path):
        sys.meta_path.insert(0, _ProjectModuleUtils())


def load_module(name: str):
    _alias_module_utils()
    spec = importlib.util.spec_from_file_location(
        f"eagle3_test_module_{name}", ROOT / "plugins" / "modules" / f"{name}.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(name: str, args: dict[str, Any], check: bool = False, diff: bool = False, capsys=None) -> dict:
    """Run module ``name`` with ``args``; returns its result dict (``failed`` set on fail_json)."""
    mod = load_module(name)
    full = dict(args)
    if check:
        full["_ansible_check_mode"] = True
    if diff:
        full["_ansible_diff"] = True
    with patch_module_args(full), pytest.raises(SystemExit):
        mod.main()
    out = capsys.readouterr().out if capsys else ""
    return json.loads(out.strip().splitlines()[-1])
