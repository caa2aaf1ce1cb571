"""The cold path of the lab: its container template built from nothing, verified, never published half-made.

These builds go into a temporary cache directory, so they run the whole debootstrap on every machine,
however warm its real cache (/var/cache/eagle3-lab) is: a missing host package or a broken template step
fails here, not on a new user's machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from eagle3_ops.lab_host import template
from tests.conftest import ROOT, lab_unavailable, recap, run_playbook

pytestmark = pytest.mark.lab
NAME = "debian-12-eagle3lab-v2_amd64.tar"
DEFAULTS = yaml.safe_load((ROOT / "roles/lab_host/defaults/main.yml").read_text())
# The rebuild from nothing includes one package beyond debootstrap's minbase, the one the stale template lacks: the
# path (debootstrap, configure, verify, pack, publish) is every lab build's, and the lab's whole package list is
# checked by the builds of the test labs themselves (lab_host's "Require a complete template"), not downloaded again.
SMALL = ["python3"]


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    reason = lab_unavailable() or (None if shutil.which("debootstrap") else "debootstrap is not installed")
    if reason:
        pytest.skip(reason)
    directory = tmp_path / "vztmpl"
    directory.mkdir()
    return directory


def _build(cache: Path, *extra: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_playbook("lab.yml", "--tags", "lab_host_template", "-e", f"lab_host_vztmpl_dir={cache}", *extra,
                        check=check)


def test_a_stale_template_is_rebuilt_from_nothing_and_verified(cache, tmp_path):
    # A template from an older build that lacks the packages (the debian template's silent apt failure).
    stale_root = tmp_path / "stale"
    (stale_root / "var/lib/dpkg").mkdir(parents=True)
    (stale_root / "var/lib/dpkg/status").write_text("Package: base-files\nStatus: install ok installed\n")
    subprocess.run(["tar", "-C", str(stale_root), "-cf", str(cache / NAME), "."], check=True)

    small = json.dumps({"lab_host_template_packages": SMALL})
    proc = _build(cache, "-e", small)
    assert recap(proc.stdout)["lab-host"]["changed"] == 1, proc.stdout[-3000:]
    assert "rebuilt: the cached one lacks packages (python3" in " ".join(proc.stdout.split())
    assert sorted(p.name for p in cache.iterdir()) == [NAME]  # no staging tree or partial tar left behind

    assert template.check_template(cache / NAME, ["init", *SMALL])["ok"] is True
    assert set(SMALL) <= set(DEFAULTS["lab_host_template_packages"])  # a subset of what the lab's template includes
    # Independently of the builder's own check: unpack it and run python3 inside.
    root = tmp_path / "unpacked"
    root.mkdir()
    subprocess.run(["tar", "-xpf", str(cache / NAME), "-C", str(root), "--numeric-owner"], check=True)
    probe = subprocess.run(["chroot", str(root), "/usr/bin/python3", "-c", "import json, ssl, venv; print('ok')"],
                           capture_output=True, text=True, check=False)
    assert probe.stdout.strip() == "ok", probe.stderr
    assert (root / "etc/systemd/system/systemd-udevd.service").readlink() == Path("/dev/null")
    assert not any((root / "var/cache/apt/archives").glob("*.deb"))
    assert root.stat().st_mode & 0o777 == 0o755  # the container's / lets every user in

    again = _build(cache, "-e", small)
    assert recap(again.stdout)["lab-host"]["changed"] == 0
    assert f"Template {NAME} is complete" in " ".join(again.stdout.split())


def test_a_package_that_cannot_be_installed_fails_the_build_by_name(cache):
    packages = json.dumps({"lab_host_template_packages": ["python3", "eagle3-no-such-package"]})
    proc = _build(cache, "-e", packages, check=False)
    assert proc.returncode == 2
    flat = " ".join(proc.stdout.split())
    assert "was not published" in flat and "eagle3-no-such-package" in flat
    assert list(cache.iterdir()) == []  # nothing published, nothing half-built left
