#!/usr/bin/env python3
"""Benchmark: fleet-wide GPU cleanup time against the number of containers (K = 1, 2, 4).

On the local lab (ansible-playbook lab.yml first): makes 4 extra lab containers with 4 emulated GPUs
each (VMIDs 181-184, removed at the end), starts a torchrun-like 4-GPU job in K of them (one rank
ignores SIGTERM, so every run waits the full grace period and then uses SIGKILL), and times
`ansible-playbook cleanup.yml` over those K containers. With forks the wall time should stay near one
grace period plus a fixed overhead instead of growing with K; the floor printed beside it is the same
playbook over K containers that hold nothing (no grace period to wait).

Usage: python benchmarks/bench_cleanup.py [--grace 3] [--runs 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VMIDS = [181, 182, 183, 184]
ANSIBLE_PLAYBOOK = str(Path(sys.executable).parent / "ansible-playbook")


def inventory(vmids: list[int]) -> str:
    hosts = "".join(f"        bench{v}: {{pct_vmid: {v}, lab_gpu_count: 4, lab_hostname: bench{v}}}\n" for v in vmids)
    return (
        "all:\n  children:\n    lab_hosts:\n      hosts:\n        lab-host:\n          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        "    containers:\n      vars:\n        ansible_connection: pct\n        ansible_host: 127.0.0.1\n"
        "        ansible_port: 10022\n        ansible_user: root\n"
        "        ansible_python_interpreter: /usr/bin/python3\n"
        f"        ansible_ssh_private_key_file: {ROOT / '.lab' / 'id_ed25519'}\n"
        f"        ansible_ssh_common_args: '-o UserKnownHostsFile={ROOT / '.lab' / 'known_hosts'} "
        "-o StrictHostKeyChecking=yes'\n"
        f"      hosts:\n{hosts}"
    )


CREATE = """- name: Bench containers
  hosts: lab-host
  gather_facts: false
  tasks:
    - name: Create them
      ansible.builtin.include_role:
        name: lab_host
        tasks_from: container.yml
      loop: "{{ groups['containers'] }}"
      loop_control:
        loop_var: _bench_ct
      vars:
        lab_host_ct_vmid: "{{ hostvars[_bench_ct].pct_vmid }}"
        lab_host_ct_hostname: "{{ _bench_ct }}"
        lab_host_ct_gpus: 4
"""


def playbook(path: str | Path, inv: Path, *extra: str) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    start = time.perf_counter()
    proc = subprocess.run(
        [ANSIBLE_PLAYBOOK, "-i", str(inv), str(path), *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{path} failed:\n{proc.stdout[-3000:]}")
    return elapsed


def start_jobs(vmids: list[int]) -> None:
    for v in vmids:
        subprocess.run(
            [
                "pct",
                "exec",
                str(v),
                "--",
                "lab-workload",
                "--gpus",
                "0-3",
                "--mib",
                "30000",
                "--dataloader-workers",
                "2",
                "--ignore-term-ranks",
                "1",
            ],
            check=True,
            capture_output=True,
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grace", type=float, default=3)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    if not (ROOT / ".lab" / "known_hosts").exists():
        raise SystemExit("the lab is not up: run ansible-playbook lab.yml first")
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-cleanup-"))
    all_inv = work / "all.yml"
    all_inv.write_text(inventory(VMIDS))
    (work / "create.yml").write_text(CREATE)
    try:
        playbook(work / "create.yml", all_inv)
        print(f"cleanup.yml over K containers, each with a 4-GPU job (grace {args.grace:g} s); medians of {args.runs}")
        print(f"{'K':>3}{'with jobs s':>13}{'idle floor s':>14}{'jobs - floor':>14}")
        for k in (1, 2, 4):
            inv = work / f"k{k}.yml"
            inv.write_text(inventory(VMIDS[:k]))
            busy, idle = [], []
            for _ in range(args.runs):
                start_jobs(VMIDS[:k])
                busy.append(playbook("cleanup.yml", inv, "-e", f"gpu_cleanup_grace={args.grace}"))
                idle.append(playbook("cleanup.yml", inv, "-e", f"gpu_cleanup_grace={args.grace}"))
            b, i = statistics.median(busy), statistics.median(idle)
            print(f"{k:>3}{b:>13.1f}{i:>14.1f}{b - i:>14.1f}")
    finally:
        for v in VMIDS:
            subprocess.run(["pct", "destroy", str(v), "--force", "1"], capture_output=True, check=False)
            subprocess.run(["rm", "-rf", f"/var/lib/eagle3-lab/gpu/{v}"], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
