"""lab_host downloads the containers' wheels in the background while the template builds (wheelhouse.yml); when the
build fails, wheelhouse_stop.yml stops that download - ansible's async wrapper, the command and its child - removes
the job file, the job's temporary directory and the staging directory, and fails with the build's own message. Run
by Ansible on the controller against a real async job of the same shape (a Python whose child sleeps), since the real
one would reach the package index; and the role's main.yml wires it as the template build's rescue."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

from tests.conftest import ansible_env, run_playbook
from tests.modules import ROOT

PLAY = """- name: A download in the background, a failed step, the rescue
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: The download's temporary directory, as wheelhouse.yml makes it
      ansible.builtin.tempfile:
        state: directory
        prefix: eagle3-wheels-
      register: __lab_host_wheels_tmp

    - name: Keep its path
      ansible.builtin.copy:
        content: "{{{{ __lab_host_wheels_tmp.path }}}}"
        dest: {tmp}
        mode: "0644"

    - name: Start a download that takes its time, as wheelhouse.yml does (async, poll 0, its own temporary directory)
      ansible.builtin.command:
        argv:
          - "{{{{ ansible_playbook_python }}}}"
          - -c
          - "import subprocess as s, sys; s.run([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]])"
          - "{marker}"
      environment:
        TMPDIR: "{{{{ __lab_host_wheels_tmp.path }}}}"
      vars:
        ansible_remote_tmp: "{{{{ __lab_host_wheels_tmp.path }}}}"
      async: 600
      poll: 0
      register: __lab_host_wheels
      changed_when: true

    - name: See the download's child run
      ansible.builtin.command:
        argv: [pgrep, -f, "time.sleep.300. {marker}"]
      register: __seen
      until: __seen.rc == 0
      retries: 50
      delay: 0.2
      changed_when: false

    - name: Keep the job's id
      ansible.builtin.copy:
        content: "{{{{ __lab_host_wheels.ansible_job_id }}}}"
        dest: {jid}
        mode: "0644"

    - name: The step that fails while it downloads
      block:
        - name: Build the template
          ansible.builtin.fail:
            msg: "The lab's container template was not published: debootstrap failed."
      rescue:
        - name: Stop the download
          ansible.builtin.import_role:
            name: eagle3.ops.lab_host
            tasks_from: wheelhouse_stop.yml
"""


def _running(marker: str) -> list[str]:
    out = subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True, check=False).stdout
    return [line for line in out.splitlines() if "pgrep" not in line]


def test_a_failed_build_stops_the_download_and_leaves_nothing(tmp_path: Path):
    marker = f"eagle3-wheels-{uuid.uuid4().hex[:12]}"
    wheelhouse = tmp_path / "wheelhouse"
    (wheelhouse / ".partial").mkdir(parents=True)
    (wheelhouse / ".partial" / "torch-2.13.0-cp311-none-any.whl").write_bytes(b"PK half a wheel")
    (wheelhouse / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"PK a whole one")
    (tmp_path / "play.yml").write_text(PLAY.format(marker=marker, jid=tmp_path / "jid", tmp=tmp_path / "tmp"))
    values = {"ansible_python_interpreter": sys.executable, "lab_host_wheelhouse": str(wheelhouse)}
    try:
        proc = run_playbook(tmp_path / "play.yml", "-i", "localhost,", "-e", json.dumps(values), check=False,
                            env=ansible_env(), timeout=120)  # fmt: skip
        assert proc.returncode != 0, proc.stdout[-3000:]
        assert "The lab's container template was not published: debootstrap failed." in proc.stdout
        deadline = time.monotonic() + 10  # SIGKILL is delivered at once; the kernel reaps within moments
        while _running(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(marker) == [], "the background download still runs"
        jid = (tmp_path / "jid").read_text().strip()
        assert not (Path.home() / ".ansible_async" / jid).exists(), "the job file was left behind"
        # Ansible's files for the job (the async wrapper, the module, its unpacked payload) lived there
        assert not Path((tmp_path / "tmp").read_text().strip()).exists(), "the job's temporary directory was left"
        assert not (wheelhouse / ".partial").exists()
        assert (wheelhouse / "six-1.16.0-py2.py3-none-any.whl").read_bytes() == b"PK a whole one"
    finally:
        subprocess.run(["pkill", "-KILL", "-f", marker], check=False)


def test_the_download_keeps_its_files_in_its_own_temporary_directory():
    """What the play above copies from wheelhouse.yml: Ansible's files for the job and the module's payload (the
    remote tmp and TMPDIR) go to the directory the stop and the wait remove, not to ~/.ansible/tmp and /tmp."""
    tasks = yaml.safe_load((ROOT / "roles/lab_host/tasks/wheelhouse.yml").read_text())
    start = next(t for t in tasks if t.get("async"))
    assert start["poll"] == 0
    assert start["environment"]["TMPDIR"] == start["vars"]["ansible_remote_tmp"] == "{{ __lab_host_wheels_tmp.path }}"
    for name in ("wheelhouse_wait.yml", "wheelhouse_stop.yml"):
        forget = next(t for t in yaml.safe_load((ROOT / "roles/lab_host/tasks" / name).read_text())
                      if t.get("ansible.builtin.import_tasks") == "async_forget.yml")  # fmt: skip
        assert "__lab_host_wheels_tmp.path" in forget["vars"]["_lab_host_jobs_tmp"], name


def test_main_rescues_the_template_build_with_the_stop():
    tasks = yaml.safe_load((ROOT / "roles/lab_host/tasks/main.yml").read_text())
    build = next(t for t in tasks if t["name"] == "Build the lab")["block"]
    names = [t["name"] for t in build]
    started = names.index("Start filling the wheelhouse of the containers' Python runtime (it downloads while the "
                          "template builds)")  # fmt: skip
    waited = names.index("Wait for the wheelhouse")
    guarded = build[started + 1 : waited]
    assert guarded and all(
        [r.get("ansible.builtin.import_tasks") for r in t.get("rescue", [])] == ["wheelhouse_stop.yml"] for t in guarded
    ), "every step between the download's start and its wait must stop the download when it fails"
