"""Templates compiled once per run (eagle3.ops.preload's template_cache): a fork loads what another fork of the run
compiled, and renders exactly what ansible-core renders without it - backslash escaping, template overrides, lazy
variables and filters included; a compile error is kept nowhere.

Each check runs in a fresh Python, as test_preload.py's do: the cache patches the process's Jinja environment class."""

from __future__ import annotations

from pathlib import Path

from tests.unit.plugins.callback.fresh import run_fresh

CHECK = r"""
import json, os, sys
from tests.modules import init_collection_loader
init_collection_loader()
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template
from ansible_collections.eagle3.ops.plugins.plugin_utils import _template_cache as tc

VARIABLES = {"name": "ct130", "tokens": 16, "steps": trust_as_template("{{ tokens - 1 }}"), "items": [3, 1, 2],
             "path": "C:\\new\\table", "spec": {"mode": "chain", "draft": "/srv/eagle3/drafts/x"}}
CASES = [
    ("{{ name }} serves {{ tokens }} draft tokens", {}),
    ("{{ steps | int + 1 }}", {}),                                   # a variable that is itself a template
    ("{{ items | sort | map('string') | join(',') }}", {}),
    ("{{ 'a\\nb' }}", {}),                                           # Ansible escapes backslashes in expressions
    ("{{ 'a\\nb' }}", {"escape_backslashes": False}),                # ... unless told not to: another compile
    ("{{ path }}", {}),
    ("{% if spec.mode == 'chain' %}{{ spec.draft | basename }}{% endif %}", {}),
    ("<< tokens >>", {"overrides": {"variable_start_string": "<<", "variable_end_string": ">>"}}),
    ("{{ tokens }}\n\n", {"preserve_trailing_newlines": True}),
]


def render():
    templar = Templar(loader=DataLoader(), variables=VARIABLES)
    return [repr(templar.template(trust_as_template(src), **kw)) for src, kw in CASES]


without = render()
directory = tc.install(sys.argv[1])
first, after_first = render(), tc.stats()
kept = sorted(os.listdir(directory))
again, after_again = render(), tc.stats()
try:
    Templar(loader=DataLoader(), variables=VARIABLES).template(trust_as_template("{{ name | }}"))
    error = None
except Exception as exc:
    error = type(exc).__name__
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # another fork of the same run: a fresh process memory, the run's directory
    os.close(read)
    tc._memo.clear()
    tc._state.update(hits=0, misses=0)
    os.write(write, json.dumps({"rendered": render(), "stats": tc.stats()}).encode())
    os._exit(0)
os.close(write)
chunks = []
while chunk := os.read(read, 65536):
    chunks.append(chunk)
os.waitpid(pid, 0)
print(json.dumps({"without": without, "first": first, "after_first": after_first, "kept": kept,
                  "again": again, "after_again": after_again, "error": error,
                  "kept_after_error": sorted(os.listdir(directory)), "fork": json.loads(b"".join(chunks))}))
"""


def _check(tmp_path: Path) -> dict:
    return run_fresh(CHECK, str(tmp_path / "templates"))


def test_a_fork_loads_what_another_compiled_and_renders_what_ansible_renders(tmp_path):
    got = _check(tmp_path)
    # The same results as ansible-core's own compile, in the compiling process and in a later fork.
    assert got["first"] == got["without"] == got["again"] == got["fork"]["rendered"]
    assert got["without"][1] == "16"  # the variable that is a template was rendered too
    assert got["without"][3] != got["without"][4]  # the escaping changed what the expression compiled to
    # Every distinct compile kept once (the two escapings of one source are two), none of them twice.
    compiled = got["after_first"]["misses"]
    assert compiled == len(got["without"]) + 1 and len(got["kept"]) == compiled  # + the variable's own template
    assert not [name for name in got["kept"] if name.startswith(".tmp-")]
    # The same process again: nothing compiled; the fork: everything loaded from the run's directory.
    assert got["after_again"]["misses"] == compiled
    assert got["fork"]["stats"] == {"hits": compiled, "misses": 0}
    # A template that does not compile fails as it does without the cache, and leaves nothing.
    assert got["error"] is not None and got["kept_after_error"] == got["kept"]
