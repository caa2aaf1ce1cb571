"""The preload callback: the project's ansible.cfg enables it, and loading it leaves the connection plugins' option
definitions, the collection's filter plugins and the collection's digest in the process (where every task's fork finds
them, instead of reading pct's documentation and compiling the collection's files again).

Each check runs in a fresh Python: ansible's configuration is process-wide, and a test before this one in the same
worker may have loaded the connection plugin already."""

from __future__ import annotations

import os

from tests.modules import ROOT
from tests.unit.plugins.callback.fresh import run_fresh

CHECK = """
import json
from ansible import constants as C
from tests.modules import init_collection_loader
init_collection_loader()
from ansible.plugins.loader import callback_loader
PCT = "ansible_collections.eagle3.ops.plugins.connection.pct"  # the name the loader keeps its options under
before = C.config.has_configuration_definition("connection", PCT)
from ansible_collections.eagle3.ops.plugins.plugin_utils import _collection
digest_before = list(_collection._digest)
from ansible._internal._templating._jinja_bits import AnsibleEnvironment
import sys
router_before = "ansible_collections.eagle3.ops.plugins.filter.router" in sys.modules
cb = callback_loader.get("eagle3.ops.preload")
cb.set_options()
kept = list(_collection._digest)
_collection._digest.clear()  # computed again from the files
print(json.dumps({"enabled": list(C.CALLBACKS_ENABLED), "before": before, "loaded": cb.loaded,
                  "jinja": cb.jinja_plugins, "router_before": router_before,
                  "router": "ansible_collections.eagle3.ops.plugins.filter.router" in sys.modules,
                  "digest_before": digest_before, "digest": kept, "reported": cb.digest,
                  "fresh": _collection.collection_digest(),
                  "after": C.config.has_configuration_definition("connection", PCT),
                  "template_cache": cb.template_cache, "local_tmp": str(C.DEFAULT_LOCAL_TMP),
                  "compile": AnsibleEnvironment.compile.__module__}))
"""


def _check(**env: str) -> dict:
    return run_fresh(CHECK, **env)


def test_the_project_enables_it_and_it_loads_the_connection_definitions():
    got = _check()
    assert "eagle3.ops.preload" in got["enabled"]
    assert got["before"] is False  # nothing had loaded pct's definitions before the callback
    assert got["after"] is True
    assert got["loaded"] == ["eagle3.ops.pct", "ansible.builtin.ssh", "ansible.builtin.local"]
    # The collection's filter plugins are imported where the forks find them (none had been before)
    filters = sorted(f"eagle3.ops.filter.{f.stem}" for f in (ROOT / "plugins" / "filter").glob("*.py"))
    assert sorted(got["jinja"]) == filters and filters
    assert got["router_before"] is False and got["router"] is True
    # The digest kept for the forks is the collection's (the same when computed again from the files)
    assert got["digest_before"] == [] and got["digest"] == [got["reported"]] == [got["fresh"]]
    # Templates are shared by the run's forks, in a directory inside Ansible's own per-run one (removed at its end)
    assert got["template_cache"] == os.path.join(got["local_tmp"], "eagle3-templates")
    assert got["compile"].endswith("plugin_utils._template_cache")


def test_the_template_cache_can_be_turned_off():
    got = _check(EAGLE3_PRELOAD_TEMPLATE_CACHE="false")
    assert got["template_cache"] is None and got["compile"] == "jinja2.environment"


def test_a_plugin_that_does_not_load_is_left_to_its_task():
    got = _check(EAGLE3_PRELOAD_CONNECTIONS="eagle3.ops.nothing_by_that_name,ansible.builtin.local")
    assert got["loaded"] == ["ansible.builtin.local"]
    assert got["after"] is False


def test_the_jinja_collections_are_an_option():
    got = _check(EAGLE3_PRELOAD_JINJA_COLLECTIONS="no_such.collection")
    assert got["jinja"] == [] and got["router"] is False
