"""One task file of a role, run by Ansible on the controller (localhost) with stand-ins for the host's commands
first on PATH - how the role tests here exercise a role's task files without a lab."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ansible_env, run_playbook

PLAY = """- name: One task file of a role on the controller
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The task file
      ansible.builtin.import_role:
        name: eagle3.ops.{role}
        tasks_from: {tasks}
"""
KEEP = """    - name: Keep what it registered
      ansible.builtin.copy:
        content: "{{{{ {register} | to_json }}}}"
        dest: {saw}
        mode: "0644"
"""


def role_tasks(tmp_path: Path, role: str, tasks: str, values: dict, stand_ins: Path,
               keep: str | None = None) -> tuple[subprocess.CompletedProcess[str], dict]:
    """Run TASKS of ROLE with VALUES as extra vars and the commands in STAND_INS first on PATH; with KEEP, also what
    the task file registered under that name (an empty dict when the run ended before)."""
    saw = tmp_path / "saw.json"
    play = PLAY.format(role=role, tasks=tasks) + (KEEP.format(register=keep, saw=saw) if keep else "")
    (tmp_path / "play.yml").write_text(play)
    env = ansible_env()
    env["PATH"] = f"{stand_ins}:{env['PATH']}"
    proc = run_playbook(tmp_path / "play.yml", "-i", "localhost,", "-e",
                        json.dumps({"ansible_python_interpreter": sys.executable, **values}), check=False, env=env,
                        timeout=120)  # fmt: skip
    return proc, json.loads(saw.read_text()) if keep and saw.exists() else {}
