"""eagle3_common's unit_start.yml, run by Ansible on the controller against a stand-in systemctl and systemd-run: a
running unit is joined only when it runs what the call would start (its digest in the unit's environment); one that
runs another command - a server of another model, a stage started with other settings - is stopped and started
afresh, as is any running unit when the caller does not join."""

from __future__ import annotations

from pathlib import Path

from tests.unit.roles.controller_play import role_tasks

# The unit's state is the file state; its environment is what the last systemd-run set (the file env). Every call
# is a line of calls.
SYSTEMCTL = """#!/bin/sh
dir=$(dirname "$0")
echo "systemctl $*" >> "$dir/calls"
case "$1" in
  show) printf 'ActiveState=%s\\nEnvironment=%s\\n' "$(cat "$dir/state")" "$(cat "$dir/env" 2>/dev/null)" ;;
  stop) echo inactive > "$dir/state" ;;
  reset-failed) echo inactive > "$dir/state" ;;
esac
"""
SYSTEMD_RUN = """#!/bin/sh
dir=$(dirname "$0")
echo "systemd-run $*" >> "$dir/calls"
env=""
for arg in "$@"; do
  case "$arg" in --setenv=*) env="$env ${arg#--setenv=}" ;; --) break ;; esac
done
echo "${env# }" > "$dir/env"
echo active > "$dir/state"
"""


def start(fake: Path, tmp_path: Path, argv: list[str], join: bool = True) -> list[str]:
    """Run unit_start.yml once; the stand-ins' calls it made."""
    (fake / "calls").write_text("")
    values = {"eagle3_common_unit": "eagle3-data-vllm", "eagle3_common_unit_log": str(tmp_path / "unit.log"),
              "eagle3_common_unit_argv": argv, "eagle3_common_unit_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
              "eagle3_common_unit_join": join}  # fmt: skip
    proc, _ = role_tasks(tmp_path, "eagle3_common", "unit_start.yml", values, fake)
    assert proc.returncode == 0, proc.stdout[-3000:]
    calls = (fake / "calls").read_text().splitlines()
    return [line.split()[1] if line.startswith("systemctl") else "run" for line in calls]


def test_a_running_unit_is_joined_only_when_it_runs_the_same_command(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("systemctl", SYSTEMCTL), ("systemd-run", SYSTEMD_RUN)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    (fake / "state").write_text("inactive\n")
    serve_a = ["vllm", "serve", "/srv/models/a", "--port", "8000"]
    assert start(fake, tmp_path, serve_a) == ["show", "run"]
    env = (fake / "env").read_text().split()
    assert "VLLM_CPU_KVCACHE_SPACE=1" in env and any(e.startswith("EAGLE3_UNIT_DIGEST=") for e in env)
    # The same command again while it runs: joined, nothing stopped or started.
    assert start(fake, tmp_path, serve_a) == ["show"]
    # Another model on the same unit name: the running server is not this call's - stopped, started afresh.
    assert start(fake, tmp_path, ["vllm", "serve", "/srv/models/b", "--port", "8000"]) == ["show", "stop", "run"]
    # A unit an earlier release started (no digest in its environment) is not taken for this call's either.
    (fake / "env").write_text("PYTHONUNBUFFERED=1 COLUMNS=200\n")
    assert start(fake, tmp_path, serve_a) == ["show", "stop", "run"]
    # A caller that does not join stops even the same command.
    assert start(fake, tmp_path, serve_a, join=False) == ["show", "stop", "run"]
    # A failed unit is reset, then started.
    (fake / "state").write_text("failed\n")
    assert start(fake, tmp_path, serve_a) == ["show", "reset-failed", "run"]
