# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stage's fingerprint: digests of what it reads and writes, compared with the one kept after its last run.

Standard library only, so the module stays small on the host. A fingerprint is a flat map ``{key: digest}``:
``var:NAME`` and ``file:PATH`` come from the controller, ``stat:PATH`` and ``content:PATH`` from the host. Comparing two
maps names what changed, so a stage that runs again says why.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._auth import bearer
from ansible_collections.eagle3.ops.plugins.module_utils._router import worker_named

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "stage": {"type": "str", "required": True},
    "state": {"type": "str", "choices": ["check", "record"], "default": "check"},
    "dir": {"type": "path", "default": "/var/lib/eagle3-ops/stamps"},
    "vars": {"type": "list", "elements": "str", "default": []},
    "roles": {"type": "list", "elements": "str", "default": []},
    "controller_files": {"type": "list", "elements": "path", "default": []},
    "controller": {"type": "dict", "default": {}},
    "paths": {"type": "list", "elements": "path", "default": []},
    "contents": {"type": "list", "elements": "path", "default": []},
    "units": {"type": "list", "elements": "str", "default": []},
    "urls": {"type": "list", "elements": "str", "default": []},
    "router": {"type": "dict", "options": {"url": {"type": "str", "required": True},
                                           "worker": {"type": "str", "required": True},
                                           "admin_key": {"type": "str", "no_log": True}}},
    "timeout": {"type": "float", "default": 5},
    "reads": {"type": "dict", "default": {}},
    "probes": {"type": "list", "elements": "dict", "default": [],
               "options": {"name": {"type": "str", "required": True},
                           "argv": {"type": "list", "elements": "str", "required": True},
                           "stdout": {"type": "str"}}},
}  # fmt: skip

# Seconds each of a check's reads may take (a read that does not end is reported as failed, never waited for).
READ_TIMEOUT = 30

# Directories are walked to this many entries at most: a store of millions of rows is fingerprinted by its
# manifest files, never by listing it (a path that exceeds this is refused, not silently truncated).
MAX_ENTRIES = 20000
SKIP_NAMES = frozenset({"__pycache__", ".git"})


def _transient(name: str) -> bool:
    """Lock files a writer creates and removes (eagle3_export's .eagle3-checkpoint.lock): no trace of a change."""
    return name.startswith(".") and name.endswith(".lock")


def digest(value: Any) -> str:
    """A stable digest of a JSON-able value (dict keys sorted)."""
    raw = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()


def file_digest(path: str) -> str:
    """The sha256 of a file's bytes, or ``absent``."""
    sha = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                sha.update(block)
    except FileNotFoundError:
        return "absent"
    return sha.hexdigest()


def _entry(path: str, st: os.stat_result) -> list[Any]:
    if stat.S_ISDIR(st.st_mode):
        # A directory's own mtime moves when a lock file comes and goes; its entries say what it holds.
        return [path, stat.S_IFMT(st.st_mode), st.st_ino]
    return [path, stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, st.st_ino]


def tree_digest(root: str, max_entries: int = MAX_ENTRIES) -> str:
    """A digest of every entry under ``root`` (type, size, mtime, inode; contents not read), or ``absent``. A root
    that is a symbolic link is followed: the link and what it points at both count (entries below are not followed).

    Rewriting a file in place changes its mtime; replacing it changes its inode: both change the digest. A file
    added or removed changes the listing; a lock file that came and went (and the directory mtime it moved) does not.
    """
    rows: list[list[Any]] = []
    try:
        top = os.lstat(root)
        if stat.S_ISLNK(top.st_mode):
            # A link to what is used (checkpoint_best -> 14): the link names the target, and the target is what
            # changes when a file is rewritten in place there.
            rows.append([".", "link", os.readlink(root), top.st_ino])
            top = os.stat(root)
    except FileNotFoundError:
        return digest([*rows, ["absent"]]) if rows else "absent"
    rows.append(_entry(".", top))
    if stat.S_ISDIR(top.st_mode):
        for base, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in SKIP_NAMES)
            for name in [*dirs, *sorted(f for f in files if not _transient(f))]:
                full = os.path.join(base, name)
                try:
                    rows.append(_entry(os.path.relpath(full, root), os.lstat(full)))
                except FileNotFoundError:
                    continue  # removed while walking: the next run sees the difference
                if len(rows) > max_entries:
                    raise ValueError(f"{root} holds more than {max_entries} entries: fingerprint its manifest "
                                     "files instead of the whole directory")  # fmt: skip
    return digest(rows)


