"""The eagle3-ops command line against the lab."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, ansible_env

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab"), pytest.mark.pipeline]
CLI = [sys.executable, "-m", "eagle3_ops.cli"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        cwd=ROOT,
        env=ansible_env(EAGLE3_OPS_RUNS=str(ROOT / "artifacts" / "test")),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_help_lists_the_commands():
    out = run("--help").stdout
    for command in ("lab", "train", "deploy", "bench", "cleanup", "provision", "status"):
        assert command in out


def test_lab_status_runs_the_smoke_play_and_writes_artifacts(lab):
    proc = run("lab", "status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ct129" in proc.stdout and "Check that the GPUs are idle" in proc.stdout
    run_dir = Path(proc.stdout.strip().splitlines()[-1].split("artifacts: ", 1)[1])
    assert (run_dir / "job_events").is_dir() and (run_dir / "rc").read_text().strip() == "0"


def test_a_failing_play_gives_a_nonzero_exit_code(lab):
    proc = run("cleanup", "-l", "ct130", "-e", "gpu_cleanup_grace=-1")
    assert proc.returncode == 2, proc.stdout
    assert "FAILED" in proc.stdout


def test_unreachable_hosts_give_their_own_exit_code(lab):
    proc = run("cleanup", "-l", "ct130", "-e", "pct_vmid=999")
    assert proc.returncode == 4, proc.stdout


def test_check_mode_passes_through(lab):
    proc = run("cleanup", "--check", "-l", "ct129")
    assert proc.returncode == 0, proc.stdout


def test_secrets_never_reach_the_artifacts(lab):
    fake = {"PROXMOX_TOKEN_SECRET": "env-s3cr3t-value"}  # a decoy the test looks for in the artifacts
    env = ansible_env(EAGLE3_OPS_RUNS=str(ROOT / "artifacts" / "test"), **fake)
    proc = subprocess.run([*CLI, "cleanup", "--check", "-l", "ct130", "-e", "proxmox_api_token_secret=xv-s3cr3t-value",
                           "-e", "vault_password=pw-s3cr3t-value"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    run_root = Path(proc.stdout.strip().splitlines()[-1].split("artifacts: ", 1)[1]).parents[1]
    files = [p for p in run_root.rglob("*") if p.is_file()]
    assert files
    for path in files:
        text = path.read_text(errors="replace")
        for secret in ("env-s3cr3t-value", "xv-s3cr3t-value", "pw-s3cr3t-value"):
            assert secret not in text, f"{secret} leaked into {path}"


def test_status_table_follows_a_workload(lab, job_marker):
    from tests.conftest import lab_workload, stop_marked

    lab_workload(129, job_marker, "--gpus", "0-1", "--mib", "20000", "--dataloader-workers", "0")
    try:
        proc = run("status")
    finally:
        stop_marked(129, job_marker)
    assert proc.returncode == 0, proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("ct129"))
    assert row.split()[:4] == ["ct129", "pve-lab", "running", "4"]  # its node (pct_node) beside it
    assert "39.1/382.4 GiB" in row


def test_a_bad_draft_tokens_value_fails_with_the_value_named(lab):
    proc = run("deploy", "--draft-tokens", "0")
    assert proc.returncode == 2 and "draft_tokens is 0; it must be between 2 and 64" in " ".join(proc.stdout.split())
