"""Run project modules in-process with patched arguments, as ansible-core's own unit tests do."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args

ROOT = Path(__file__).resolve().parent.parent


def _alias_module_utils() -> None:
    # Ansible ships plugins/module_utils/_x.py to targets as ansible.module_utils._x; do the same here.
    for path in (ROOT / "plugins" / "module_utils").glob("_*.py"):
        name = f"ansible.module_utils.{path.stem}"
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec and spec.loader
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)


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