def host_digests(paths: Iterable[str], contents: Iterable[str]) -> dict[str, str]:
    out = {f"stat:{p}": tree_digest(p) for p in paths}
    out.update({f"content:{p}": file_digest(p) for p in contents})
    return out


def changed_keys(kept: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """Keys whose digest differs, appeared or disappeared, sorted."""
    return sorted(k for k in set(kept) | set(now) if kept.get(k) != now.get(k))


def describe(keys: list[str], limit: int = 4) -> str:
    """``draft_tokens, stat:/srv/x and 2 more`` - what changed, for a message."""
    names = [k[4:] if k.startswith("var:") else k for k in keys]
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def run_read(argv: Any) -> dict[str, Any]:
    """One read-only command of a check (``reads``), as ``raw`` would report it: rc, stdout, stderr. A command that
    cannot start or does not end within READ_TIMEOUT is reported with rc 127 or 124 and why, never raised: its
    consumer reads it as it would its own failed read."""
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        return {"rc": 2, "stdout": "", "stderr": f"a read must be a non-empty list of strings, got {argv!r}"}
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=READ_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": f"{argv[0]} did not end within {READ_TIMEOUT} s"}
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{argv[0]}: {exc.strerror or exc}"}
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def run_reads(reads: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every read at once (each waits on its own process; together they take as long as the slowest), by name."""
    if len(reads) < 2:
        return {str(name): run_read(argv) for name, argv in reads.items()}
    with ThreadPoolExecutor(max_workers=len(reads)) as pool:
        futures = {str(name): pool.submit(run_read, argv) for name, argv in reads.items()}
        return {name: future.result() for name, future in futures.items()}


def failed_probe(probes: list[dict[str, Any]]) -> str:
    """The first of ``probes`` (liveness commands, run at once) that does not hold, as a reason; empty when all hold.
    A probe holds when its command exits 0 and, where ``stdout`` is given, its output matches that expression."""
    answers = run_reads({str(i): probe["argv"] for i, probe in enumerate(probes)})
    for i, probe in enumerate(probes):
        answer = answers[str(i)]
        said = (answer["stderr"] or answer["stdout"]).strip().splitlines()
        if answer["rc"] != 0:
            why = f": {said[0]}" if said else ""  # the first line: the error (pgrep adds a usage hint after)
            return f"{probe['name']} does not hold ({probe['argv'][0]} exited {answer['rc']}{why})"
        if probe.get("stdout") and not re.search(probe["stdout"], answer["stdout"], re.MULTILINE):
            got = answer["stdout"].strip()[:80] or "nothing"
            return f"{probe['name']} does not hold ({probe['argv'][0]} printed {got!r})"
    return ""


class StampError(Exception):
    pass


class StageStamp:
    """One stage's stamp on one host: the check (the module records: plugins/modules/stage_stamp.py)."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.path = os.path.join(self.p["dir"], f"{self.p['stage']}.json")

    def kept(self) -> dict[str, str] | None:
        try:
            with open(self.path, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError):
            return None  # absent or unreadable: the stage runs and writes a good one
        keys = data.get("keys") if isinstance(data, dict) else None
        return keys if isinstance(keys, dict) else None

    def now(self) -> dict[str, str]:
        keys = {str(k): str(v) for k, v in (self.p["controller"] or {}).items()}
        try:
            keys.update(host_digests(self.p["paths"], self.p["contents"]))
        except ValueError as exc:
            raise StampError(f"Cannot fingerprint the {self.p['stage']} stage: {exc}.") from exc
        return keys

    def _get(self, url: str, key: str | None = None) -> Any:
        from urllib import request  # pylint: disable=import-outside-toplevel

        # The host's own server and the lab's or the fleet's router: never through a proxy of the environment.
        opener = request.build_opener(request.ProxyHandler({}))
        with opener.open(request.Request(url, headers=bearer(key)), timeout=self.p["timeout"]) as resp:  # noqa: S310 - http(s) URLs of the host and its router
            raw = resp.read().decode("utf-8", "replace")
        return json.loads(raw) if raw.strip().startswith(("{", "[")) else raw

    def down(self) -> str:
        """What must run and does not, or an empty string."""
        for unit in self.p["units"]:
            try:
                proc = subprocess.run(["systemctl", "is-active", "--", unit], capture_output=True, text=True,
                                      timeout=30, check=False)  # fmt: skip
                rc, out = proc.returncode, proc.stdout
            except (OSError, subprocess.SubprocessError) as exc:
                rc, out = 1, f"unknown ({exc})"
            if rc != 0:
                return f"{unit} is {out.strip() or 'not active'}"
        if self.p.get("probes"):
            failed = failed_probe(self.p["probes"])
            if failed:
                return failed
        for url in self.p["urls"]:
            try:
                self._get(url)
            except Exception as exc:  # any failure to answer means not converged, never a failed task
                return f"{url} does not answer ({exc})"
        router = self.p["router"]
        if router:
            try:
                listed = self._get(router["url"].rstrip("/") + "/workers", router.get("admin_key"))
            except Exception as exc:  # as above
                return f"the router at {router['url']} does not answer ({exc})"
            mine = worker_named(listed.get("workers") if isinstance(listed, dict) else None, router["worker"])
            if mine is None or mine.get("is_healthy") is False:
                return f"the router at {router['url']} does not list {router['worker']} as healthy"
        return ""

    def check(self) -> dict[str, Any]:
        now, kept = self.now(), self.kept()
        keys = changed_keys(kept or {}, now)
        if kept is None:
            reason = f"no stamp of a complete {self.p['stage']} run ({self.path})"
        elif keys:
            reason = "changed: " + describe(keys)
        else:
            reason = self.down()
        out = {"changed": False, "converged": not reason, "reason": reason, "changed_keys": keys,
               "fingerprint": digest(now)}  # fmt: skip
        if reason and self.p.get("reads"):
            out["reads"] = run_reads(self.p["reads"])
        return out

    def record(self, check_mode: bool) -> dict[str, Any]:
        """Keep this run's fingerprint (the controller's digests given, the host's read now), atomically: a temporary
        file renamed over the stamp. Unchanged when it matches the one kept."""
        now, kept = self.now(), self.kept()
        keys = changed_keys(kept or {}, now)
        before = digest(kept) if kept is not None else "absent"
        out = {"changed": kept is None or bool(keys), "converged": True, "reason": "", "changed_keys": keys,
               "fingerprint": digest(now),
               "diff": {"before": before + "\n", "after": digest(now) + "\n", "before_header": self.path,
                        "after_header": self.path}}  # fmt: skip
        if out["changed"] and not check_mode:
            self.write({"stage": self.p["stage"], "time": time.time(), "keys": now})
        return out

    def write(self, data: dict[str, Any]) -> None:
        # Imported here only, as a check never writes.
        from ansible_collections.eagle3.ops.plugins.module_utils._atomic import write_json_atomic

        try:
            os.makedirs(self.p["dir"], mode=0o755, exist_ok=True)
            write_json_atomic(self.path, data)
        except OSError as exc:
            raise StampError(f"Cannot write the {self.p['stage']} stamp {self.path} ({exc}): free space "
                             f"in {self.p['dir']} or set another stamp directory.") from exc  # fmt: skip

    def answer(self, out: dict[str, Any]) -> dict[str, Any]:
        """``out`` with what a record of this run needs (the check's inputs, read back by stamp_record.yml)."""
        out.update(
            controller=self.p["controller"] or {}, paths=self.p["paths"], contents=self.p["contents"], dir=self.p["dir"]
        )
        return out


# What a module that keeps a stage's fingerprint after its own work takes (sglang_service's option stamp): the
# check's inputs; no liveness, which that work has just checked.
RECORD_SPEC: dict[str, dict[str, Any]] = {
    k: ARGUMENT_SPEC[k] for k in ("stage", "dir", "controller", "paths", "contents")
}


def record_after(params: dict[str, Any]) -> dict[str, Any]:
    """Keep a stage's fingerprint from RECORD_SPEC's options (StampError when it cannot be written): what changed
    (``changed``, ``fingerprint``, ``changed_keys``)."""
    defaults = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    out = StageStamp({**defaults, **params}).record(check_mode=False)
    return {k: out[k] for k in ("changed", "fingerprint", "changed_keys")}
