# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A server's systemd unit on its host: the unit file (written whole or not at all), whether the service must
(re)start, the (re)start, and putting a previous unit back. The sglang_service module's first room; its gates are
_gate.py's and its fingerprint _stamp.py's."""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._atomic import write_lines_atomic

# The draft a unit serves, as its command line names it (what a rollback says it restored).
DRAFT = re.compile(r"--speculative-draft-model-path (\S+)")


# An argument that names a secret of the unit's environment file (${EAGLE3_...}, alone or after a prefix such as
# smg's ID:NAME:admin:): left unquoted on the ExecStart line, so that systemd substitutes it.
_ENV_REFERENCE = re.compile(r"[A-Za-z0-9:_.-]*\$\{EAGLE3_[A-Z_]+\}")


def exec_line(argv: Iterable[object]) -> str:
    """A unit's ExecStart command line: each argument shell-quoted, except those that name the environment file's
    secrets (``${EAGLE3_...}``), which systemd fills in."""
    return " ".join(a if _ENV_REFERENCE.fullmatch(a) else shlex.quote(a) for a in map(str, argv))


def environment_assignment(name: str, value: object) -> str:
    """A unit's ``Environment=`` value for one variable: ``"NAME=value"``, its double quotes escaped."""
    text = f"{name}={value}".replace('"', '\\"')
    return f'"{text}"'


def environment_text(env: Mapping[str, object]) -> str:
    """systemd's EnvironmentFile lines for ``env``: NAME="value", sorted by name, the value's backslashes and double
    quotes escaped (systemd.exec(5)); a name that is not a shell-style name, or a value with a line break, raises
    ValueError."""
    lines = []
    for name, value in sorted(env.items()):
        text = "" if value is None else str(value)
        if not name.replace("_", "a").isalnum() or name[0].isdigit() or not name.isascii():
            raise ValueError(f"env name {name!r} is not a variable name (letters, digits and _): rename it.")
        if "\n" in text or "\r" in text:
            raise ValueError(f"env {name}'s value holds a line break, which an environment file cannot: fix it.")
        escaped = text.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'{name}="{escaped}"\n')
    return "".join(lines)


class UnitError(Exception):
    pass


class SystemdUnit:
    """One service's unit file, its environment file (the secrets its command line names, mode 0600: kept out of
    the world-readable unit) and systemctl, through ``run`` (AnsibleModule.run_command's shape: argv -> rc, out,
    err). The unit and its environment are one thing to compare, write and put back."""

    def __init__(self, name: str, unit_dir: str, run: Callable[[list[str]], tuple[int, str, str]],
                 env_file: str | None = None) -> None:  # fmt: skip
        self.unit = f"{name}.service"
        self.path = os.path.join(unit_dir, self.unit)
        self.env_file = env_file
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

    def read_env(self) -> str | None:
        if not self.env_file:
            return None
        try:
            with open(self.env_file, encoding="utf-8") as handle:
                return handle.read()
        except FileNotFoundError:
            return None

    def write(self, text: str, env: str | None = None) -> None:
        """The unit complete or not at all (a temporary beside it, renamed over it), its environment file first (mode
        0600 from its creation, in a 0700 directory) when it has one."""
        if self.env_file and env is not None:
            os.makedirs(os.path.dirname(self.env_file) or ".", mode=0o700, exist_ok=True)
            write_lines_atomic(self.env_file, [env], mode=0o600)
        write_lines_atomic(self.path, [text])
        os.chmod(self.path, 0o644)

    def plan(self, previous: str | None, content: str, previous_env: str | None = None,
             env: str | None = None) -> dict[str, Any]:  # fmt: skip
        """What a call would do: ``unit_changed`` (the text differs, or its environment does), ``env_changed``,
        ``started`` (a changed unit, or a service that does not run, is (re)started) and ``changed`` (that, or the
        service is not enabled)."""
        env_changed = bool(self.env_file) and env is not None and previous_env != env
        changed_unit = previous != content or env_changed
        running = self.systemctl("is-active", "--quiet", self.unit, check=False) == 0
        self.enabled = self.systemctl("is-enabled", "--quiet", self.unit, check=False) == 0
        started = changed_unit or not running
        return {"unit_changed": changed_unit, "env_changed": env_changed, "started": started,
                "changed": started or not self.enabled}  # fmt: skip

    def start(self, content: str | None, env: str | None = None) -> None:
        """Write ``content`` and ``env`` (when the unit changed), enable the service if it is not, and (re)start
        it."""
        if content is not None:
            self.write(content, env)
            self.systemctl("daemon-reload")
        if not self.enabled:  # enabling reloads systemd's view of every unit: only when needed
            self.systemctl("enable", "--quiet", self.unit)
        self.systemctl("restart" if content is not None else "start", self.unit)

    def enable(self) -> None:
        self.systemctl("enable", "--quiet", self.unit)

    def restore(self, previous: str | None, previous_env: str | None = None) -> str:
        """Put the previous unit (and environment) back and restart it (the caller waits for its health); with none,
        stop, disable and remove the new one and its environment. Returns what it did, in words."""
        if previous is None:
            self.systemctl("disable", "--now", "--quiet", self.unit, check=False)
            for path in (self.path, self.env_file):
                if path and os.path.exists(path):
                    os.unlink(path)
            self.systemctl("daemon-reload", check=False)
            return "no previous service: the new one was stopped and removed"
        if self.env_file and previous_env is None and os.path.exists(self.env_file):
            os.unlink(self.env_file)
        self.write(previous, previous_env)
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
