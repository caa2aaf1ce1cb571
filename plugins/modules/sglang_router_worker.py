#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Add a server to SGLang's router, or take it out and wait for its requests to finish."""

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_worker
short_description: Register a server with SGLang's router (smg), or remove it and drain its requests
description:
  - Talks to the worker API of SGLang's router (the SGLang Model Gateway, C(smg); its predecessor
    C(sglang-router) serves the same C(/workers) API), that is C(GET /workers), C(POST /workers) with the worker's
    URL and C(DELETE /workers/{id}). The router answers the last two at once and completes them in the
    background; this module waits until the change took effect.
  - C(state=present) adds the server unless the router lists it, then waits until the router reports it healthy
    and ready, so that the next server of a rolling switch is only taken out once this one takes requests.
  - C(state=absent) removes it, waits until the router no longer lists it (no new request goes there), then,
    with O(drain), waits until the server itself has no request running or waiting (SGLang's C(/v1/loads)), so
    the requests the router already sent there finish before the server restarts.
  - Runs on a host that reaches both the router and the server (the router's host, by delegation).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  router_url:
    description: Base URL of the router's API.
    type: str
    default: http://127.0.0.1:30080
  url:
    description: The server's URL as the router reaches it (C(http://ADDRESS:PORT)).
    type: str
    required: true
  state:
    description: Whether the router sends requests to the server.
    type: str
    choices: [present, absent]
    default: present
  drain:
    description: With O(state=absent), wait until the server has no request running or waiting.
    type: bool
    default: true
  timeout:
    description: Seconds to wait for the router to apply the change, and again for the server to drain.
    type: float
    default: 600
  poll:
    description: Seconds between two reads while waiting.
    type: float
    default: 0.5
  admin_key:
    description:
      - The router's control-plane admin key (smg's C(--control-plane-api-keys ID:NAME:admin:KEY)), sent as
        an C(Authorization) bearer with every C(/workers) call; left out, none is sent. Never logged.
    type: str
  api_key:
    description:
      - The server's API key (SGLang's C(--api-key)), given to the router with the server it adds (smg 1.13 reaches a
        worker added through its API with that key, not with its own C(--api-key)), and sent with the drain's
        C(/v1/loads) reads. Never logged.
    type: str
attributes:
  check_mode:
    description: Says whether the server would be added or removed; nothing changes.
    support: full
  diff_mode:
    description: The before and after lists of the router's worker URLs.
    support: full
notes:
  - A router restarted from its unit knows the workers its command line lists (the sglang_router role renders
    them from the inventory); one added or removed here lasts until that restart.
"""

EXAMPLES = r"""
- name: Take the server out of the router and let its requests finish
  eagle3.ops.sglang_router_worker:
    router_url: http://127.0.0.1:30080
    url: http://10.203.0.33:30000
    state: absent
  delegate_to: "{{ groups['routers'] | first }}"
"""

RETURN = r"""
workers:
  description: The router's workers after the change (url, healthy, status, load).
  returned: always
  type: list
  elements: dict
in_flight:
  description: Requests the server was running or had waiting when it was taken out of the router
    (C(state=absent) with O(drain); null when the server does not report its load).
  returned: always
  type: int
drained_seconds:
  description: Seconds from the removal until the server had no request left (C(state=absent) with O(drain)).
  returned: always
  type: float
