# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Load once, in the controller's main process, what every task's fork would otherwise load again: the connection
plugins, the collections' filter and test plugins and the collection's digest; and share the templates a fork
compiles with the run's later forks."""

from __future__ import annotations

DOCUMENTATION = r"""
name: preload
type: aggregate
short_description: Load the connection, filter and test plugins and the collection's digest once, before the first fork
description:
  - Ansible runs every task of every host in a fork of the controller's main process, and a fork's caches die
    with it. The main process itself never loads a connection plugin, so each fork loads the host's connection
    plugin again - its module and, before anything else, its option definitions, read from its documentation with
    every fragment it extends. For C(eagle3.ops.pct), which carries every option of ansible-core's C(ssh), that was
    about a quarter of the controller's CPU per task in a setting switch (py-spy over C(deploy.yml)), paid again by
    every task of every container, a C(set_fact) included.
  - This callback loads the connection plugins listed in O(connections) once, when Ansible loads its callbacks
    (before the first task), so that every fork finds them loaded. It prints nothing and changes no result; a
    plugin that cannot be loaded is left to the task that uses it, which reports it as it would have.
  - It imports the filter and test plugins of the collections in O(jinja_collections) too. A template that names a
    collection's filter (C(eagle3.ops.worker_url)) makes ansible-core look it up when the template compiles, even in
    a branch that never runs, and the lookup imports the collection's filter files - compiled from source, since
    ansible-core's collection loader keeps no bytecode - in the fork, again for every task of every host. In
    C(status.yml) over 16 containers that was about 0.2 s of the controller's CPU (the role's router address, a
    default that names C(eagle3.ops.worker_url)), and about 0.15 s of the run's wall time on 2 cores. Imported
    here, the forks find them in C(sys.modules).
  - It also computes the collection's digest, a part of every stage's fingerprint (C(eagle3.ops.stage_stamp)). Each
    fingerprint check, one per host and stage, walked and read the collection's files again in its fork, about 40
    ms of the controller's CPU each. The collection a run uses is the one it started with.
  - With O(template_cache), templates are compiled once per run instead of once per task. ansible-core compiles every
    template it renders (a parse, Python code generation and C(compile)), in the task's fork, so the same role
    defaults, conditions and arguments were compiled again by every task that used them - a setting switch of
    C(deploy.yml) compiled 996 templates, 186 of them distinct, in about 1.9 s of the controller's CPU. A compiled
    template is kept, marshalled, in a directory inside Ansible's per-run temporary directory (where ansible-core
    keeps its AnsiballZ cache the same way, removed when the run ends), keyed by its source, name and file name, the
    environment's lexer and code generation settings, Ansible's backslash escaping for that compile and the Python,
    Jinja and ansible-core releases; a later fork of the run loads it. A compile error is never kept.
  - Enable it in C(ansible.cfg) (C(callbacks_enabled = eagle3.ops.preload)), as the project's C(ansible.cfg)
    does; the playbooks run the same without it, only slower.
author: eagle3-ops contributors (@eagle3-ops)
version_added: "0.1.0"
options:
  connections:
    description: Connection plugins to load (the ones the eagle3.ops inventories use).
    type: list
    elements: str
    default: [eagle3.ops.pct, ansible.builtin.ssh, ansible.builtin.local]
    ini:
      - section: callback_eagle3_preload
        key: connections
    env:
      - name: EAGLE3_PRELOAD_CONNECTIONS
  jinja_collections:
    description: Collections whose filter and test plugins are imported once, before the first fork.
    type: list
    elements: str
    default: [eagle3.ops]
    ini:
      - section: callback_eagle3_preload
        key: jinja_collections
    env:
      - name: EAGLE3_PRELOAD_JINJA_COLLECTIONS
  template_cache:
    description:
      - Share the templates one fork compiles with the later forks of the same run (see above). False compiles every
        template in every fork, as ansible-core does.
    type: bool
    default: true
    ini:
      - section: callback_eagle3_preload
        key: template_cache
    env:
      - name: EAGLE3_PRELOAD_TEMPLATE_CACHE
requirements:
  - enabled in ansible.cfg (callbacks_enabled = eagle3.ops.preload)
"""

import importlib
import pkgutil

from ansible.plugins.callback import CallbackBase
from ansible.plugins.loader import connection_loader
from ansible_collections.eagle3.ops.plugins.plugin_utils import _template_cache
from ansible_collections.eagle3.ops.plugins.plugin_utils._collection import collection_digest


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "eagle3.ops.preload"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []
        self.jinja_plugins: list[str] = []
        self.digest = ""
        self.template_cache: str | None = None

    def set_options(self, task_keys=None, var_options=None, direct=None) -> None:  # type: ignore[no-untyped-def]
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        for name in self.get_option("connections") or []:
            try:
                # class_only: the module and its option definitions, no connection object
                if connection_loader.get(name, class_only=True) is not None:
                    self.loaded.append(name)
            except Exception as exc:  # left to the task that uses the plugin, which reports it
                self._display.vvv(f"eagle3.ops.preload: {name} not preloaded: {exc}")
        for collection in self.get_option("jinja_collections") or []:
            self.jinja_plugins.extend(self._import_jinja_plugins(collection))
        try:
            self.digest = collection_digest()
        except OSError as exc:  # left to the first fingerprint check, which fails naming the file
            self._display.vvv(f"eagle3.ops.preload: the collection's digest not computed: {exc}")
        if self.get_option("template_cache"):
            try:
                self.template_cache = _template_cache.install()
            except OSError as exc:  # every template compiles in its fork, as without the callback
                self._display.vvv(f"eagle3.ops.preload: templates not shared between forks: {exc}")

    def _import_jinja_plugins(self, collection: str) -> list[str]:
        """The Python modules of a collection's filter and test plugins, imported under the names ansible-core's
        Jinja plugin loader looks them up by (it takes a module already in sys.modules as it is)."""
        imported = []
        for kind in ("filter", "test"):
            package = f"ansible_collections.{collection}.plugins.{kind}"
            try:
                found = importlib.import_module(package)
            except ImportError:  # no such collection, or none of this kind in it
                continue
            for info in pkgutil.iter_modules(getattr(found, "__path__", [])):
                if info.ispkg:
                    continue
                try:
                    importlib.import_module(f"{package}.{info.name}")
                    imported.append(f"{collection}.{kind}.{info.name}")
                except Exception as exc:  # left to the template that uses it, which reports it as it would have
                    self._display.vvv(f"eagle3.ops.preload: {package}.{info.name} not preloaded: {exc}")
        return imported
