# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A canary's live accept length against the other servers', over one window of real traffic.

SGLang 0.5.23 counts, per finished request, the generated tokens (``sglang:generation_tokens_total``), the verify
forwards (``sglang:spec_verify_calls_total``) and the requests (``sglang:num_requests_total``) on its /metrics page
(--enable-metrics; sglang/srt/observability/metrics_collector.py, observe_one_finished_request). Tokens per verify
forward over a window - the difference of two readings - is the accept length over exactly the requests that
window served, on every server alike. Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

COUNTERS = ("num_requests_total", "generation_tokens_total", "spec_verify_calls_total")
_SAMPLE = re.compile(
    r"^sglang:(num_requests_total|generation_tokens_total|spec_verify_calls_total)(?:\{[^}]*\})?\s+([-+0-9.eE]+)\s*$",
    re.M,
)


def counters(text: str) -> dict[str, float]:
    """The three counters of one /metrics page, summed over their label sets (streaming or not); 0 when absent."""
    found = dict.fromkeys(COUNTERS, 0.0)
    for name, value in _SAMPLE.findall(text or ""):
        found[name] += float(value)
    return found


def window(before: dict[str, float], after: dict[str, float]) -> dict[str, float] | None:
    """What one server counted between two readings; None when a counter went back (the server restarted)."""
    diff = {name: after[name] - before[name] for name in COUNTERS}
    return None if any(v < 0 for v in diff.values()) else diff


def accept_length(counted: dict[str, float]) -> float | None:
    verify = counted["spec_verify_calls_total"]
    return counted["generation_tokens_total"] / verify if verify > 0 else None


def total(windows: list[dict[str, float]]) -> dict[str, float]:
    return {name: sum(w[name] for w in windows) for name in COUNTERS}


def decide(canary: dict[str, float], peers: list[dict[str, float]], tolerance_percent: float,
           min_requests: int) -> dict[str, Any]:  # fmt: skip
    """promote or rollback, with the two accept lengths and why. The canary is promoted when its accept length over
    the window is at least the others' less ``tolerance_percent``; one that served fewer than ``min_requests``
    requests, or others that served none, prove nothing and are rolled back."""
    others = total(peers)
    mine, theirs = accept_length(canary), accept_length(others)
    out: dict[str, Any] = {
        "canary_accept_length": None if mine is None else round(mine, 3),
        "peers_accept_length": None if theirs is None else round(theirs, 3),
        "canary_requests": int(canary["num_requests_total"]),
        "peers_requests": int(others["num_requests_total"]),
    }
    if out["canary_requests"] < min_requests or mine is None:
        out.update(decision="rollback", reason=f"only {out['canary_requests']} request(s) reached the canary "
                   f"(at least {min_requests} decide): send it traffic through the router, or lengthen the window")
    elif theirs is None:
        out.update(decision="rollback", reason="the other servers served no speculative request in the window: "
                   "nothing to compare the canary with")  # fmt: skip
    else:
        change = (mine / theirs - 1) * 100
        figures = f"accept length {mine:.2f} against the others' {theirs:.2f} ({change:+.1f} %)"
        if mine >= theirs * (1 - tolerance_percent / 100):
            out.update(decision="promote", reason=f"{figures}, not more than {tolerance_percent:g} % below")
        else:
            out.update(decision="rollback", reason=f"{figures}, more than {tolerance_percent:g} % below")
    return out
