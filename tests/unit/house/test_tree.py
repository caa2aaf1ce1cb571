"""The tests mirror the tree: every module_utils file has a unit test file of its own."""

from __future__ import annotations

from tests.modules import ROOT


def test_every_module_utils_file_has_its_own_test_file():
    utils = sorted(p.stem for p in (ROOT / "plugins" / "module_utils").glob("_*.py"))
    tests = ROOT / "tests" / "unit" / "plugins" / "module_utils"
    missing = [name for name in utils if not (tests / f"test{name}.py").exists()]
    assert utils and not missing, f"module_utils without tests/unit/plugins/module_utils/test_<name>.py: {missing}"
