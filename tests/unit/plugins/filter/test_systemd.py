"""The unit filters: sglang_router's ExecStart line and environment file, rendered by the code sglang_service renders
a server's with (module_utils/_unit.py), checked through Ansible's own templating."""

from __future__ import annotations

import json
import re
import shlex
import sys

from tests.modules import ROOT

PLAY = """- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - ansible.builtin.copy:
        dest: "{{ out }}.exec"
        content: "{{ argv | eagle3.ops.systemd_exec }}"
        mode: "0600"
    - ansible.builtin.copy:
        dest: "{{ out }}"
        content: "{{ env | eagle3.ops.systemd_env }}"
        mode: "0600"
    - ansible.builtin.copy:
        dest: "{{ out }}.assign"
        content: |
          {% for key, value in env.items() %}
          {{ key | eagle3.ops.systemd_assignment(value) }}
          {{ (key ~ '=' ~ value) | string | regex_replace('"', '\\"') | regex_replace('^(.*)$', '"\\1"') }}
          {% endfor %}
        mode: "0600"
"""

ARGV = ["/opt/smg/bin/smg", "launch", "--port", "30080", "--worker-urls", "http://10.0.0.3:30000", "a b", "it's",
        "--api-key", "${EAGLE3_API_KEY}",
        "--control-plane-api-keys", "eagle3-ops:deployer:admin:${EAGLE3_ADMIN_API_KEY}",
        "--not-a-reference", "x${EAGLE3_API_KEY} y", "${HOME}"]  # fmt: skip
# The ExecStart line as the two templates wrote it before the filter: quote, then unquote a ${EAGLE3_...} reference.
BEFORE = r"^'([A-Za-z0-9:_.-]*\$\{EAGLE3_[A-Z_]+\})'$"


def test_argv_is_quoted_but_the_environment_files_secrets_are_left_to_systemd_and_the_env_is_escaped(tmp_path):
    from tests.conftest import run_playbook

    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    out = tmp_path / "env"
    env = {"EAGLE3_API_KEY": "k" * 40, "EAGLE3_ADMIN_API_KEY": 'a"b\\c'}
    proc = run_playbook(play, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                        "-e", json.dumps({"argv": ARGV, "env": env, "out": str(out)}), timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:]
    line = (tmp_path / "env.exec").read_text()
    # what the templates did before the filter: every argument quoted, then the quotes taken off a ${EAGLE3_...} one
    assert line == " ".join(re.sub(BEFORE, r"\1", shlex.quote(a)) for a in ARGV)
    assert "--api-key ${EAGLE3_API_KEY}" in line and "eagle3-ops:deployer:admin:${EAGLE3_ADMIN_API_KEY}" in line
    assert "'x${EAGLE3_API_KEY} y'" in line and "'${HOME}'" in line and "'it'\"'\"'s'" in line
    assert shlex.split(line.replace("${EAGLE3_API_KEY}", "K").replace("${EAGLE3_ADMIN_API_KEY}", "A"))[9] == "K"
    assert out.read_text() == 'EAGLE3_ADMIN_API_KEY="a\\"b\\\\c"\nEAGLE3_API_KEY="' + "k" * 40 + '"\n'
    # a unit's Environment= value: each variable as the templates' quote-the-quotes regex wrote it before the filter
    assigned = (tmp_path / "env.assign").read_text().splitlines()
    assert len(assigned) == 4 and assigned[0::2] == assigned[1::2]
    assert assigned[0] == '"EAGLE3_API_KEY=' + "k" * 40 + '"' and assigned[2] == '"EAGLE3_ADMIN_API_KEY=a\\"b\\c"'


def test_an_environment_systemd_cannot_read_fails_the_filter(tmp_path):
    from tests.conftest import run_playbook

    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    proc = run_playbook(play, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                        "-e", '{"argv": [], "env": {"EAGLE3 KEY": "x"}, "out": "%s"}' % (tmp_path / "env"),
                        check=False, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "env name 'EAGLE3 KEY' is not a variable name" in proc.stdout
    assert not (tmp_path / "env").exists()


def test_the_filter_and_the_module_share_one_renderer():
    text = (ROOT / "plugins" / "filter" / "systemd.py").read_text()
    assert "from ansible_collections.eagle3.ops.plugins.module_utils._unit import (" in text
    assert all(f"    {name},\n" in text for name in ("environment_assignment", "environment_text", "exec_line"))
