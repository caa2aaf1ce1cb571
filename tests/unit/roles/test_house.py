"""The house rules, checked on the files: playbooks are lists of roles, preflights only look, one shape has one
home (shared task files instead of twins), and nothing reaches outside the collection for its files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_playbook
from tests.modules import ROOT

PLAYBOOKS = sorted((ROOT / "playbooks").glob("*.yml"))
ROLE_TASKS = sorted(ROOT.glob("roles/*/tasks/*.yml"))
IMPORTS = {"ansible.builtin.import_role", "ansible.builtin.include_role"}
# What a preflight may do: look and decide. Commands only read (changed_when: false).
READ_ONLY = {"ansible.builtin.assert", "ansible.builtin.fail", "ansible.builtin.stat", "ansible.builtin.slurp",
             "ansible.builtin.set_fact", "ansible.builtin.debug", "ansible.builtin.uri", "ansible.builtin.import_tasks",
             "ansible.builtin.command", "ansible.builtin.raw"}  # fmt: skip
KEYWORDS = {"name", "when", "tags", "vars", "register", "changed_when", "failed_when", "check_mode", "loop",
            "loop_control", "until", "retries", "delay", "run_once", "delegate_to", "no_log", "become", "block",
            "rescue", "always", "ignore_errors", "notify", "environment", "args"}  # fmt: skip


def _tasks(items: list[dict]) -> list[dict]:
    out = []
    for task in items or []:
        out.append(task)
        for key in ("block", "rescue", "always"):
            out += _tasks(task.get(key) or [])
    return out


def _action(task: dict) -> str | None:
    return next((k for k in task if k not in KEYWORDS), None)


@pytest.mark.parametrize("path", PLAYBOOKS, ids=lambda p: p.name)
def test_plays_are_lists_of_roles(path: Path):
    """Kubespray's shape: a play lists roles (the shared defaults role first); wiring lives in eagle3_defaults."""
    for play in yaml.safe_load(path.read_text()):
        assert "vars" not in play, f"{path.name}: play {play['name']!r} carries vars; put them in a role's defaults"
        if play.get("hosts") == "hypervisors":
            continue  # smoke.yml's reach test of the hop (pct list) is the one play of plain tasks
        steps = _tasks(play.get("tasks") or [])
        others = [t.get("name") for t in steps if _action(t) not in IMPORTS]
        assert not others, f"{path.name}: tasks that are not roles: {others}"
        assert play.get("roles") or steps, f"{path.name}: play {play['name']!r} runs no role"


@pytest.mark.parametrize("path", sorted(ROOT.glob("roles/*/tasks/preflight.yml")), ids=lambda p: p.parts[-3])
def test_preflight_only_looks(path: Path):
    for task in _tasks(yaml.safe_load(path.read_text())):
        action = _action(task)
        assert action in READ_ONLY, f"{path.parts[-3]} preflight changes the host: {task.get('name')} ({action})"
        if action in ("ansible.builtin.command", "ansible.builtin.raw"):
            assert task.get("changed_when") is False, f"{path.parts[-3]}: {task.get('name')} may change something"
        if action == "ansible.builtin.uri":
            assert task[action].get("method", "GET") == "GET"


def _homes(pattern: str) -> set[str]:
    rx = re.compile(pattern)
    return {str(p.relative_to(ROOT)) for p in ROLE_TASKS if rx.search(p.read_text())}


@pytest.mark.parametrize(("pattern", "home"), [
    (r"systemd-run", {"roles/eagle3_common/tasks/unit_start.yml"}),
    (r"urllib\.request\.urlopen", {"roles/eagle3_common/tasks/unit_health.yml"}),
    (r"-p ActiveState -p Result", {"roles/eagle3_common/tasks/unit_wait.yml"}),
    (r"memory\.used|nvidia_smi_query", {"roles/gpu_facts/tasks/gather.yml"}),  # the argv: filter/gpu.py
    (r"-m, venv|'venv'", {"roles/pinned_venv/tasks/main.yml"}),
    (r"cleanup_summary\.j2", {"roles/gpu_cleanup/tasks/summary.yml"}),
], ids=["transient unit", "health wait", "job wait", "nvidia-smi query", "venv build", "cleanup summary"])  # fmt: skip
def test_one_home_per_shape(pattern: str, home: set[str]):
    assert _homes(pattern) == home


def test_nothing_reaches_outside_the_collection():
    """An installed collection has no checkout around it: no playbook_dir/.. or config-relative paths, and a role
    reaches into the collection root only for what the collection ships (not excluded by galaxy.yml)."""
    ignored = set(yaml.safe_load((ROOT / "galaxy.yml").read_text())["build_ignore"])
    for path in [*PLAYBOOKS, *ROOT.glob("roles/*/*/*.yml")]:
        text = path.read_text()
        assert "playbook_dir" not in text and "ansible_config_file" not in text, path
        for target in re.findall(r"role_path \}\}/\.\./\.\./([\w./-]+)", text):
            assert target.split("/")[0] not in ignored and (ROOT / target).exists(), f"{path}: {target}"


# The stage tags that run in no runtime of the playbook's: gpu_cleanup only stops processes, and the router has
# an environment of its own (sglang_router installs it under the same tag).
NO_RUNTIME = {"always", "never", "runtime", "cleanup", "router"}


@pytest.mark.parametrize("name", ["train.yml", "deploy.yml"])
def test_a_stage_tag_selects_the_runtimes_the_stage_runs_in(name: str, tmp_path: Path):
    """--tags data on a fresh trainer (or --tags serve on a fresh server) installs the runtime the stage runs in,
    as Ansible itself resolves the tags (inherited, applied, anchored): every task tagged runtime is tagged with
    each stage tag of the playbook's plays too."""
    playbook = ROOT / "playbooks" / name
    stages = set()
    for play in yaml.safe_load(playbook.read_text()):
        tasks = _tasks([*(play.get("pre_tasks") or []), *(play.get("tasks") or [])])
        for entry in [*(play.get("roles") or []), *tasks]:
            stages |= set(entry.get("tags") or []) if isinstance(entry, dict) else set()
    stages -= NO_RUNTIME
    assert stages, f"{name}: no stage tags found"
    (tmp_path / "hosts.yml").write_text("all:\n  children: {trainers: {hosts: {}}, servers: {hosts: {}}}\n")
    proc = run_playbook(playbook, "--list-tasks", "-i", str(tmp_path / "hosts.yml"), timeout=300)
    listed = [(line.strip(), set(m[1].split(", "))) for line in proc.stdout.splitlines()
              if (m := re.search(r"TAGS: \[([^]]*)\]", line))]  # fmt: skip
    runtime = [(line, tags) for line, tags in listed if "runtime" in tags]
    assert len(runtime) >= 3, proc.stdout  # the fingerprint check, the install, the fingerprint's record
    for line, tags in runtime:
        assert "always" in tags or stages <= tags, f"{name}: {line!r} is not selected by {sorted(stages - tags)}"
