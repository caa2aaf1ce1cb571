"""Role conventions: argument_specs mirror defaults; variables carry the role's prefix."""

from __future__ import annotations

import pytest
import yaml

from tests.modules import ROOT

ROLES = ROOT / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "defaults" / "main.yml").exists())


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_argument_specs_mirror_defaults(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec_file = role / "meta" / "argument_specs.yml"
    assert spec_file.exists(), f"{role.name} has no meta/argument_specs.yml"
    options = yaml.safe_load(spec_file.read_text())["argument_specs"]["main"]["options"]
    assert set(options) == set(defaults)
    for name, spec in options.items():
        assert spec.get("description"), f"{role.name}: {name} has no description"
        if "default" in spec:
            assert spec["default"] == defaults[name], f"{role.name}: {name} default differs"
        elif defaults[name] is not None:
            assert isinstance(defaults[name], str) and "{{" in defaults[name], (
                f"{role.name}: {name} has a literal default that argument_specs does not state"
            )


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_variables_carry_the_role_prefix(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    assert all(name.startswith(f"{role.name}_") for name in defaults)
