"""module_utils/_unit.py: a server's unit file and systemctl, against a recording stand-in for systemctl - what must
(re)start, a write that is whole, and a rollback that puts the previous unit back or removes the new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.modules import module_utils

unit_utils = module_utils("_unit")


class Systemctl:
    """Answers is-active / is-enabled from its state and records every call."""

    def __init__(self, active: bool, enabled: bool, fail: str = "") -> None:
        self.active, self.enabled, self.fail, self.calls = active, enabled, fail, []

    def __call__(self, argv: list[str]) -> tuple[int, str, str]:
        self.calls.append(argv[1:])
        verb = argv[1]
        if verb == self.fail:
            return 1, "", f"{verb} refused"
        if verb == "is-active":
            return (0 if self.active else 3), "", ""
        if verb == "is-enabled":
            return (0 if self.enabled else 1), "", ""
        return 0, "", ""


def unit(tmp_path: Path, ctl: Systemctl):
    return unit_utils.SystemdUnit("sglang", str(tmp_path), ctl)


@pytest.mark.parametrize(
    ("previous", "active", "enabled", "plan"),
    [("A", True, True, {"unit_changed": False, "started": False, "changed": False}),
     ("A", False, True, {"unit_changed": False, "started": True, "changed": True}),
     ("A", True, False, {"unit_changed": False, "started": False, "changed": True}),
     ("B", True, True, {"unit_changed": True, "started": True, "changed": True}),
     (None, False, False, {"unit_changed": True, "started": True, "changed": True})],
)  # fmt: skip
def test_the_plan_restarts_a_changed_unit_or_a_stopped_service(tmp_path, previous, active, enabled, plan):
    ctl = Systemctl(active, enabled)
    assert unit(tmp_path, ctl).plan(previous, "A") == {**plan, "env_changed": False}
    assert all(call[0] in ("is-active", "is-enabled") for call in ctl.calls)  # a plan only asks


def test_a_changed_unit_is_written_whole_reloaded_and_restarted(tmp_path):
    ctl = Systemctl(active=True, enabled=True)
    served = unit(tmp_path, ctl)
    served.plan(None, "[Service]\n")
    served.start("[Service]\n")
    assert (tmp_path / "sglang.service").read_text() == "[Service]\n"
    assert oct(os.stat(tmp_path / "sglang.service").st_mode & 0o777) == "0o644"
    assert [c[0] for c in ctl.calls[2:]] == ["daemon-reload", "restart"]  # enabled already: not again
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sglang.service"]  # no temporary left


def test_an_unchanged_stopped_unit_is_started_and_enabled_without_a_reload(tmp_path):
    ctl = Systemctl(active=False, enabled=False)
    served = unit(tmp_path, ctl)
    served.plan("A", "A")
    served.start(None)
    assert [c[0] for c in ctl.calls[2:]] == ["enable", "start"]


def test_a_failing_systemctl_is_named_in_one_sentence(tmp_path):
    served = unit(tmp_path, Systemctl(active=True, enabled=True, fail="restart"))
    with pytest.raises(unit_utils.UnitError, match=r"systemctl restart sglang.service failed \(rc 1\): restart"):
        served.start("A")


def test_restore_puts_the_previous_unit_back_or_removes_the_new_one(tmp_path):
    ctl = Systemctl(active=True, enabled=True)
    served = unit(tmp_path, ctl)
    served.write("--speculative-draft-model-path /srv/new\n")
    said = served.restore("ExecStart=x --speculative-draft-model-path /srv/old --port 1\n")
    assert said == "draft /srv/old" and "/srv/old" in served.read()
    assert [c[0] for c in ctl.calls] == ["daemon-reload", "restart"]
    said = served.restore(None)
    assert said == "no previous service: the new one was stopped and removed"
    assert served.read() is None and not list(tmp_path.iterdir())


def test_the_log_tail_is_the_last_lines_or_nothing(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(20)))
    assert unit_utils.log_tail(str(log), 3) == ["line 17", "line 18", "line 19"]
    assert unit_utils.log_tail(str(tmp_path / "none.log")) == [] and unit_utils.log_tail(None) == []


def test_an_environment_is_written_0600_and_compared_and_put_back_with_its_unit(tmp_path):
    ctl = Systemctl(True, True)
    env_file = tmp_path / "env" / "sglang.env"
    served = unit_utils.SystemdUnit("sglang", str(tmp_path), ctl, str(env_file))
    assert served.plan(None, "A", None, "K=1\n")["env_changed"] is True
    served.start("A", "K=1\n")
    assert env_file.read_text() == "K=1\n" and oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert oct(env_file.parent.stat().st_mode & 0o777) == "0o700"
    plan = served.plan("A", "A", served.read_env(), "K=2\n")
    assert plan["unit_changed"] and plan["env_changed"] and plan["started"]  # a new key restarts the same unit
    served.start("A", "K=2\n")
    served.restore("A", "K=1\n")
    assert env_file.read_text() == "K=1\n"
    served.restore("A", None)  # the previous unit had no environment: none is left
    assert not env_file.exists()


def test_an_environment_assignment_is_quoted_with_its_quotes_escaped():
    u = module_utils("_unit")
    assert u.environment_assignment("A", 'x "y" z') == '"A=x \\"y\\" z"'
    assert u.environment_assignment("B", 3) == '"B=3"'
