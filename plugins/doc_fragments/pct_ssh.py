"""Documentation fragment: every option of ansible-core's ssh connection, for plugins built on it.

The pct connection subclasses the OpenSSH connection, so it must accept exactly the options the
installed ansible-core's ssh plugin reads (ControlPersist, ssh_args, ...). Deriving them here at
import time keeps the two in step across ansible-core releases instead of copying a snapshot.
The ssh target of a pct connection is the container's hypervisor, so the address, port and user
options also take ``pct_hypervisor_*`` variables (those win over ``ansible_host`` and friends).
"""

from __future__ import annotations

import copy
import importlib

import yaml
from ansible.plugins.connection import ssh

_HYPERVISOR_VARS = {
    "host": "pct_hypervisor_host",
    "port": "pct_hypervisor_port",
    "remote_user": "pct_hypervisor_user",
}


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
    # lxc-attach allocates its own pty when stdin is a terminal; a forced ssh tty adds nothing but
    # CR/LF noise, so the pct connection defaults to no tty (become via sudo needs none).
    options["use_tty"]["default"] = False
    return options


class ModuleDocFragment:
    DOCUMENTATION = yaml.safe_dump({"options": _options()}, sort_keys=False)
