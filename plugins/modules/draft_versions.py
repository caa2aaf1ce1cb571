#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: draft_versions
short_description: Record which immutable draft version each server serves, and collect the ones none serves
description:
  - Works on a draft root that M(eagle3.ops.eagle3_export) fills with immutable versions
    (O(eagle3.ops.eagle3_export#module:versions)), on storage every server mounts. Its C(versions.json)
    records the version each server serves (C(servers)), the newest one served (C(current)) and the one before it
    (C(previous)).
  - O(state=served) records that O(host) serves O(version) now (it passed its gates); a version served for the
    first time becomes C(current) and the one before C(previous).
  - O(state=collected) removes the versions no server serves, keeping C(current), C(previous) and the newest
    O(keep), and staging directories an export left behind more than a day ago.
  - Writers of the record are serialised across the hosts that mount the root (the lock the exports take).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  root:
    description: The draft root (eagle3_draft_path).
    type: path
    required: true
  state:
    description: Record a server's version (V(served)) or remove the versions nobody needs (V(collected)).
    type: str
    choices: [served, collected]
    default: served
  host:
    description: The server, as the inventory names it (O(state=served)).
    type: str
  version:
    description: The version it serves, a directory under O(root) (O(state=served)).
    type: str
  keep:
    description: How many of the newest versions O(state=collected) keeps besides those served.
    type: int
    default: 3
  lock_timeout:
    description: Seconds to wait for another run holding the root's lock before failing.
    type: float
    default: 300
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff shows the record before and after.
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: This server serves the version the export made
  eagle3.ops.draft_versions:
    root: /srv/share/drafts/kimi
    host: "{{ inventory_hostname }}"
    version: "{{ __export.version }}"

- name: Remove the versions no server serves, keeping the newest three
  eagle3.ops.draft_versions:
    root: /srv/share/drafts/kimi
    state: collected
    keep: 3
  run_once: true
"""

RETURN = r"""
record:
  description: The record after the change (or as it would be, in check mode).
  returned: success
  type: dict
  sample: {"servers": {"srv1": "3f9c2a7be01d44c5"}, "current": "3f9c2a7be01d44c5", "previous": "9ab0c1d2e3f40516",
           "history": ["9ab0c1d2e3f40516", "3f9c2a7be01d44c5"]}
removed:
  description: The versions (and stale staging directories) removed, or that would be, by O(state=collected).
  returned: success
  type: list
  elements: str
"""

import json
import os
import shutil
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._journal import CheckpointLock
from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import SafetensorsError
from ansible_collections.eagle3.ops.plugins.module_utils._versions import (
    VersionError,
    collectable,
    is_version,
    read_record,
    record_served,
    stale_staging,
    write_record,
)

ARGUMENT_SPEC = {
    "root": {"type": "path", "required": True},
    "state": {"type": "str", "choices": ["served", "collected"], "default": "served"},
    "host": {"type": "str"},
    "version": {"type": "str"},
    "keep": {"type": "int", "default": 3},
    "lock_timeout": {"type": "float", "default": 300},
}


class DraftVersions:
    """One change to a draft root's record or versions, under the root's lock (none in check mode)."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.root = self.p["root"].rstrip("/")
        self.result: dict = {"changed": False, "removed": []}

    def run(self) -> None:
        if not os.path.isdir(self.root) and self.module.check_mode:
            # the export that would make the root made nothing in check mode: a version would be recorded
            self.result.update(changed=self.p["state"] == "served", record={})
            return
        if not os.path.isdir(self.root):
            raise VersionError(f"The draft root {self.root} does not exist: export a draft first (deploy.yml), or "
                               "point eagle3_draft_path at it")
        if self.p["state"] == "served":
            self.check_served()
        if self.module.check_mode:
            self.change()
            return
        with CheckpointLock(self.root, self.p["lock_timeout"], "draft_versions"):
            self.change()

    def check_served(self) -> None:
        version = self.p["version"] or ""
        if not self.p["host"]:
            raise VersionError("host is empty: name the server that serves the version")
        there = os.path.isfile(os.path.join(self.root, version, "config.json"))
        if not is_version(version) or not (there or self.module.check_mode):  # check mode: an export that would be
            raise VersionError(f"{version!r} is not a draft version under {self.root}: pass the version eagle3_export "
                               "returned (its 'version')")

    def change(self) -> None:
        record = read_record(self.root)
        before = json.dumps(record, indent=2, sort_keys=True) + "\n"
        if self.p["state"] == "served":
            changed = record_served(record, self.p["host"], self.p["version"])
        else:
            gone = collectable(self.root, record, self.p["keep"]) + stale_staging(self.root)
            self.result["removed"] = [os.path.basename(p) for p in gone]
            changed = bool(gone)
            if not self.module.check_mode:
                for name in gone:
                    shutil.rmtree(os.path.join(self.root, name))
        self.result.update(changed=changed, record=record)
        if self.module._diff:
            self.result["diff"] = {"before": before, "after": json.dumps(record, indent=2, sort_keys=True) + "\n",
                                   "before_header": os.path.join(self.root, "versions.json"),
                                   "after_header": os.path.join(self.root, "versions.json")}  # fmt: skip
        if changed and self.p["state"] == "served" and not self.module.check_mode:
            write_record(self.root, record)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_if=[("state", "served", ("host", "version"))])  # fmt: skip
    versions = DraftVersions(module)
    try:
        versions.run()
    except (VersionError, SafetensorsError) as exc:
        module.fail_json(msg=str(exc), **versions.result)
    except OSError as exc:
        module.fail_json(msg=f"Changing the draft root {versions.root} failed at {exc.filename or versions.root} "
                         f"({exc.strerror}): fix its permissions or free space, then rerun, which converges.",
                         **versions.result)  # fmt: skip
    except Exception as exc:
        module.fail_json(msg=f"draft_versions failed unexpectedly: {exc}", exception=traceback.format_exc(),
                         **versions.result)
    module.exit_json(**versions.result)


if __name__ == "__main__":
    main()
