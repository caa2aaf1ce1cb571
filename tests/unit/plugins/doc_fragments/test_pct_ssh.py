"""The pct_ssh fragment is a literal copy of the options ansible-core's ssh connection reads: it must not drift."""

from __future__ import annotations

import copy
import importlib

import yaml
from ansible.plugins.connection import ssh

from tests.modules import ROOT

_HYPERVISOR_VARS = {
    "host": "pct_hypervisor_host",
    "port": "pct_hypervisor_port",
    "remote_user": "pct_hypervisor_user",
}


def _mark_core_versions(node: object) -> None:
    """Every version_added copied from ansible-core's ssh plugin is an ansible-core version, not ours."""
    if isinstance(node, dict):
        if "version_added" in node:
            node.setdefault("version_added_collection", "ansible.builtin")
        for value in node.values():
            _mark_core_versions(value)
    elif isinstance(node, list):
        for value in node:
            _mark_core_versions(value)


def _options() -> dict:
    doc = yaml.safe_load(ssh.DOCUMENTATION)
    options = copy.deepcopy(doc["options"])
    # Resolve ssh's own fragments (connection_pipelining) the way Ansible does: its own keys win.
    fragments = doc.get("extends_documentation_fragment") or []
    for name in [fragments] if isinstance(fragments, str) else fragments:
        module = importlib.import_module(f"ansible.plugins.doc_fragments.{name}")
        for key, value in yaml.safe_load(module.ModuleDocFragment.DOCUMENTATION).get("options", {}).items():
            options[key] = {**value, **options.get(key, {})}
    for name, var in _HYPERVISOR_VARS.items():
        option = options[name]
        # Later entries take precedence in Ansible's variable lookup.
        option["vars"] = [*option.get("vars", []), {"name": var}]
        desc = option.get("description", [])
        desc = [desc] if isinstance(desc, str) else list(desc)
        option["description"] = [*desc, f"For a pct connection this is the hypervisor's; V({var}) overrides."]
    _mark_core_versions(options)
    # lxc-attach allocates its own pty when stdin is a terminal; a forced ssh tty adds nothing but
    # CR/LF noise, so the pct connection defaults to no tty (become via sudo needs none).
    options["use_tty"]["default"] = False
    return options




def test_the_fragment_matches_the_installed_ssh_plugin():
    import importlib.util

    spec = importlib.util.spec_from_file_location("pct_ssh", ROOT / "plugins" / "doc_fragments" / "pct_ssh.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = yaml.safe_load(module.ModuleDocFragment.DOCUMENTATION)["options"]
    derived = _options()
    regenerated = yaml.safe_dump({"options": derived}, sort_keys=False)
    assert committed == derived, f"ansible-core's ssh options changed; paste this into pct_ssh.py:\n{regenerated}"
