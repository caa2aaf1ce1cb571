"""`lab down` removes exactly what the lab made; `lab up` from the cached template is quick. Runs last."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import LAB_STATE, recap, run_playbook

pytestmark = pytest.mark.lab


def _lxc_names() -> set[str]:
    return set(subprocess.run(["lxc-ls", "-1"], capture_output=True, text=True, check=True).stdout.split())


def test_down_removes_exactly_the_lab_then_up_is_quick(lab):
    # Something the lab did not make, in the places the lab writes to.
    foreign = Path("/var/lib/lxc/not-the-labs")
    foreign.mkdir(parents=True, exist_ok=True)
    (foreign / "config").write_text("lxc.uts.name = not-the-labs\n")
    try:
        proc = run_playbook("lab.yml", "-e", "lab_state=absent")
        assert recap(proc.stdout)["lab-host"]["failed"] == 0
        names = _lxc_names()
        assert "129" not in names and "130" not in names
        assert "not-the-labs" in names
        assert not Path("/var/lib/eagle3-lab").exists()
        assert not Path("/usr/local/sbin/pct").exists()
        assert not LAB_STATE.exists()
        assert subprocess.run(["pgrep", "-f", "/var/lib/eagle3-lab/sshd"], check=False).returncode == 1
        assert shutil.which("lxc-start")  # packages stay
        # The template cache stays, so the next `up` does not debootstrap again.
        assert Path("/var/cache/eagle3-lab/vztmpl/debian-12-eagle3lab-v2_amd64.tar").exists()

        again = run_playbook("lab.yml", "-e", "lab_state=absent")
        assert recap(again.stdout)["lab-host"]["changed"] == 0
    finally:
        shutil.rmtree(foreign)
        started = time.monotonic()
        up = run_playbook("lab.yml")
        elapsed = time.monotonic() - started
    print(f"lab up after down: {elapsed:.1f} s")
    assert recap(up.stdout)["lab-host"]["failed"] == 0
    assert elapsed < 180
