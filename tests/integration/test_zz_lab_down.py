"""`lab down` removes exactly what the test lab made, and the test command leaves the user's lab as it was.

Marked lab_teardown: conftest runs it after every other test, whatever the file order.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    _USER_LAB_AT_START,
    LAB_LXC_PATH,
    LAB_ROOT,
    LAB_STATE,
    PCT,
    recap,
    run_playbook,
    user_lab_snapshot,
)

pytestmark = [pytest.mark.lab, pytest.mark.lab_teardown, pytest.mark.xdist_group("lab")]


def _lxc_names(lxcpath: Path) -> set[str]:
    proc = subprocess.run(["lxc-ls", "-P", str(lxcpath), "-1"], capture_output=True, text=True, check=True)
    return set(proc.stdout.split())


def _job_files() -> set[Path]:
    """Ansible's async job files (ANSIBLE_ASYNC_DIR's default), each job's result until it is removed."""
    jobs = Path.home() / ".ansible_async"
    return set(jobs.iterdir()) if jobs.is_dir() else set()


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:  # another run's job, removed meanwhile
        return ""


def test_down_removes_exactly_the_test_lab(lab):
    template = Path("/var/cache/eagle3-lab/vztmpl/debian-12-eagle3lab-v2_amd64.tar")
    # Something the lab did not make, in the places LXC keeps containers.
    foreign = Path("/var/lib/lxc/not-the-labs")
    foreign.mkdir(parents=True, exist_ok=True)
    (foreign / "config").write_text("lxc.uts.name = not-the-labs\n")
    jobs_before = _job_files()
    try:
        proc = run_playbook("lab.yml", "-e", "lab_state=absent")
        assert recap(proc.stdout)["lab-host"]["failed"] == 0
        # the destroys ran as background jobs: their job files are removed once they ended
        left = [f for f in _job_files() - jobs_before if PCT in _text(f)]
        assert left == [], f"the teardown left its jobs' files: {left}"
        assert not LAB_LXC_PATH.exists() or not {"129", "130"} & _lxc_names(LAB_LXC_PATH)
        assert "not-the-labs" in _lxc_names(Path("/var/lib/lxc"))
        assert not LAB_ROOT.exists()
        assert not Path(PCT).exists()
        assert not LAB_STATE.exists()
        assert subprocess.run(["pgrep", "-f", f"{LAB_ROOT}/sshd"], check=False).returncode == 1
        assert shutil.which("lxc-start")  # packages stay
        assert template.exists()  # the template cache stays, so the next `up` does not debootstrap again

        again = run_playbook("lab.yml", "-e", "lab_state=absent")
        assert recap(again.stdout)["lab-host"]["changed"] == 0
    finally:
        shutil.rmtree(foreign, ignore_errors=True)


def test_the_users_lab_is_as_it_was():
    assert user_lab_snapshot() == _USER_LAB_AT_START
