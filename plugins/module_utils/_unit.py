# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A server's systemd unit on its host: the unit file (written whole or not at all), whether the service must
(re)start, the (re)start, and putting a previous unit back. The sglang_service module's first room; its gates are
_gate.py's and its fingerprint _stamp.py's."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._atomic import write_lines_atomic

# The draft a unit serves, as its command line names it (what a rollback says it restored).
DRAFT = re.compile(r"--speculative-draft-model-path (\S+)")


class UnitError(Exception):
    pass


class SystemdUnit:
    """One service's unit file and systemctl, through ``run`` (AnsibleModule.run_command's shape: argv -> rc, out,
    err)."""

    def __init__(self, name: str, unit_dir: str, run: Callable[[list[str]], tuple[int, str, str]]) -> None:
        self.unit = f"{name}.service"
        self.path = os.path.join(unit_dir, self.unit)
        self.run = run
        self.enabled = False

    def systemctl(self, *args: str, check: bool = True) -> int:
        rc, out, err = self.run(["systemctl", *args])
        if rc != 0 and check:
            raise UnitError(f"systemctl {' '.join(args)} failed (rc {rc}): {(err or out).strip()[-300:]}")
        return int(rc)

    def read(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write(self, text: str) -> None:
        """The unit complete or not at all (a temporary beside it, renamed over it)."""
        write_lines_atomic(self.path, [text])
        os.chmod(self.path, 0o644)

    def plan(self, previous: str | None, content: str) -> dict[str, Any]:
        """What a call would do: ``unit_changed`` (the text differs), ``started`` (a changed unit, or a service that
        does not run, is (re)started) and ``changed`` (that, or the service is not enabled)."""
        changed_unit = previous != content
        running = self.systemctl("is-active", "--quiet", self.unit, check=False) == 0
        self.enabled = self.systemctl("is-enabled", "--quiet", self.unit, check=False) == 0
        started = changed_unit or not running
        return {"unit_changed": changed_unit, "started": started, "changed": started or not self.enabled}

    def start(self, content: str | None) -> None:
        """Write ``content`` (when the unit changed), enable the service if it is not, and (re)start it."""
        if content is not None:
            self.write(content)
            self.systemctl("daemon-reload")
        if not self.enabled:  # enabling reloads systemd's view of every unit: only when needed
            self.systemctl("enable", "--quiet", self.unit)
        self.systemctl("restart" if content is not None else "start", self.unit)

    def enable(self) -> None:
        self.systemctl("enable", "--quiet", self.unit)

    def restore(self, previous: str | None) -> str:
        """Put the previous unit back and restart it (the caller waits for its health); with none, stop, disable and
        remove the new one. Returns what it did, in words."""
        if previous is None:
            self.systemctl("disable", "--now", "--quiet", self.unit, check=False)
            if os.path.exists(self.path):
                os.unlink(self.path)
            self.systemctl("daemon-reload", check=False)
            return "no previous service: the new one was stopped and removed"
        self.write(previous)
        self.systemctl("daemon-reload", check=False)
        self.systemctl("restart", self.unit, check=False)
        found = DRAFT.search(previous)
        return f"draft {found.group(1) if found else 'none'}"


def log_tail(path: str | None, lines: int = 8) -> list[str]:
    """The last lines of a server's log (its last 16 KiB read), [] when there is none."""
    if not path:
        return []
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 16384))
            return handle.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []
