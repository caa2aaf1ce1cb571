#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_canary
short_description: Compare a canary server's live accept length with the other servers' over real traffic
description:
  - Watches one server that serves a new draft (the canary) and the servers that still serve the previous one,
    side by side behind the router, over one window of real traffic - O(window_requests) requests reaching the
    canary, or O(window_seconds), whichever comes first - and decides whether the new draft is promoted.
  - Reads SGLang's counters on each server's C(/metrics) (C(--enable-metrics)) at the start and the end of the
    window - generated tokens, verify forwards and requests (C(sglang:generation_tokens_total),
    C(sglang:spec_verify_calls_total), C(sglang:num_requests_total)) - so each accept length is tokens per verify
    forward over exactly the requests that window served.
  - Promotes (C(decision=promote)) when the canary's accept length is at least the others' less
    O(tolerance_percent); rolls back otherwise, or when fewer than O(min_requests) requests reached the canary.
  - A canary that serves the same draft as the others (a setting switch) has nothing to compare - C(decision=same),
    at once. Changes nothing itself; the role acts on the decision.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  canary:
    description: The canary server's base URL (its worker URL behind the router).
    type: str
    required: true
  peers:
    description: The other servers' base URLs, serving the previous draft.
    type: list
    elements: str
    required: true
  window_requests:
    description: The window ends once this many requests reached the canary.
    type: int
    default: 200
  window_seconds:
    description: The window ends after this long, however many requests came.
    type: float
    default: 900
  min_requests:
    description: Fewer requests than this on the canary decide nothing, and the canary is rolled back.
    type: int
    default: 20
  tolerance_percent:
    description: How far (in percent) the canary's accept length may be below the others' and still be promoted.
    type: float
    default: 5
  poll_interval:
    description: Seconds between readings of the canary's request counter.
    type: float
    default: 2
  timeout:
    description: Seconds each HTTP read may take.
    type: float
    default: 10
  api_key:
    description: The servers' API key (SGLang's C(--api-key)), for their C(/get_server_info).
    type: str
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode:
    support: full
    details: Reads which drafts are served and says what it would watch; no window is waited for.
  diff_mode:
    support: none
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Watch the canary against the other servers over 200 requests (15 minutes at most)
  eagle3.ops.sglang_canary:
    canary: http://10.0.0.33:30000
    peers: [http://10.0.0.34:30000, http://10.0.0.35:30000]
    api_key: "{{ eagle3_common_keys.api }}"
  register: canary
"""

RETURN = r"""
decision:
  description: promote, rollback, or same (the canary serves the others' draft).
  returned: always
  type: str
reason:
  description: The sentence that explains the decision, with both accept lengths.
  returned: always
  type: str
canary_accept_length:
  description: The canary's tokens per verify forward over the window.
  returned: when measured
  type: float
peers_accept_length:
  description: The other servers' tokens per verify forward over the same window.
  returned: when measured
  type: float
canary_requests:
  description: Requests the canary finished in the window.
  returned: when measured
  type: int
peers_requests:
  description: Requests the other servers finished in the window.
  returned: when measured
  type: int
seconds:
  description: How long the window lasted.
  returned: when measured
  type: float
canary_draft:
  description: The draft the canary serves.
  returned: always
  type: str
peers_draft:
  description: The draft the other servers serve (the one a rolled back canary goes back to); null when they differ.
  returned: always
  type: str
"""

import json
import time
import traceback
import urllib.error

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.eagle3.ops.plugins.module_utils._auth import API_KEY_SPEC, bearer, refused
from ansible_collections.eagle3.ops.plugins.module_utils._canary import counters, decide, window

ARGUMENT_SPEC = {
    "canary": {"type": "str", "required": True},
    "peers": {"type": "list", "elements": "str", "required": True},
    "window_requests": {"type": "int", "default": 200},
    "window_seconds": {"type": "float", "default": 900},
    "min_requests": {"type": "int", "default": 20},
    "tolerance_percent": {"type": "float", "default": 5},
    "poll_interval": {"type": "float", "default": 2},
    "timeout": {"type": "float", "default": 10},
    **API_KEY_SPEC,
}


class CanaryError(Exception):
    pass


class Canary:
    """One window of traffic over the canary and its peers, then the decision."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.canary = self.p["canary"].rstrip("/")
        self.peers = [u.rstrip("/") for u in self.p["peers"]]
        self.result: dict = {"changed": False}

    def _get(self, url: str, key: str | None = None) -> str:
        try:
            with open_url(url, headers=bearer(key), timeout=self.p["timeout"]) as resp:
                return resp.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as exc:
            why = refused(exc.code, url, key, "API") or f"{url} answered HTTP {exc.code}"
            raise CanaryError(f"{why}: the canary needs every server answering (start it, or leave it out)") from None
        except (OSError, ValueError) as exc:
            raise CanaryError(f"{url} did not answer ({exc}): the canary compares with every other server, so each "
                              "must answer - bring it back, or deploy without draft_canary") from None

    def draft(self, base: str) -> str | None:
        info = json.loads(self._get(base + "/get_server_info", self.p["api_key"]) or "{}")
        return info.get("speculative_draft_model_path") if isinstance(info, dict) else None

    def read(self) -> dict[str, dict[str, float]]:
        return {url: counters(self._get(url + "/metrics")) for url in [self.canary, *self.peers]}

    def run(self) -> None:
        p = self.p
        if not self.peers:
            raise CanaryError("A canary needs other servers to compare with, and peers is empty: deploy without "
                              "draft_canary on a single server")  # fmt: skip
        if min(p["window_requests"], p["min_requests"]) < 1 or p["window_seconds"] <= 0:
            raise CanaryError("window_requests and min_requests must be 1 or more and window_seconds above 0")
        mine = self.draft(self.canary)
        theirs = {self.draft(url) for url in self.peers}
        self.result.update(canary_draft=mine, peers_draft=next(iter(theirs)) if len(theirs) == 1 else None)
        if theirs == {mine}:
            self.result.update(decision="same", reason=f"the canary serves the others' draft {mine}: nothing to "
                               "compare")  # fmt: skip
            return
        if self.module.check_mode:
            self.result.update(decision="promote", reason=f"would watch {mine} on {self.canary} against "
                               f"{', '.join(self.peers)} over {p['window_requests']} requests or "
                               f"{p['window_seconds']:g} s (check mode waits for nothing)")  # fmt: skip
            return
        start, begun = self.read(), time.monotonic()
        while True:
            time.sleep(p["poll_interval"])
            canary_now = counters(self._get(self.canary + "/metrics"))
            served = canary_now["num_requests_total"] - start[self.canary]["num_requests_total"]
            if served >= p["window_requests"] or time.monotonic() - begun >= p["window_seconds"]:
                break
        end = self.read()
        seconds = round(time.monotonic() - begun, 1)
        windows: dict[str, dict[str, float]] = {}
        for url in start:
            counted = window(start[url], end[url])
            if counted is None:
                raise CanaryError(f"{url} restarted during the canary's window (its counters went back): deploy again "
                                  "once the servers are steady")  # fmt: skip
            windows[url] = counted
        self.result.update(decide(windows[self.canary], [windows[u] for u in self.peers], p["tolerance_percent"],
                                  p["min_requests"]), seconds=seconds)  # fmt: skip


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    canary = Canary(module)
    try:
        canary.run()
    except CanaryError as exc:
        module.fail_json(msg=str(exc), **canary.result)
    except Exception as exc:
        module.fail_json(msg=f"sglang_canary failed unexpectedly: {exc}", exception=traceback.format_exc(),
                         **canary.result)
    module.exit_json(**canary.result)


if __name__ == "__main__":
    main()
