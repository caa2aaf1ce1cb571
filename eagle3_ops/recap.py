"""The PLAY RECAP of a plain ``ansible-playbook`` run, read from its output: what the tests and the benchmarks check
after a run (the CLI reads ansible-runner's events instead)."""

from __future__ import annotations

import re

# "ct130                      : ok=21   changed=1    unreachable=0    failed=0    skipped=20   rescued=0 ..."
_HOST_LINE = re.compile(r"^(\S+)\s*:\s+(ok=\d+(?:\s+\w+=\d+)*)\s*$")


def recap(output: str) -> dict[str, dict[str, int]]:
    """{host: {ok, changed, unreachable, failed, skipped, rescued, ignored}} from the PLAY RECAP block of ``output``
    (empty when there is none)."""
    result: dict[str, dict[str, int]] = {}
    seen = False
    for line in output.splitlines():
        if line.startswith("PLAY RECAP"):
            seen = True
            continue
        found = _HOST_LINE.match(line) if seen else None
        if found:
            result[found.group(1)] = {k: int(v) for k, v in (p.split("=") for p in found.group(2).split())}
    return result


def converged(output: str) -> bool:
    """A run with a recap whose every host changed nothing, failed nothing and was reached."""
    hosts = recap(output)
    return bool(hosts) and all(c["changed"] == c["unreachable"] == c["failed"] == 0 for c in hosts.values())
