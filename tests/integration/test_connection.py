"""ansible-playbook through the pct connection against the lab, including its failure modes."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LAB_PORT, LAB_ROOT, flat, pct, recap, run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]
PLAYBOOKS = Path(__file__).parent / "playbooks"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def test_playbook_through_the_connection(lab, tmp_path):
    big = tmp_path / "big.bin"
    with big.open("wb") as fh:
        for _ in range(200):
            fh.write(os.urandom(1 << 20))
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    fetched = tmp_path / "fetched"
    fetched.mkdir()
    proc = run_playbook(
        PLAYBOOKS / "connection.yml",
        "-e",
        f"conn_big_src={big}",
        "-e",
        f"conn_big_sha256={sha256(big)}",
        "-e",
        f"conn_empty_src={empty}",
        "-e",
        f"conn_fetch_dir={fetched}",
    )
    counts = recap(proc.stdout)["ct129"]
    assert counts["failed"] == 0 and counts["unreachable"] == 0
    assert sha256(fetched / "big.bin") == sha256(big)
    assert (fetched / "small.txt").read_text(encoding="utf-8").startswith('it\'s "q" $(touch /tmp/pwned)')


def test_wrong_vmid_is_unreachable_with_the_fix(lab):
    proc = run_playbook(PLAYBOOKS / "ping.yml", "-e", "pct_vmid=999", check=False)
    assert recap(proc.stdout)["ct130"]["unreachable"] == 1
    assert f"CT 999 on node pve-lab (hypervisor 127.0.0.1:{LAB_PORT}) does not exist" in proc.stdout


def test_stopped_container_is_unreachable_with_the_fix(lab):
    pct("stop", "130")
    try:
        proc = run_playbook(PLAYBOOKS / "ping.yml", check=False)
    finally:
        pct("start", "130")
    assert recap(proc.stdout)["ct130"]["unreachable"] == 1
    assert f"CT 130 on node pve-lab (hypervisor 127.0.0.1:{LAB_PORT}) is not running" in proc.stdout
    assert "pct start 130" in proc.stdout


def test_missing_pct_is_named(lab):
    proc = run_playbook(PLAYBOOKS / "ping.yml", "-e", "ansible_pct_executable=/opt/none/pct", check=False)
    assert recap(proc.stdout)["ct130"]["unreachable"] == 1
    assert "pct was not found on the hypervisor of CT 130" in proc.stdout


def test_hypervisor_sshd_down_is_unreachable_naming_it(lab):
    subprocess.run(["pkill", "--pidfile", str(LAB_ROOT / "sshd" / "sshd.pid")], check=True)
    try:
        # No ControlPersist master: an earlier test's master would still carry sessions.
        proc = run_playbook(PLAYBOOKS / "ping.yml", "-e", "ansible_ssh_extra_args='-o ControlPath=none'", check=False)
    finally:
        run_playbook("lab.yml", "--tags", "lab_host_sshd")  # this lab's hop only
    assert recap(proc.stdout)["ct130"]["unreachable"] == 1
    assert f"Cannot reach the hypervisor of CT 130 on node pve-lab (hypervisor 127.0.0.1:{LAB_PORT})" in proc.stdout
    assert "Connection refused" in proc.stdout


def test_wrong_host_key_is_refused(lab, tmp_path):
    bad = tmp_path / "known_hosts"
    bad.write_text(
        f"[127.0.0.1]:{LAB_PORT} ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"
    )
    proc = run_playbook(
        PLAYBOOKS / "ping.yml",
        "-e",
        f"ansible_ssh_common_args='-o UserKnownHostsFile={bad} -o StrictHostKeyChecking=yes'",
        "-e",
        "ansible_ssh_extra_args='-o ControlPath=none'",
        check=False,
    )
    assert recap(proc.stdout)["ct130"]["unreachable"] == 1
    # ssh's own words, or - when ssh refused the key before Ansible wrote the pipelined module, a broken pipe - the pct
    # connection's new connection's, asked with the same known_hosts.
    said = flat(proc.stdout)  # the message as Ansible wraps it, unwrapped
    assert "HOST IDENTIFICATION HAS CHANGED" in said or "Host key verification failed" in said, proc.stdout[-3000:]
