"""Run project modules in-process with patched arguments, as ansible-core's own unit tests do."""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible.plugins.loader import init_plugin_loader

ROOT = Path(__file__).resolve().parent.parent


MODULE_UTILS = "ansible_collections.eagle3.ops.plugins.module_utils"
_COLLECTIONS: list[Path] = []


def init_collection_loader() -> Path:
    """Configure ansible's collection loader with a path holding this checkout as eagle3.ops (a link).

    Idempotent; the link and its directory are removed when the process exits.
    """
    if _COLLECTIONS:
        return _COLLECTIONS[0]
    inherited = os.environ.get("EAGLE3_TEST_COLLECTIONS")
    if inherited and Path(inherited, "ansible_collections", "eagle3", "ops").exists():
        # A child of a test process (a crash-injection run): the parent's path, which the parent removes.
        init_plugin_loader([inherited])
        _COLLECTIONS.append(Path(inherited))
        return _COLLECTIONS[0]
    root = Path(tempfile.mkdtemp(prefix="eagle3-ops-collections-"))
    (root / "ansible_collections" / "eagle3").mkdir(parents=True)
    link = root / "ansible_collections" / "eagle3" / "ops"
    link.symlink_to(ROOT, target_is_directory=True)

    def remove() -> None:
        link.unlink()  # the link itself, never what it points to
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(remove)
    init_plugin_loader([str(root)])
    os.environ["EAGLE3_TEST_COLLECTIONS"] = str(root)
    _COLLECTIONS.append(root)
    return root


def module_utils(name: str):
    """plugins/module_utils/NAME.py under its collection name, through ansible's collection loader (conftest)."""
    return importlib.import_module(f"{MODULE_UTILS}.{name}")


def load_module(name: str):
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