"""

import json
import time
import urllib.error
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.urls import open_url
from ansible_collections.eagle3.ops.plugins.module_utils._auth import ADMIN_KEY_SPEC, API_KEY_SPEC, bearer, refused
from ansible_collections.eagle3.ops.plugins.module_utils._router import worker_named, worker_rows


class RouterError(Exception):
    pass


class RouterWorker:
    """One worker's membership in one router, changed and then waited for."""

    def __init__(self, params: dict[str, Any], check_mode: bool) -> None:
        self.p = params
        self.router = params["router_url"].rstrip("/")
        self.url = params["url"].rstrip("/")
        self.check_mode = check_mode

    def _call(self, method: str, url: str, body: dict[str, Any] | None = None, key: str | None = None) -> Any:
        """One JSON call, with ``key`` as its bearer (the router's admin key, or the server's API key)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = bearer(key, {"Content-Type": "application/json"} if body is not None else {})
        with open_url(url, method=method, data=data, headers=headers, timeout=30) as resp:
            raw = resp.read().decode("utf-8", "replace")
        return json.loads(raw) if raw.strip() else {}

    def control(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A call to the router's control plane, with its admin key; a refused key is named as such."""
        try:
            return self._call(method, self.router + path, body, self.p["admin_key"])
        except urllib.error.HTTPError as exc:
            why = refused(exc.code, f"The router at {self.router}", self.p["admin_key"], "admin")
            if why:
                raise RouterError(why) from None
            raise

    def workers(self) -> list[dict[str, Any]]:
        try:
            listed = self.control("GET", "/workers")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise RouterError(f"The router at {self.router} does not answer GET /workers ({exc}): start it "
                              "(the sglang_router role) or fix sglang_serve_router_url.") from None  # fmt: skip
        rows = listed.get("workers") if isinstance(listed, dict) else None
        return [w for w in rows or [] if isinstance(w, dict)]

    def mine(self, workers: list[dict[str, Any]]) -> dict[str, Any] | None:
        return worker_named(workers, self.url)

    def server_load(self) -> int | None:
        """Requests running or waiting on the server (SGLang's /v1/loads), or None if it does not say."""
        try:
            loads = self._call("GET", self.url + "/v1/loads?include=core", key=self.p["api_key"]).get("loads")
            return sum(int(x.get("num_running_reqs", 0)) + int(x.get("num_waiting_reqs", 0)) for x in loads)
        except (OSError, urllib.error.URLError, ValueError, TypeError, AttributeError):
            return None

    def _wait(self, done: Any, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.p["timeout"]
        while True:
            workers = self.workers()
            if done(self.mine(workers)):
                return workers
            if time.monotonic() > deadline:
                raise RouterError(f"The router at {self.router} did not {what} {self.url} within "
                                  f"{self.p['timeout']:.0f} s: check that the router's host reaches the server "
                                  "(its /health) and the router's log.")  # fmt: skip
            time.sleep(self.p["poll"])

    def present(self, before: list[dict[str, Any]]) -> dict[str, Any]:
        mine = self.mine(before)
        if mine is not None and mine.get("is_healthy") is not False:
            return {"changed": False, "workers": before}
        if self.check_mode:
            return {"changed": mine is None, "workers": before}
        added = mine is None
        if mine is None:
            try:
                # smg 1.13 reaches a worker added here with the api_key of this body, not its own --api-key (without
                # one, its health checks and every request it forwards go unauthenticated).
                self.control("POST", "/workers", {"url": self.url, **({"api_key": self.p["api_key"]}
                                                                      if self.p["api_key"] else {})})  # fmt: skip
            except urllib.error.HTTPError as exc:
                if exc.code != 409:
                    raise RouterError(f"The router at {self.router} refused to add {self.url} ({exc}): check the "
                                      "URL and that the router's host reaches the server.") from None  # fmt: skip
                # 409: the router is adding it already (the workers of its command line, retried until they
                # answer); it is listed once that completes.
                added = False
            except (OSError, urllib.error.URLError, ValueError) as exc:
                raise RouterError(f"The router at {self.router} refused to add {self.url} ({exc}): check the URL "
                                  "and that the router's host reaches the server.") from None  # fmt: skip
        after = self._wait(lambda w: w is not None and w.get("is_healthy") is not False
                           and w.get("status", "ready") == "ready", "list as healthy")  # fmt: skip
        return {"changed": added, "workers": after}

    def absent(self, before: list[dict[str, Any]]) -> dict[str, Any]:
        mine = self.mine(before)
        out: dict[str, Any] = {"changed": mine is not None, "workers": before, "in_flight": None,
                               "drained_seconds": None}  # fmt: skip
        if mine is None or self.check_mode:
            return out
        first = self.server_load() if self.p["drain"] else None
        try:
            self.control("DELETE", f"/workers/{mine['id']}")
        except (OSError, urllib.error.URLError, ValueError) as exc:
            raise RouterError(f"The router at {self.router} refused to remove {self.url} ({exc}).") from None
        t0 = time.monotonic()
        out["workers"] = self._wait(lambda w: w is None, "stop listing")
        if self.p["drain"]:
            out.update(self.drain(t0), in_flight=first)
        return out

    def drain(self, t0: float) -> dict[str, Any]:
        """Wait for the server to finish what it was sent: two idle reads in a row (a request the router had
        just forwarded when the list changed arrives between them)."""
        load = self.server_load()
        idle_reads = 0
        while load is not None:
            idle_reads = idle_reads + 1 if load == 0 else 0
            if idle_reads >= 2:
                break
            if time.monotonic() - t0 > self.p["timeout"]:
                raise RouterError(f"{self.url} still runs {load} requests {self.p['timeout']:.0f} s after leaving "
                                  f"the router at {self.router}: raise the drain timeout or look at what it "
                                  "serves.")  # fmt: skip
            time.sleep(self.p["poll"])
            load = self.server_load()
        return {"drained_seconds": round(time.monotonic() - t0, 2)}

    def run(self) -> dict[str, Any]:
        before = self.workers()
        out = self.present(before) if self.p["state"] == "present" else self.absent(before)
        urls = sorted(str(w.get("url")) for w in before)
        after = sorted(str(w.get("url")) for w in out["workers"])
        if self.check_mode and out["changed"]:
            after = (sorted([*urls, self.url]) if self.p["state"] == "present"
                     else [u for u in urls if u.rstrip("/") != self.url])  # fmt: skip
        out["diff"] = {"before": "\n".join(urls) + "\n", "after": "\n".join(after) + "\n",
                       "before_header": f"{self.router}/workers", "after_header": f"{self.router}/workers"}  # fmt: skip
        out["workers"] = worker_rows(out["workers"])
        out.setdefault("in_flight", None)
        out.setdefault("drained_seconds", None)
        return out


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "router_url": {"type": "str", "default": "http://127.0.0.1:30080"},
            "url": {"type": "str", "required": True},
            "state": {"type": "str", "choices": ["present", "absent"], "default": "present"},
            "drain": {"type": "bool", "default": True},
            "timeout": {"type": "float", "default": 600},
            "poll": {"type": "float", "default": 0.5},
            **API_KEY_SPEC,
            **ADMIN_KEY_SPEC,
        },
        supports_check_mode=True,
    )
    if not module.params["url"].startswith(("http://", "https://")):
        module.fail_json(msg=f"url {module.params['url']!r} must be the server's http(s)://ADDRESS:PORT as the "
                         "router reaches it.")  # fmt: skip
    try:
        module.exit_json(**RouterWorker(module.params, module.check_mode).run())
    except RouterError as exc:
        module.fail_json(msg=str(exc))


if __name__ == "__main__":
    main()
