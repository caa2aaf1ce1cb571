"""Wiring with one direction: eagle3_defaults maps the inventory to paths and reads no role; a role reads another
role's variables only where that role publishes them (its options, or the facts its meta/outputs.yml declares), never
a private (_-prefixed) one; and the roles' reads of each other form no cycle, so following a value from the command
line to a unit file never loops back."""

from __future__ import annotations

import graphlib
from pathlib import Path

import pytest
import yaml

from tests.modules import ROOT
from tests.unit.house.reads import playbook_reads, role_reads

ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta").is_dir())
PLAYBOOKS = sorted(p.name for p in (ROOT / "playbooks").glob("*.yml"))


def owner(name: str, roles: list[str] = ROLES) -> str | None:
    """The role whose prefix the variable carries (the longest: eagle3_train_ before eagle3_)."""
    bare = name.lstrip("_")
    found = [r for r in roles if bare.startswith(r + "_")]
    return max(found, key=len) if found else None


def _yaml(path: Path) -> dict:
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def published(role: str, root: Path = ROOT) -> set[str]:
    base = root / "roles" / role
    return set(_yaml(base / "defaults" / "main.yml")) | set(_yaml(base / "meta" / "outputs.yml").get("outputs") or {})


def cross_reads(root: Path = ROOT) -> list[tuple[str, str, str]]:
    """(reader, variable, owner) for every read of another role's variable by a role or a playbook."""
    roles = sorted(p.name for p in (root / "roles").iterdir() if (p / "meta").is_dir())
    out = []
    for role in roles:
        reads, defined = role_reads(role)
        out += [(role, v, o) for v in sorted(reads - defined) if (o := owner(v, roles)) and o != role]
    for name in sorted(p.name for p in (root / "playbooks").glob("*.yml")):
        out += [(name, v, o) for v in sorted(playbook_reads(name)) if (o := owner(v, roles))]
    return out


def test_the_defaults_role_reads_no_role():
    reads, defined = role_reads("eagle3_defaults")
    foreign = sorted(v for v in reads - defined if owner(v) not in (None, "eagle3_defaults"))
    assert not foreign, (
        f"eagle3_defaults reads {foreign}: it maps inputs to paths; the reader of a stage's output is the next stage"
    )


def test_no_one_reads_another_role_s_private_variables():
    private = [f"{reader} reads {v} ({o})" for reader, v, o in cross_reads() if v.startswith("_")]
    assert not private, "; ".join(private)


def test_a_role_s_variables_read_elsewhere_are_published():
    hidden = [f"{reader} reads {v}, which {o} neither takes as an option nor declares in meta/outputs.yml"
              for reader, v, o in cross_reads() if not v.startswith("_") and v not in published(o)]  # fmt: skip
    assert not hidden, "; ".join(hidden)


@pytest.mark.parametrize("role", [r for r in ROLES if (ROOT / "roles" / r / "meta" / "outputs.yml").exists()])
def test_a_declared_output_is_set_by_its_role(role: str):
    _, defined = role_reads(role)
    outputs = _yaml(ROOT / "roles" / role / "meta" / "outputs.yml")["outputs"]
    assert set(outputs) <= defined, (
        f"roles/{role}/meta/outputs.yml declares {sorted(set(outputs) - defined)}, which it never sets"
    )
    assert all(isinstance(d, str) and len(d.split()) >= 5 for d in outputs.values()), (
        f"roles/{role}: say what each output is"
    )


def test_the_roles_read_each_other_one_way():
    graph: dict[str, set[str]] = {r: set() for r in ROLES}
    for reader, _, o in cross_reads():
        if reader in graph:
            graph[reader].add(o)
    try:
        list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        pytest.fail(f"the roles read each other in a circle: {' -> '.join(err.args[1])}")


def test_the_check_catches_a_back_edge(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check itself: a defaults role that reads a stage's result makes a circle with the stage that reads it."""
    from tests.unit.house import reads as reads_module

    for role, text in {"demo_defaults": "demo_defaults_x: '{{ demo_stage_result | default(1) }}'\n",
                       "demo_stage": "demo_stage_y: '{{ demo_defaults_x }}'\n"}.items():  # fmt: skip
        (tmp_path / "roles" / role / "defaults").mkdir(parents=True)
        (tmp_path / "roles" / role / "meta").mkdir()
        (tmp_path / "roles" / role / "defaults" / "main.yml").write_text(text)
    (tmp_path / "playbooks").mkdir()
    monkeypatch.setattr(reads_module, "ROOT", tmp_path)
    found = cross_reads(tmp_path)
    assert ("demo_defaults", "demo_stage_result", "demo_stage") in found
    assert "demo_stage_result" not in published("demo_stage", tmp_path)
