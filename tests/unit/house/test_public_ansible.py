"""Nothing private of ansible-core is imported: ansible-core's ``_internal`` package and its ``_``-prefixed names change
between releases without notice, and a collection that used them would break under a user's Ansible upgrade. The
check reads every Python file under plugins/ and eagle3_ops/ with Python's own parser (no text matching of imports)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.modules import ROOT

SOURCES = sorted(p for part in ("plugins", "eagle3_ops") for p in (ROOT / part).rglob("*.py"))


def private_uses(source: str) -> list[str]:
    """Each import of a private name of ansible-core in ``source``: a module path through a ``_``-prefixed part
    (``ansible._internal``, ``ansible.plugins.connection._x``), or a ``_``-prefixed name from an ansible module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            modules = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for module, names in modules:
            parts = module.split(".")
            if parts[0] != "ansible":
                continue
            if any(part.startswith("_") for part in parts[1:]):
                found.append(f"line {node.lineno}: {module}")
            found += [f"line {node.lineno}: {module}.{name}" for name in names if name.startswith("_")]
    return found


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_private_ansible_core_import(path: Path):
    uses = private_uses(path.read_text(encoding="utf-8"))
    assert not uses, f"{path.relative_to(ROOT)} imports ansible-core's private names: {uses}"


@pytest.mark.parametrize(
    ("source", "caught"),
    [("from ansible._internal._templating._jinja_bits import AnsibleEnvironment", True),
     ("import ansible._internal", True),
     ("from ansible.plugins.connection.ssh import _ssh_retry", True),
     ("from ansible.plugins.connection.ssh import Connection", False),
     ("from ansible_collections.eagle3.ops.plugins.module_utils._stamp import digest", False),
     ("from ._gpu import scan", False)],
)  # fmt: skip
def test_the_check_catches_private_imports(source: str, caught: bool):
    assert bool(private_uses(source)) is caught
