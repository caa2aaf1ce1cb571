"""Which variables a role's files and a playbook's plays read: every Jinja expression in them (templated strings, the
bare expressions of when/until/changed_when/failed_when/that, templates), parsed by Jinja itself."""

from __future__ import annotations

import importlib.util
import warnings
from typing import Any

import jinja2
import yaml
from jinja2 import meta

from tests.modules import ROOT

# Keys whose values are bare Jinja expressions.
EXPRESSIONS = {"when", "until", "changed_when", "failed_when", "that"}
# Ansible's own names: the run's context, functions and files (every role file is in the collection's digest, which
# every fingerprint takes), never an input of a stage by name. What a role takes from other hosts (hostvars, groups)
# comes into a fingerprint through a variable it declares (_sglang_router_argv, _lab_host_fleet).
ANSIBLE_NAMES = {
    "ansible_check_mode": "check mode never keeps a fingerprint",
    "ansible_managed": "a comment in the files written",
    "ansible_failed_result": "a rescued task's error",
    "ansible_playbook_python": "the controller's interpreter, which runs controller-side scripts",
    "ansible_run_tags": "which part of the stage runs (a partial run keeps no fingerprint)",
    "ansible_skip_tags": "which part of the stage runs (a partial run keeps no fingerprint)",
    "ansible_limit": "which hosts the run takes",
    "ansible_host": "the address the connection uses",
    "ansible_play_hosts": "the play's hosts; each host keeps its own fingerprint",
    "ansible_play_hosts_all": "the play's hosts; each host keeps its own fingerprint",
    "inventory_hostname": "the host itself; each host keeps its own fingerprint",
    "hostvars": "other hosts' variables, taken in through declared inputs",
    "groups": "the inventory's groups, taken in through declared inputs",
    "playbook_dir": "where the playbook is",
    "inventory_dir": "where the inventory is",
    "role_path": "the role's own files, in the collection's digest",
    "lookup": "a function",
    "query": "a function",
    "q": "a function",
    "now": "a function",
    "range": "a function",
    "omit": "Ansible's placeholder for an option left out",
    "item": "a loop's item",
}


class _Anything(dict):
    """Every filter and test name is known: reading names needs the syntax, not Ansible's plugins."""

    def __contains__(self, key: object) -> bool:
        return True

    def __getitem__(self, key: str) -> Any:
        return lambda *args, **kwargs: None

    def get(self, key: str, default: Any = None) -> Any:
        return self[key]


_ENV = jinja2.Environment(extensions=["jinja2.ext.do", "jinja2.ext.loopcontrols"])  # noqa: S701 - parsed, never rendered
_ENV.filters = _Anything()
_ENV.tests = _Anything()


def names_in(source: str, bare: bool = False) -> set[str]:
    """The variables a Jinja template (or, ``bare``, an expression) reads and does not set itself."""
    with warnings.catch_warnings():  # a regular expression's backslashes in a string literal, as Ansible reads them
        warnings.simplefilter("ignore", DeprecationWarning)
        return set(meta.find_undeclared_variables(_ENV.parse("{{ " + source + " }}" if bare else source)))


def _walk(node: Any, key: str | None, reads: set[str], defined: set[str]) -> None:
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "register" and isinstance(v, str):
                defined.add(v)
            elif k in ("ansible.builtin.set_fact", "vars") and isinstance(v, dict):
                defined.update(v)
            elif k == "ansible.builtin.include_vars" and isinstance(v, dict) and "name" in v:
                defined.add(v["name"])
            elif k == "loop_control" and isinstance(v, dict) and "loop_var" in v:
                defined.add(v["loop_var"])
            _walk(v, k, reads, defined)
    elif isinstance(node, list):
        for v in node:
            _walk(v, key, reads, defined)
    elif isinstance(node, str):
        if key in EXPRESSIONS and "{{" not in node:
            reads |= names_in(node, bare=True)
        elif "{{" in node or "{%" in node:
            reads |= names_in(node)


def yaml_reads(data: Any) -> tuple[set[str], set[str]]:
    """(read, set) of a YAML document: the variables its expressions read, and those it registers or sets."""
    reads: set[str] = set()
    defined: set[str] = set()
    _walk(data, None, reads, defined)
    return reads, defined


def role_reads(role: str) -> tuple[set[str], set[str]]:
    """(read, defined here) of a role: what its tasks, handlers, vars, defaults and templates read, and what it
    registers, sets or defines in its vars (its private variables)."""
    base = ROOT / "roles" / role
    reads: set[str] = set()
    defined: set[str] = set()
    for part in ("tasks", "handlers"):
        for path in sorted((base / part).glob("*.yml")):
            r, d = yaml_reads(yaml.safe_load(path.read_text()))
            reads |= r
            defined |= d
    for part in ("vars", "defaults"):
        path = base / part / "main.yml"
        if path.exists():
            data = yaml.safe_load(path.read_text()) or {}
            r, d = yaml_reads(data)
            reads |= r
            defined |= d | (set(data) if part == "vars" else set())
    templates = base / "templates"
    for path in sorted(templates.rglob("*")) if templates.exists() else []:
        if path.is_file():
            reads |= names_in(path.read_text())
    return reads, defined


def playbook_reads(name: str) -> set[str]:
    reads, defined = yaml_reads(yaml.safe_load((ROOT / "playbooks" / name).read_text()))
    return reads - defined


def _role_readmes() -> Any:
    """scripts/role_readmes.py, where the one reader of role references lives (its READMEs' "Used by" and these
    tests read roles alike)."""
    spec = importlib.util.spec_from_file_location("eagle3_role_readmes", ROOT / "scripts" / "role_readmes.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


roles_used = _role_readmes().roles_used


def roles_reached(start: set[str]) -> set[str]:
    """``start`` and every role their task files name, transitively."""
    seen: set[str] = set()
    todo = list(start)
    while todo:
        role = todo.pop()
        if role in seen:
            continue
        seen.add(role)
        for path in sorted((ROOT / "roles" / role / "tasks").glob("*.yml")):
            todo += roles_used(yaml.safe_load(path.read_text()))
    return seen
