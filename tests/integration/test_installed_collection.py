"""The collection built, installed into an empty directory and run from there against the test lab: the
fleet-wide playbooks (eagle3.ops.cleanup, eagle3.ops.status) and the benchmark report role find everything they
need inside the installed collection: templates under the roles that use them, the payloads shipped in it, the
report drawn by the collection's own module - no path into a checkout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TEST_INVENTORY

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, object]:
    work = tmp_path_factory.mktemp("installed")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    # An ansible.cfg of the user's own, not the checkout's (which links the checkout as the collection).
    (work / "ansible.cfg").write_text("[defaults]\nhost_key_checking = True\nretry_files_enabled = False\n"
                                      f"collections_path = {work / 'collections'}\n"
                                      "[inventory]\nenable_plugins = yaml, ini\n")  # fmt: skip
    env.update(ANSIBLE_CONFIG=str(work / "ansible.cfg"), ANSIBLE_NOCOLOR="1", PYTHONPATH="",
               PATH=f"{BIN}:{os.environ.get('PATH', '')}")  # fmt: skip
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(work / "dist"),
                            str(ROOT)], capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert build.returncode == 0, build.stderr
    tarball = next((work / "dist").glob("eagle3-ops-*.tar.gz"))
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(work / "collections"),
                              str(tarball)], capture_output=True, text=True, env=env, check=False)  # fmt: skip
    assert install.returncode == 0, install.stderr
    run_dir = work / "empty"
    run_dir.mkdir()
    return {"env": env, "dir": run_dir, "root": work / "collections" / "ansible_collections" / "eagle3" / "ops"}


def _play(installed, *args: str, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    # From an empty directory, with a configuration whose only collections path is the installed copy.
    argv = [str(BIN / "ansible-playbook"), "-i", str(TEST_INVENTORY), *args]
    return subprocess.run(argv, cwd=installed["dir"], env=installed["env"], capture_output=True, text=True,
                          timeout=timeout, check=False)  # fmt: skip


def test_the_installed_collection_ships_what_its_roles_use(installed):
    root = installed["root"]
    assert (root / "playbooks" / "cleanup.yml").is_file() and (root / "roles" / "gpu_cleanup" / "templates").is_dir()
    assert (root / "eagle3_ops" / "payloads" / "training" / "monitor.py").is_file()  # eagle3_payload's source
    assert not (root / "tests").exists() and not (root / ".venv").exists()


def test_fleet_cleanup_from_the_installed_collection(lab, installed):
    proc = _play(installed, "eagle3.ops.cleanup", "-l", "containers")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "holders=" in proc.stdout  # the summary template rendered from the installed role


def test_fleet_status_from_the_installed_collection(lab, installed):
    proc = _play(installed, "eagle3.ops.status", "-e", "status_hosts=containers")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "Report the status" in proc.stdout


def test_bench_report_from_the_installed_collection(installed, tmp_path):
    points = [{"max_concurrency": 1, "draft_tokens": None, "output_throughput": 10.0, "engine": "reference"},
              {"max_concurrency": 1, "draft_tokens": 5, "output_throughput": 14.0, "accept_length": 2.5,
               "engine": "reference"}]  # fmt: skip
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(json.dumps({"all": {"children": {"servers": {"hosts": {"srv1": {
        "ansible_connection": "local", "spec_bench_points": points,
        "spec_bench_meta": {"target": "/srv/t", "engine": "reference", "reports_dir": str(tmp_path / "reports")}}}}}}}))
    play = tmp_path / "report.yml"
    play.write_text("- hosts: localhost\n  gather_facts: false\n  roles: [eagle3.ops.bench_report]\n")
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inventory), str(play)], cwd=installed["dir"],
                          env=installed["env"], capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    report = next((tmp_path / "reports").glob("bench-*"))
    assert "| 5 | reference | 1 | 14.0 | 1.40 |" in (report / "bench.md").read_text()
    assert (report / "bench.png").read_bytes()[:4] == b"\x89PNG"
