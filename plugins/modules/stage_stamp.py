#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tell whether a stage has nothing to do on a host (its fingerprint matches the last run's), or keep one."""

from __future__ import annotations

DOCUMENTATION = r"""
module: stage_stamp
short_description: Check a stage's fingerprint against the one kept after its last complete run, or keep it
description:
  - A stage (C(deploy), C(train), C(router)) is converged on a host when everything it reads and writes is as its
    last complete run left it and what it started still runs. The playbooks check this first, in one call per
    host, and skip the whole stage where it holds; a stage that runs says which inputs changed.
  - The fingerprint is a map of digests. On the controller (the action plugin) the values of the stage's declared
    inputs (the variables named in the C(meta/inputs.yml) of each role in O(roles), and those in O(vars)), the
    contents of controller files (O(controller_files)) and the collection's own files; on the host every entry
    under O(paths) (type, size, mtime and inode, contents not read) and the contents of O(contents).
  - Liveness is checked, not kept - O(units) active, O(probes) holding, O(urls) answering, the worker listed healthy
    by O(router); a stage whose server died is not converged even if nothing else changed.
  - C(state=record) writes the fingerprint atomically (a temporary file renamed over the stamp), after the stage
    completed; C(state=check) changes nothing.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  stage:
    description: The stage's name; one stamp per stage and host.
    type: str
    required: true
  state:
    description: V(check) compares; V(record) keeps the fingerprint given by a check of the same run (O(controller)).
    type: str
    choices: [check, record]
    default: check
  dir:
    description: Where the host keeps its stamps.
    type: path
    default: /var/lib/eagle3-ops/stamps
  vars:
    description:
      - Names of variables whose templated values are part of the fingerprint, beyond those of O(roles). Read by the
        action plugin on the controller; a value that cannot be templated yet is kept as written, a variable not
        defined is left out. Variables whose names say password, passphrase, secret, api key or private key are never
        fingerprinted (a digest of a short secret can be guessed).
    type: list
    elements: str
    default: []
  roles:
    description:
      - Roles of this collection whose declared inputs (the C(inputs) list of their C(meta/inputs.yml)) are part of
        the fingerprint, as if named in O(vars).
    type: list
    elements: str
    default: []
  controller_files:
    description: Controller files whose contents are part of the fingerprint (a prompts file); a missing one is absent.
    type: list
    elements: path
    default: []
  controller:
    description:
      - The controller's digests. Set by the action plugin on a check; a record passes the check's
        RV(controller) so both describe the same inputs.
    type: dict
    default: {}
  paths:
    description: Host files and directories whose entries are part of the fingerprint (at most 20000 entries each).
    type: list
    elements: path
    default: []
  contents:
    description: Host files whose contents are part of the fingerprint (unit files, manifests).
    type: list
    elements: path
    default: []
  units:
    description: systemd units that must be active for the stage to be converged.
    type: list
    elements: str
    default: []
  urls:
    description: URLs that must answer with a 2xx status for the stage to be converged.
    type: list
    elements: str
    default: []
  router:
    description: A router (smg's C(/workers)) that must list O(router.worker) as healthy.
    type: dict
    suboptions:
      url:
        description: The router's base URL.
        type: str
        required: true
      worker:
        description: The worker's URL as the router lists it.
        type: str
        required: true
      admin_key:
        description: The router's control-plane admin key, sent with its C(/workers) read; never logged.
        type: str
  timeout:
    description: Seconds each URL may take to answer.
    type: float
    default: 5
  reads:
    description:
      - Read-only commands (name to argv, no shell) run on the host in the same call when the stage is not
        converged - what the plays after the check would each read in a round trip of their own (deploy.yml's
        setting switch takes the GPUs, the SGLang release and the draft's config from here). Nothing is read when
        the stage is converged, as nothing follows.
      - Each answers as C(raw) would (C(rc), C(stdout), C(stderr)); a command that cannot start answers rc 127, one
        that does not end within 30 s rc 124.
    type: dict
    default: {}
  probes:
    description:
      - Liveness commands (no shell) that must hold for the stage to be converged, run at once on the host - a
        daemon's C(pgrep --pidfile), a port's C(ss -ltn), a container's C(lxc-info -s) -, for what is neither a
        systemd unit nor an HTTP endpoint. Checked, not kept, and only when the fingerprint matches.
      - A probe holds when its command exits 0 and, where O(probes[].stdout) is given, prints a line that matches it.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: What the probe shows, for the reason (C(lab sshd of pve-lab runs)).
        type: str
        required: true
      argv:
        description: The command.
        type: list
        elements: str
        required: true
      stdout:
        description: A regular expression (searched line by line) its output must match.
        type: str
attributes:
  check_mode:
    description: A check runs as usual; a record says whether it would change the stamp and writes nothing.
    support: full
  diff_mode:
    description: A record shows the stamp's fingerprint before and after.
    support: full
notes:
  - A record reports C(changed) when the kept fingerprint differs; playbooks treat it as bookkeeping.
"""

EXAMPLES = r"""
- name: Is the deploy converged here?
  eagle3.ops.stage_stamp:
    stage: deploy
    roles: [sglang_serve]
    vars: [draft_tokens]
    paths: [/srv/eagle3/drafts/tiny-llama-eagle3]
    contents: [/etc/systemd/system/sglang.service]
    units: [sglang]
    urls: ['http://127.0.0.1:30000/health']
  register: deploy_stamp

- name: Keep the fingerprint after a complete deploy
  eagle3.ops.stage_stamp:
    stage: deploy
    state: record
    controller: "{{ deploy_stamp.controller }}"
    paths: [/srv/eagle3/drafts/tiny-llama-eagle3]
    contents: [/etc/systemd/system/sglang.service]
"""

RETURN = r"""
converged:
  description: The stamp matches and everything that must run runs (C(state=check)).
  returned: always
  type: bool
reason:
  description: Why the stage is not converged (no stamp, which inputs changed, what is down); empty when it is.
  returned: always
  type: str
changed_keys:
  description: The fingerprint's keys that differ from the stamp (C(var:NAME), C(stat:PATH), ...).
  returned: always
  type: list
  elements: str
reads:
  description: What each of O(reads) answered (C(rc), C(stdout), C(stderr)), by name.
  returned: when O(reads) is given and the stage is not converged (C(state=check))
  type: dict
fingerprint:
  description: The digest of the whole fingerprint.
  returned: always
  type: str
controller:
  description: The controller's digests this check used (pass them to the record of the same run).
  returned: always
  type: dict
paths:
  description: The host paths fingerprinted (O(paths)); a record of the same run passes them back, so that both
    describe the same files even where a variable resolves differently once the stage ran.
  returned: always
  type: list
  elements: str
contents:
  description: The host files whose contents were fingerprinted (O(contents)), for the record of the same run.
  returned: always
  type: list
  elements: str
dir:
  description: Where the stamp is kept (O(dir)), for the record of the same run.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._stamp import ARGUMENT_SPEC, StageStamp, StampError


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        stamp = StageStamp(module.params)
        out = stamp.check() if module.params["state"] == "check" else stamp.record(module.check_mode)
        module.exit_json(**stamp.answer(out))
    except StampError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
