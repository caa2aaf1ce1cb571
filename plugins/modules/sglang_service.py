#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A server's unit, its restart, its health and its gates in one call, rolled back on failure."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_service
short_description: Install a server's systemd unit, restart it, wait for its health and gate it, in one call
description:
  - Writes the unit file (atomically, only when its text differs), then reloads systemd and restarts the service;
    an unchanged unit is only started (and enabled) when it does not run. Then waits for the server's C(/health),
    sends the smoke requests, reads the server info and, with O(min_accept_length), requires the accept length
    the server reports to be above it. Smoke replies of at most one token each fail with their own message (no
    draft was verified, so the accept length says nothing about the draft).
  - When any of that fails after the unit changed, and O(rollback) is true, the previous unit is put back, systemd
    reloaded and the previous service restarted and waited for (with no previous unit, the new service is stopped,
    disabled and its unit removed). The failure names what failed, what the rollback did and the end of O(log).
  - Before anything, with O(target) and O(draft), checks that the target's C(config.json) exists and that the draft
    is an EAGLE-3 draft in SGLang's layout; then, with O(judge), SGLang judges the command line and the draft (the
    payload's C(sglang_check.judge serve) on this host). What is missing, or what SGLang would run differently or not
    at all, or load incompletely, fails the call before the unit is touched, in one sentence that names the fix.
  - One module call where a switch of the served setting took one task (and a round trip to the server) for each
    of the judge, the reads, the write, the restart, every health poll and the gates.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  name:
    description: The unit's name, without C(.service).
    type: str
    required: true
  content:
    description: The unit file's text (the sglang_serve role renders its template on the controller).
    type: str
    required: true
  unit_dir:
    description: Where systemd reads the unit (the unit is O(unit_dir)/O(name).service).
    type: path
    default: /etc/systemd/system
  env:
    description:
      - Secrets the unit's command line names as C(${NAME}) (the server's API keys), written to O(env_file) (mode
        0600, root's only) and never into the world-readable unit. A change of one is a change of the unit (the
        server restarts), and a rollback puts the previous values back; never logged, and the diff does not show them.
    type: dict
  env_file:
    description: The environment file the unit names (C(EnvironmentFile=)); required with O(env).
    type: path
  url:
    description: Base URL of the server as this host reaches it (for instance C(http://127.0.0.1:30000)).
    type: str
    required: true
  health_timeout:
    description: Seconds to wait for C(/health) to answer 200 after a (re)start, and for the previous service's.
    type: int
    default: 600
  health_interval:
    description: Seconds between two C(/health) polls (a refused connection or a 503 costs the server next to nothing;
      a coarser poll adds half its interval to every restart on average, 0.1 s at 0.2).
    type: float
    default: 0.05
  log:
    description:
      - The server's log file, which the unit appends to. Its directory is made when missing, and its last lines
        are quoted when the service fails.
    type: path
  min_accept_length:
    description:
      - The accept length the server must report above (a draft whose weights did not take effect accepts about one
        token per step); unset, no accept-length gate.
    type: float
  accept_context:
    description: Words after "tokens per step" in the accept-length failure (for instance the draft's path).
    type: str
    default: ""
  accept_hint:
    description: What the accept-length failure says after the figures (likely causes and the fix).
    type: str
    default: the draft's weights did not take effect.
  record:
    description:
      - A JSON file where a (re)started server that passed its gates leaves what they measured (the accept length,
        the draft, the time), written whole; eagle3.ops.eagle3_status compares the live accept length with it.
        Left out, nothing is kept.
    type: path
  rollback:
    description: Whether a failure after a unit change puts the previous unit back.
    type: bool
    default: true
  stamp:
    description:
      - A stage's fingerprint to keep once the server passed its gates (eagle3.ops.stage_stamp's record in the same
        call, the round trip it would cost saved); left out, nothing is kept. A stamp that cannot be written is a
        warning, not a failure of what is served (the next run is then not converged and runs again).
      - The sglang_serve role passes the deploy stage's, without a router only (behind one, the stamp is kept
        after the server is back behind it).
    type: dict
    suboptions:
      stage:
        description: The stage's name.
        type: str
        required: true
      dir:
        description: Where the host keeps its stamps.
        type: path
        default: /var/lib/eagle3-ops/stamps
      controller:
        description: The controller's digests, as the stage's check returned them.
        type: dict
        default: {}
      paths:
        description: The host paths fingerprinted, as the check returned them.
        type: list
        elements: path
        default: []
      contents:
        description: The host files whose contents are fingerprinted, as the check returned them.
        type: list
        elements: path
        default: []
  host:
    description: The host's name in the failure messages of O(target), O(draft) and O(judge) (the inventory name);
      left out, the machine's host name.
    type: str
  target:
    description: The target model's directory, whose C(config.json) must exist (checked before anything).
    type: path
  draft:
    description:
      - The draft served, whose C(config.json) must name C(LlamaForCausalLMEagle3) (SGLang's EAGLE-3 loader) -
        checked before anything; left out when the server does not speculate. Also named by O(judge)'s refusals.
    type: path
  judge:
    description:
      - SGLang's judge, asked before anything else (in check mode too, so its O(judge.argv) should then keep no
        verdict); left out, nothing is judged. A refusal fails the call with nothing changed.
      - The sglang_serve role passes it to the first call of a deploy (behind a router, the check-mode call that
        comes before the server leaves the router).
    type: dict
    suboptions:
      argv:
        description: The judge's command line (the serving host's SGLang Python, C(-m sglang_check.judge serve ...)).
        type: list
        elements: str
        required: true
      chdir:
        description: Where it runs (the payload directory, which holds C(sglang_check)).
        type: path
        required: true
      python:
        description: The SGLang environment's Python, named when the judge cannot run.
        type: str
        required: true
      release:
        description: The SGLang release named when the verdict names none.
        type: str
        default: ""
