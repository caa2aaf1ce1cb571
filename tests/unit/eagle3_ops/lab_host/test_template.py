"""The lab template's checks: dpkg's view of the packages, in a staging rootfs and in a published tar."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle3_ops.lab_host import template

STATUS = """Package: base-files
Status: install ok installed
Version: 12.4

Package: python3
Status: deinstall ok config-files
Version: 3.11.2-1

Package: procps
Status: install ok installed
Description: /proc utilities
 Status: install ok installed
"""


def _tar(tmp_path: Path, status: str | None, python: bool) -> Path:
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    if status is not None:
        (root / "var/lib/dpkg/status").write_text(status)
    if python:
        (root / "usr/bin/python3").write_text("#!/bin/false\n")
    tar = tmp_path / "t.tar"
    root.chmod(0o755)
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    return tar


def test_installed_packages_reads_only_fully_installed_stanzas():
    # python3 is only config-files; a continuation line that looks like a field is not one.
    assert template.installed_packages(STATUS) == {"base-files", "procps"}
    assert template.missing_packages(STATUS, ["procps", "python3", "sudo:amd64"]) == ["python3", "sudo:amd64"]


def test_check_reports_a_stale_template_with_what_it_lacks(tmp_path):
    tar = _tar(tmp_path, STATUS, python=False)
    result = template.check_template(tar, ["python3", "procps"])
    assert result == {"ok": False, "template": str(tar), "reason": "lacks packages", "missing": ["python3"]}


def test_check_accepts_a_complete_template(tmp_path):
    tar = _tar(tmp_path, STATUS.replace("deinstall ok config-files", "install ok installed"), python=True)
    assert template.check_template(tar, ["python3", "procps"])["ok"] is True


def test_a_complete_check_is_kept_on_the_tar_until_the_tar_or_the_packages_change(tmp_path, monkeypatch):
    tar = _tar(tmp_path, STATUS.replace("deinstall ok config-files", "install ok installed"), python=True)
    assert template.check_template(tar, ["python3", "procps"]) == {
        "ok": True, "template": str(tar), "reason": "complete", "missing": []}  # fmt: skip
    reads: list[str] = []
    real_read = template.read_tar_member
    monkeypatch.setattr(template, "read_tar_member", lambda t, m: reads.append(m) or real_read(t, m))
    again = template.check_template(tar, ["procps", "python3"])
    assert again["ok"] is True and again["checked_before"] is True and reads == []
    # Other packages asked for: read again (and python3 lacks nothing, but "sudo" is not installed).
    assert template.check_template(tar, ["python3", "sudo"])["missing"] == ["sudo"] and reads
    # The tar rewritten in place without python3 (same inode, new mtime): read again, and refused.
    reads.clear()
    (tmp_path / "root/usr/bin/python3").unlink()
    subprocess.run(["tar", "-C", str(tmp_path / "root"), "-cf", str(tar), "."], check=True)
    assert template.check_template(tar, ["python3", "procps"])["ok"] is False and reads


def test_check_refuses_a_template_whose_root_shuts_out_other_users(tmp_path):
    tar = _tar(tmp_path, STATUS.replace("deinstall ok config-files", "install ok installed"), python=True)
    root = tmp_path / "root"
    root.chmod(0o700)
    subprocess.run(["tar", "-C", str(root), "-cf", str(tar), "."], check=True)
    result = template.check_template(tar, ["python3"])
    assert result["ok"] is False and "mode 0o700" in str(result["reason"])


def test_check_refuses_a_tar_without_a_dpkg_database(tmp_path):
    result = template.check_template(_tar(tmp_path, None, python=True), ["python3"])
    assert result["ok"] is False and result["reason"] == "no dpkg database in the tar"


def test_check_of_an_absent_template_exits_3(tmp_path, capsys):
    assert template.main(["check", str(tmp_path / "none.tar"), "--packages", "python3"]) == 3
    assert '"reason": "absent"' in capsys.readouterr().out


def test_verify_rootfs_names_the_missing_packages(tmp_path):
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    (tmp_path / "var/lib/dpkg/status").write_text(STATUS)
    with pytest.raises(template.TemplateError, match=r"lacks python3, sudo after debootstrap"):
        template.verify_rootfs(tmp_path, ["procps", "python3", "sudo"])


def test_stale_stages_of_dead_builders_are_removed_live_ones_kept(tmp_path):
    tar = tmp_path / "t.tar"
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale_dir = tmp_path / f".t.tar.stage-{dead.pid}-abcd"
    (stale_dir / "etc").mkdir(parents=True)
    stale_part = tmp_path / f".t.tar.part-{dead.pid}-0"
    stale_part.write_bytes(b"x" * 10)
    live = tmp_path / f".t.tar.stage-{os.getppid()}-efgh"
    live.mkdir()
    other = tmp_path / f".other.tar.stage-{dead.pid}-ijkl"
    other.mkdir()
    removed = template.remove_stale_stages(tar)
    assert sorted(removed) == sorted([stale_dir.name, stale_part.name])
    assert not stale_dir.exists() and not stale_part.exists()
    assert live.exists() and other.exists()


def test_a_build_waits_for_another_builder_of_the_template_and_keeps_what_it_published(tmp_path):
    # Two labs built at once share the template cache: the second build waits on the cache directory's lock, then
    # finds the first's template complete and keeps it, with no debootstrap of its own, and leaves no lock file.
    fake = tmp_path / "bin"
    fake.mkdir()
    ran = tmp_path / "debootstrap-ran"
    (fake / "debootstrap").write_text(f"#!/bin/sh\ntouch {ran}\nexit 1\n")
    (fake / "debootstrap").chmod(0o755)
    tar = tmp_path / "t.tar"
    lock = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another builder, mid-build, holds the template cache
        proc = subprocess.Popen(
            [sys.executable, template.__file__, "build", str(tar), "--packages", "python3,procps"],
            stdout=subprocess.PIPE, text=True, env=dict(os.environ, PATH=f"{fake}:{os.environ['PATH']}"),
        )  # fmt: skip
        time.sleep(1.0)
        assert proc.poll() is None  # waiting for the other builder
        _tar(tmp_path, STATUS.replace("deinstall ok config-files", "install ok installed"), python=True)
    finally:
        os.close(lock)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    result = json.loads(out)
    assert result["ok"] is True and result["built_by_another"] is True
    assert not ran.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "root", "t.tar"]
