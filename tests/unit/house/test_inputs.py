"""Fingerprints declared, not inferred: each role lists the variables its result depends on in its meta/inputs.yml, and
each stage's fingerprint takes the inputs of the roles it runs (stage_stamp's roles). These tests read every variable
the roles' files and the stages' playbooks read, and fail when one is neither an input nor a declared not-input - so
a variable added without a decision fails here, not in a user's rerun."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.modules import ROOT
from tests.unit.house.reads import ANSIBLE_NAMES, playbook_reads, role_reads, roles_reached, roles_used

DECLARED = sorted(p.parents[1].name for p in (ROOT / "roles").glob("*/meta/inputs.yml"))
# Each playbook that keeps fingerprints: the roles whose vars define its stages (_<role>_stamp).
PLAYBOOK_STAGES = {"lab.yml": ["lab_host"], "train.yml": ["eagle3_train", "vllm_runtime"],
                   "deploy.yml": ["sglang_serve", "sglang_runtime", "sglang_router"]}  # fmt: skip
# Roles a stage's playbook runs whose variables are no stage's inputs by role: the wiring, whose values the stages'
# roles read by name (eagle3_defaults_*), each as a declared input, and the task library.
WIRING = {"eagle3_defaults", "eagle3_common"}


def declaration(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "roles" / role / "meta" / "inputs.yml").read_text()) or {}


def stamp(owner: str) -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "roles" / owner / "vars" / "main.yml").read_text())
    return data[f"_{owner}_stamp"]


def common_defaults() -> set[str]:
    return set(yaml.safe_load((ROOT / "roles" / "eagle3_defaults" / "defaults" / "main.yml").read_text()))


def undecided(reads: set[str], inputs: set[str], not_inputs: set[str]) -> list[str]:
    return sorted(reads - inputs - not_inputs - set(ANSIBLE_NAMES))


@pytest.mark.parametrize("role", DECLARED)
def test_every_variable_a_role_reads_is_declared(role: str):
    reads, defined = role_reads(role)
    decl = declaration(role)
    inputs, not_inputs = set(decl.get("inputs") or []), dict(decl.get("not_inputs") or {})
    missing = undecided(reads - defined, inputs, set(not_inputs))
    assert not missing, (f"roles/{role} reads {missing}, which its meta/inputs.yml neither lists as inputs nor as "
                         "not_inputs with a reason: declare each")  # fmt: skip
    assert not inputs & set(not_inputs), f"roles/{role}: both an input and not: {sorted(inputs & set(not_inputs))}"
    assert all(isinstance(why, str) and len(why.split()) >= 3 for why in not_inputs.values()), \
        f"roles/{role}: every not_input says why, in words"  # fmt: skip


@pytest.mark.parametrize("role", DECLARED)
def test_a_declared_input_is_read(role: str):
    """No stale declaration: an input is read by the role's files (its own private values included)."""
    reads, defined = role_reads(role)
    stale = sorted(set(declaration(role).get("inputs") or []) - reads - defined)
    assert not stale, f"roles/{role}/meta/inputs.yml declares {stale}, which the role does not read"


@pytest.mark.parametrize("playbook", sorted(PLAYBOOK_STAGES))
def test_a_stage_takes_in_every_role_its_playbook_runs(playbook: str):
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    ran = roles_reached(roles_used(plays)) - WIRING
    staged: set[str] = set()
    for owner in PLAYBOOK_STAGES[playbook]:
        staged |= set(stamp(owner).get("roles") or [])
    assert not ran - staged, f"{playbook} runs {sorted(ran - staged)}, which none of its stages' fingerprints take in"
    assert staged <= set(DECLARED), f"stages of {playbook} name roles without meta/inputs.yml: {staged - set(DECLARED)}"


@pytest.mark.parametrize("playbook", sorted(PLAYBOOK_STAGES))
def test_every_variable_a_stage_s_playbook_reads_is_declared(playbook: str):
    inputs: set[str] = set()
    not_inputs: set[str] = set()
    for owner in PLAYBOOK_STAGES[playbook]:
        spec = stamp(owner)
        inputs |= set(spec.get("vars") or [])
        for role in spec.get("roles") or []:
            decl = declaration(role)
            inputs |= set(decl.get("inputs") or [])
            not_inputs |= set(decl.get("not_inputs") or {})
    missing = undecided(playbook_reads(playbook), inputs, not_inputs)
    assert not missing, (f"playbooks/{playbook} reads {missing}: name each in its stage's vars (an input) or in the "
                         "stage owner's not_inputs with a reason")  # fmt: skip


@pytest.mark.parametrize("owner", sorted({o for owners in PLAYBOOK_STAGES.values() for o in owners}))
def test_a_stage_s_own_variables_are_read_by_its_playbook_or_the_wiring(owner: str):
    playbook = next(pb for pb, owners in PLAYBOOK_STAGES.items() if owner in owners)
    plays = yaml.safe_load((ROOT / "playbooks" / playbook).read_text())
    known = playbook_reads(playbook) | common_defaults() | role_reads("eagle3_common")[0]
    for role in roles_reached(roles_used(plays)):
        known |= role_reads(role)[0]
    stale = sorted(set(stamp(owner).get("vars") or []) - known)
    assert not stale, f"_{owner}_stamp names {stale}, which nothing of {playbook} reads"


def test_stamps_name_no_patterns():
    """Exact names only: a pattern takes in whatever happens to match it, and leaves out what does not."""
    for path in sorted(ROOT.glob("roles/*/vars/main.yml")):
        for name, spec in (yaml.safe_load(path.read_text()) or {}).items():
            if name.endswith("_stamp") and isinstance(spec, dict):
                assert "exclude_vars" not in spec, f"{path}: {name} excludes by pattern"
                bad = [v for v in spec.get("vars") or [] if not re.fullmatch(r"\w+", str(v))]
                assert not bad, f"{path}: {name} names variables by pattern: {bad}"


def test_a_variable_added_without_a_decision_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The check itself: a role that reads a new variable, declared nowhere, is caught."""
    from tests.unit.house import reads as reads_module

    role = tmp_path / "roles" / "demo"
    (role / "tasks").mkdir(parents=True)
    (role / "meta").mkdir()
    (role / "tasks" / "main.yml").write_text("- ansible.builtin.debug:\n    msg: '{{ demo_new }}'\n  when: demo_flag\n")
    (role / "meta" / "inputs.yml").write_text("inputs: [demo_flag]\n")
    monkeypatch.setattr(reads_module, "ROOT", tmp_path)
    reads, defined = reads_module.role_reads("demo")
    assert undecided(reads - defined, {"demo_flag"}, set()) == ["demo_new"]


def test_the_plays_target_the_groups_the_roles_name():
    """A play's hosts cannot read a role's defaults: deploy.yml names the servers' and the router's groups itself, and
    eagle3_defaults' fixed names must be the same ones."""
    defaults = yaml.safe_load((ROOT / "roles" / "eagle3_defaults" / "defaults" / "main.yml").read_text())
    text = (ROOT / "playbooks" / "deploy.yml").read_text()
    for group in (defaults["eagle3_defaults_servers_group"], defaults["eagle3_defaults_router_group"]):
        assert re.search(rf"groups\.{group}\b|hosts: [\w:]*\b{group}\b", text), f"deploy.yml targets no group {group}"
    assert "eagle3_servers_group" not in text and "eagle3_router_group" not in text