extends_documentation_fragment:
  - eagle3.ops.gate
attributes:
  check_mode:
    description: Reports whether the unit would change or the service would start, and the unit's diff; touches nothing.
    support: full
  diff_mode:
    description: The unit file before and after.
    support: full
notes:
  - Behind a router, call it in check mode first to learn whether the server restarts, take the server out of the
    router, then call it for real (the sglang_serve role does).
"""

EXAMPLES = r"""
- name: Serve the new setting (rolled back to the previous unit on failure)
  eagle3.ops.sglang_service:
    name: sglang
    content: "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
    url: http://127.0.0.1:30000
    log: /var/log/eagle3/sglang.log
    prompts: [Explain speculative decoding in two sentences.]
    min_accept_length: 1.2
  register: served
"""

RETURN = r"""
unit_changed:
  description: Whether the unit's text, or its O(env), changed (in check mode, would change).
  returned: always
  type: bool
env_changed:
  description: Whether O(env) changed (its values are not returned).
  returned: always
  type: bool
started:
  description: Whether the service was (re)started (in check mode, would be).
  returned: always
  type: bool
health_seconds:
  description: Seconds from the (re)start, or from the call when nothing started, until C(/health) answered.
  returned: unless in check mode
  type: float
smoke:
  description: One record per smoke prompt (the prompt, the generated text's length in characters, the tokens
    generated where the server says, seconds).
  returned: always
  type: list
  elements: dict
info:
  description: The server info (the first of O(info_paths) that answered), or an empty dict.
  returned: always
  type: dict
info_path:
  description: The path that answered, or null.
  returned: always
  type: str
accept_length:
  description: C(internal_states[0].avg_spec_accept_length) of the server info, or null when the server reports none.
  returned: always
  type: float
rolled_back:
  description: What the rollback did (C(previous service restored, healthy, draft ...)), or null when there was none.
  returned: always
  type: str
restored_healthy:
  description: Whether the previous service answered its health after a rollback.
  returned: always
  type: bool
verdict:
  description: SGLang's verdict (the judge's JSON line) when O(judge) was given; empty when it printed none.
  returned: when O(judge) was given
  type: dict
