"""Role conventions: argument_specs mirror defaults; variables carry the role's prefix."""

from __future__ import annotations

import pytest
import yaml

from tests.modules import ROOT

ROLES = ROOT / "roles"
ROLE_DIRS = sorted(p for p in ROLES.iterdir() if (p / "defaults" / "main.yml").exists())
# The entry point that documents a role's defaults: main, except for the wiring, whose entry point is the task every
# playbook imports first (a main entry would be checked again in every play that lists the role or a dependant).
DEFAULTS_ENTRY = {"eagle3_defaults": "inventory"}


def defaults_spec(role) -> dict:
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    return specs[DEFAULTS_ENTRY.get(role.name, "main")]["options"]


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_argument_specs_mirror_defaults(role):
    defaults = yaml.safe_load((role / "defaults" / "main.yml").read_text()) or {}
    spec_file = role / "meta" / "argument_specs.yml"
    assert spec_file.exists(), f"{role.name} has no meta/argument_specs.yml"
    options = defaults_spec(role)
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


_FILLER = {"the", "a", "an", "of", "to", "in", "for", "and", "or", "is", "on", "by", "with", "its", "it"}


@pytest.mark.parametrize(
    "role", sorted(p for p in ROLES.iterdir() if (p / "meta" / "argument_specs.yml").exists()), ids=lambda p: p.name
)
def test_every_option_is_documented_by_a_sentence_of_its_own(role):
    """argument_specs is the documentation: a description must say more than the option's name, and no two
    options of one entry point share one (a group comment pasted onto each member says nothing about any one)."""
    specs = yaml.safe_load((role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    for entry in specs.values():
        _sentences_of_their_own(role.name, entry.get("options") or {})


def _sentences_of_their_own(role: str, options: dict) -> None:
    import re

    seen: dict[str, str] = {}
    for name, spec in options.items():
        text = spec["description"]
        text = " ".join(text) if isinstance(text, list) else str(text)
        words = [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _FILLER]
        own = [w for w in words if w not in set(name.lower().split("_"))]
        assert len(own) >= 3, f"{role}: the description of {name} only restates its name: {text!r}"
        assert len(text.split()) >= 4 and text.rstrip().endswith((".", ")")), (
            f"{role}: the description of {name} is not a sentence: {text!r}"
        )
        assert text not in seen, f"{role}: {name} and {seen.get(text)} share the description {text!r}"
        seen[text] = name


@pytest.mark.parametrize("role", ROLE_DIRS, ids=lambda p: p.name)
def test_defaults_hold_bare_values(role):
    """The documentation lives in argument_specs; defaults/main.yml carries no per-variable comments."""
    lines = (role / "defaults" / "main.yml").read_text().splitlines()
    body = [line for line in lines[1:] if line.strip()]  # after '---'
    comments = [line for line in body if line.lstrip().startswith("#")]
    assert len(comments) <= 1, f"{role.name}: defaults/main.yml documents variables in comments: {comments[:3]}"


def test_the_wiring_is_checked_once_per_run_not_in_every_play():
    """eagle3_defaults has no main entry point (Ansible would check it in every play that lists it or a role depending
    on it); the playbooks that run stages import inventory.yml without rolespec_validate: false, so its options are
    checked per host once, in the first play."""
    specs = yaml.safe_load((ROLES / "eagle3_defaults" / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    assert "main" not in specs and len(specs["inventory"]["options"]) > 30
    for name in ("deploy", "train", "bench", "smoke"):
        plays = yaml.safe_load((ROOT / "playbooks" / f"{name}.yml").read_text())
        first = next(p for p in plays if p.get("pre_tasks"))
        task = first["pre_tasks"][0]["ansible.builtin.import_role"]
        assert task["name"] == "eagle3.ops.eagle3_defaults" and task["tasks_from"] == "inventory", name
        assert task.get("rolespec_validate", True) is True, name


STAGE_COMPLETE_PLAY = """- name: Whether a fingerprint may be kept after this run
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: eagle3.ops.eagle3_defaults
  tasks:
    - name: Say it
      ansible.builtin.debug:
        msg: "stage complete: {{ eagle3_defaults_stage_complete | bool }}"
      vars:
        eagle3_defaults_stamp_whole_tags: [runtime, data, train]
      tags: [always]
"""


@pytest.mark.parametrize(
    ("args", "complete"),
    [((), True), (("--tags", "data"), True), (("--tags", "train,judge"), True), (("--tags", "all"), True),
     (("--tags", "judge"), False), (("--tags", "data", "--skip-tags", "export"), False),
     (("--skip-tags", "judge"), False), (("--check",), False), (("--tags", "runtime", "--check"), False)],
)  # fmt: skip
def test_a_fingerprint_is_kept_only_after_a_run_that_ran_its_stage_whole(tmp_path, args, complete):
    """stamp_record.yml's condition, as Ansible evaluates it: an untagged run, or a tag that selects the stage whole
    (a runtime's roles carry every tag of eagle3_defaults_stamp_whole_tags) with nothing skipped; never check mode."""
    from tests.conftest import run_playbook

    play = tmp_path / "play.yml"
    play.write_text(STAGE_COMPLETE_PLAY)
    proc = run_playbook(play, "-i", "localhost,", *args, timeout=120)
    assert f"stage complete: {complete}" in proc.stdout, proc.stdout[-2000:]
