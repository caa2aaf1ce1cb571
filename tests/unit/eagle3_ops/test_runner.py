"""eagle3_ops.runner: a real ansible-runner run of a small playbook on localhost - stats per host, failures as
one line each, events to the caller, and no secret left in any artifact."""

from __future__ import annotations

import json
import sys

from eagle3_ops import runner

PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: Use the secret
      ansible.builtin.debug:
        msg: "token is {{ api_token_secret }}"
    - name: Fail when asked
      ansible.builtin.fail:
        msg: the second task failed on purpose
      when: fail_now | default(false) | bool
"""
SECRET = "hunter22-not-for-artifacts"  # noqa: S105 -- a test value that must not reach the artifacts


def _run(tmp_path, **extra):
    (tmp_path / "play.yml").write_text(PLAY)
    (tmp_path / "hosts.yml").write_text(json.dumps({"all": {"hosts": {"localhost": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable}}}}))
    events: list[str] = []
    result = runner.run_playbook(str(tmp_path / "play.yml"), inventory=str(tmp_path / "hosts.yml"),
                                 extravars={"api_token_secret": SECRET, **extra}, runs_dir=tmp_path / "runs",
                                 on_event=lambda e: events.append(e.get("event", "")))  # fmt: skip
    return result, events


def test_a_run_reports_stats_and_events_and_keeps_no_secret(tmp_path):
    result, events = _run(tmp_path)
    assert result.ok and result.stats["localhost"]["ok"] == 1 and not result.failures
    assert "runner_on_ok" in events and "playbook_on_stats" in events
    assert (result.run_dir / "rc").read_text().strip() == "0"
    leaked = [p for p in (tmp_path / "runs").rglob("*") if p.is_file() and SECRET in p.read_text(errors="replace")]
    assert not leaked, leaked
    assert f"token is {runner.REDACTED}" in (result.run_dir / "stdout").read_text()


def test_a_failure_is_one_line_naming_host_and_task(tmp_path):
    result, _events = _run(tmp_path, fail_now=True)
    assert not result.ok and result.stats["localhost"].get("failures") == 1
    assert result.failures == ["localhost: Fail when asked: the second task failed on purpose"]


def test_secret_names_and_values_are_redacted():
    secrets = runner.secret_values({"api_token_secret": SECRET, "draft_tokens": 16}, {"PVE_PASSWORD": "pw-1234"})
    assert secrets == {SECRET, "pw-1234"}
    cleaned = runner._redact({"env": {"PVE_PASSWORD": "pw-1234"}, "cmd": f"ansible -e t={SECRET}"}, secrets)
    assert cleaned == {"env": {"PVE_PASSWORD": runner.REDACTED}, "cmd": f"ansible -e t={runner.REDACTED}"}