stamp:
  description: The kept fingerprint (C(changed), C(fingerprint), C(changed_keys)) when O(stamp) was given and the
    server passed its gates.
  returned: when O(stamp) was given and the gates passed
  type: dict
log_tail:
  description: The last lines of O(log) when the service failed.
  returned: on failure
  type: list
  elements: str
"""

import os
import platform
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._atomic import write_json_atomic
from ansible_collections.eagle3.ops.plugins.module_utils._gate import (
    GATE_SPEC,
    Gate,
    GateError,
    accept_refusal,
    wait_healthy,
)
from ansible_collections.eagle3.ops.plugins.module_utils._serving import JUDGE_SPEC, model_refusal, run_judge
from ansible_collections.eagle3.ops.plugins.module_utils._stamp import RECORD_SPEC, StampError, record_after
from ansible_collections.eagle3.ops.plugins.module_utils._unit import SystemdUnit, UnitError, environment_text, log_tail

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "name": {"type": "str", "required": True},
    "content": {"type": "str", "required": True},
    "unit_dir": {"type": "path", "default": "/etc/systemd/system"},
    "env": {"type": "dict", "no_log": True},
    "env_file": {"type": "path"},
    "url": {"type": "str", "required": True},
    "health_timeout": {"type": "int", "default": 600},
    "health_interval": {"type": "float", "default": 0.05},
    "log": {"type": "path"},
    "min_accept_length": {"type": "float"},
    "accept_context": {"type": "str", "default": ""},
    "accept_hint": {"type": "str", "default": "the draft's weights did not take effect."},
    "rollback": {"type": "bool", "default": True},
    "record": {"type": "path"},
    "stamp": {"type": "dict", "options": RECORD_SPEC},
    "host": {"type": "str"},
    "target": {"type": "path"},
    "draft": {"type": "path"},
    "judge": {"type": "dict", "options": JUDGE_SPEC},
    **GATE_SPEC,
}


class ServiceFailed(Exception):
    pass


class Service:
    """One server's switch, in three rooms: its unit and restart (_unit.py), then its gates and the rollback they
    decide (_gate.py), then its fingerprint (_stamp.py)."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.unit = SystemdUnit(self.p["name"], self.p["unit_dir"], module.run_command, self.p["env_file"])
        try:
            self.env = environment_text(self.p["env"]) if self.p["env"] is not None else None
        except ValueError as exc:
            raise ServiceFailed(str(exc)) from None
        self.result: dict[str, Any] = {"changed": False, "unit_changed": False, "started": False, "smoke": [],
                                       "info": {}, "info_path": None, "accept_length": None, "rolled_back": None,
                                       "restored_healthy": False}  # fmt: skip

    def refusal(self) -> str | None:
        """Before anything (a refusal changes nothing): the target and the draft on disk, then SGLang's judge."""
        host = self.p["host"] or platform.node()
        refusal = model_refusal(host, self.p["target"], self.p["draft"])
        if not refusal and self.p["judge"]:
            self.result["verdict"], refusal = run_judge(self.p["judge"], host, self.p["draft"])
        return refusal

    def gate(self, since: float) -> None:
        """Health within what is left of health_timeout since ``since``, then the smoke requests, the accept length."""
        waited = wait_healthy(self.p["url"], max(0.0, self.p["health_timeout"] - (time.monotonic() - since)),
                              self.p["health_interval"])  # fmt: skip
        if waited is None:
            raise ServiceFailed(f"{self.unit.unit} did not answer {self.p['url'].rstrip('/')}/health within "
                                f"{self.p['health_timeout']} s")  # fmt: skip
        self.result["health_seconds"] = round(time.monotonic() - since, 2)
        checks = Gate(self.p)
        try:
            gates = checks.run(check_mode=False)
        except GateError as exc:
            raise ServiceFailed(f"{str(exc)[0].upper()}{str(exc)[1:]}") from exc
        self.result.update({k: v for k, v in gates.items() if k != "changed"})
        refused = accept_refusal(checks, self.result, self.p["min_accept_length"], self.p["accept_context"],
                                 self.p["accept_hint"])  # fmt: skip
        if refused:
            raise ServiceFailed(refused)

    def roll_back(self, previous: str | None, previous_env: str | None) -> str:
        """The previous unit back and waited for; with none, the new one stopped and removed."""
        done = self.unit.restore(previous, previous_env)
        if previous is None:
            return done
        self.result["restored_healthy"] = wait_healthy(self.p["url"], self.p["health_timeout"],
                                                       self.p["health_interval"]) is not None  # fmt: skip
        health = "healthy" if self.result["restored_healthy"] else "NOT healthy: check it"
        return f"previous service restored, {health}, {done}"

    def failed(self, exc: Exception, changed_unit: bool, previous: tuple[str | None, str | None]) -> ServiceFailed:
        """The failure in one message: what failed, what the rollback did, the end of the server's log."""
        self.result["log_tail"] = log_tail(self.p["log"])
        if changed_unit and self.p["rollback"]:
            self.result["rolled_back"] = self.roll_back(*previous)
            after = f" Rolled back to the previous unit ({self.result['rolled_back']})."
        elif changed_unit:
            after = " Not rolled back (rollback is false): the new unit stays."
        else:
            after = " No rollback: the unit did not change."
        tail = " | ".join(self.result["log_tail"])
        log = f" Server log {self.p['log']} ends with: {tail}" if self.p["log"] else ""
        return ServiceFailed(f"{str(exc).rstrip('.')}.{after}{log}")

    def run(self) -> None:
        refusal = self.refusal()
        if refusal:
            raise ServiceFailed(refusal)
        previous, previous_env = self.unit.read(), self.unit.read_env()
        self.result.update(self.unit.plan(previous, self.p["content"], previous_env, self.env))
        if self.module._diff and self.result["unit_changed"]:
            hidden = f"# {self.p['env_file']}: its values changed (not shown)\n" if self.result["env_changed"] else ""
            self.result["diff"] = {"before": previous or "", "after": self.p["content"] + hidden,
                                   "before_header": self.unit.path, "after_header": self.unit.path}  # fmt: skip
        if self.module.check_mode:
            return
        if self.p["log"]:
            os.makedirs(os.path.dirname(self.p["log"]) or ".", mode=0o755, exist_ok=True)
        changed_unit = bool(self.result["unit_changed"])
        try:
            since = time.monotonic()
            if self.result["started"]:
                self.unit.start(self.p["content"] if changed_unit else None, self.env)
            elif self.result["changed"]:
                self.unit.enable()
            self.gate(since)
        except (ServiceFailed, UnitError) as exc:
            raise self.failed(exc, changed_unit, (previous, previous_env)) from exc
        self.keep_record()
        self.keep_stamp()

    def keep_record(self) -> None:
        """What the gates measured, kept when the server (re)started or no record exists yet (O(record)): the figure
        of the deploy, which a later unchanged call's gates - on a server that has served since - do not replace."""
        path = self.p["record"]
        if not path or (not self.result["started"] and os.path.exists(path)):
            return
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            write_json_atomic(path, {"accept_length": self.result["accept_length"], "draft": self.p["draft"],
                                     "unit": self.unit.unit, "time": when})  # fmt: skip
        except OSError as exc:
            self.module.warn(f"The gates' record {path} could not be written ({exc}); status has no deploy figure.")

    def keep_stamp(self) -> None:
        """The stage's fingerprint, kept now that the server passed its gates (O(stamp))."""
        if not self.p["stamp"]:
            return
        try:
            self.result["stamp"] = record_after(self.p["stamp"])
        except StampError as exc:
            self.module.warn(f"{exc} The server passed its gates; the next run is not converged and runs again.")


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True,
                           required_by={"env": "env_file"})  # fmt: skip
    try:
        service = Service(module)
    except ServiceFailed as exc:
        module.fail_json(msg=str(exc))
    try:
        service.run()
    except ServiceFailed as exc:
        module.fail_json(msg=str(exc), **service.result)
    module.exit_json(**service.result)


if __name__ == "__main__":
    main()
