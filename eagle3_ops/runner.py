"""Run the project's playbooks through ansible-runner, with a run directory of artifacts per run."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROJECT_DIR = Path(__file__).resolve().parent.parent
SECRET_NAME = re.compile(r"(secret|token|passw|api_?key|credential|private)", re.IGNORECASE)
REDACTED = "<redacted>"


def secret_values(extravars: dict[str, Any], environ: dict[str, str]) -> set[str]:
    """Values of variables and environment entries whose names look secret (long enough to match safely)."""
    found = {str(v) for k, v in extravars.items() if SECRET_NAME.search(k) and v not in (None, "")}
    found |= {v for k, v in environ.items() if SECRET_NAME.search(k) and v}
    return {v for v in found if len(v) >= 4}


def _redact(value: Any, secrets: set[str]) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if SECRET_NAME.search(str(k)) and isinstance(v, str) and v else _redact(v, secrets))
                for k, v in value.items()}  # fmt: skip
    if isinstance(value, list):
        return [_redact(v, secrets) for v in value]
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
    return value


def scrub(run_root: Path, secrets: set[str]) -> None:
    """Rewrite every artifact so no secret value or secret-named variable is left in the run directory."""
    for path in run_root.rglob("*"):
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            cleaned = json.dumps(_redact(json.loads(text), secrets))
        except ValueError:
            cleaned = _redact(text, secrets)
        if cleaned != text:
            path.write_text(cleaned, encoding="utf-8")


@dataclass
class RunResult:
    """What a playbook run left: its status, return code, per-host stats and where the artifacts are."""

    playbook: str
    status: str
    rc: int
    run_dir: Path
    stats: dict[str, dict[str, int]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0


def default_runs_dir() -> Path:
    return Path(os.environ.get("EAGLE3_OPS_RUNS", PROJECT_DIR / "artifacts"))


def run_playbook(
    playbook: str,
    *,
    extravars: dict[str, Any] | None = None,
    limit: str | None = None,
    check: bool = False,
    inventory: str | None = None,
    tags: str | None = None,
    verbosity: int = 0,
    on_event: Callable[[dict[str, Any]], None] | None = None,
    runs_dir: Path | None = None,
) -> RunResult:
    """Run ``playbook`` (a path relative to the project) and return its result.

    The project's ansible.cfg applies (the run's working directory is the project), so the default
    inventory is the lab. Artifacts land in ``runs_dir/<timestamp>-<playbook>/``.
    """
    import ansible_runner  # deferred: importing it pulls in a lot and the CLI's --help should be quick

    runs = runs_dir or default_runs_dir()
    ident = f"{time.strftime('%Y%m%d-%H%M%S')}-{Path(playbook).stem}"
    private = runs / ident
    private.mkdir(parents=True, exist_ok=True)
    cmdline = []
    if check:
        cmdline.append("--check")
    if tags:
        cmdline += ["--tags", tags]
    env = {
        "ANSIBLE_CONFIG": str(PROJECT_DIR / "ansible.cfg"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    kwargs: dict[str, Any] = {
        "private_data_dir": str(private),
        "project_dir": str(PROJECT_DIR),
        "playbook": str(PROJECT_DIR / playbook),
        "extravars": extravars or {},
        "envvars": env,
        "quiet": on_event is not None,
        "verbosity": verbosity,
        "ident": "run",
        "rotate_artifacts": 0,
    }
    if inventory:
        kwargs["inventory"] = str(Path(inventory).resolve())
    if limit:
        kwargs["limit"] = limit
    if cmdline:
        kwargs["cmdline"] = " ".join(cmdline)
    failures: list[str] = []

    def handler(event: dict[str, Any]) -> bool:
        data = event.get("event_data", {})
        if event.get("event") in ("runner_on_failed", "runner_on_unreachable") and not data.get("ignore_errors"):
            res = data.get("res", {})
            failures.append(f"{data.get('host')}: {data.get('task')}: {res.get('msg', '')}".strip())
        if on_event:
            on_event(event)
        return True

    try:
        result = ansible_runner.run(event_handler=handler, **kwargs)
    finally:
        # Runner keeps the command line, the whole environment and every event: none may keep a secret.
        scrub(private, secret_values(extravars or {}, dict(os.environ)))
    stats = result.stats or {}
    per_host: dict[str, dict[str, int]] = {}
    for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored"):
        for host, count in (stats.get(key) or {}).items():
            per_host.setdefault(host, {})[key] = count
    return RunResult(
        playbook=playbook,
        status=result.status,
        rc=result.rc,
        run_dir=private / "artifacts" / "run",
        stats=per_host,
        failures=failures,
    )
