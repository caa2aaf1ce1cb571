#!/usr/bin/env python3
"""Benchmark: the pct connection against community.proxmox.proxmox_pct_remote and a plain-ssh floor.

On the local lab (ansible-playbook lab.yml first), in one run:

  (a) this project's pct connection (ssh to the hypervisor + pct exec, pipelining, ControlPersist)
  (b) community.proxmox.proxmox_pct_remote (paramiko; from the `ansible` 12.x package)
  (c) floor: ansible-core's ssh connection with pipelining to the hypervisor itself, running the same
      tasks on the host: the same SSH hop without pct

Workloads: a playbook of 50 small tasks on 2 hosts (CT 129 and 130; for the floor, two inventory
aliases of the hypervisor), and copies of a 1 MB and a 500 MB file (to CT 129; for the floor, to
the hypervisor). Prints medians of --runs runs, ratios, and the peak RSS of the ansible-playbook
process tree (max over all its processes, from wait4) for the copies.

The peer hard-codes /usr/sbin/pct and reads host keys from ~/.ssh/known_hosts: the benchmark links
/usr/sbin/pct to the lab's pct for its duration (only when nothing is there) and gives the peer a
temporary HOME whose known_hosts holds the lab's host key, so host key checking stays on for all three.

Usage: python benchmarks/bench_connection.py [--runs 3] [--tasks 50] [--big-mb 500]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _peer  # benchmarks/_peer.py: the peer's paramiko, apart from the project's environment

ROOT = Path(__file__).resolve().parent.parent
LAB = ROOT / ".lab"
PORT = 10022


def inventory(kind: str) -> str:
    common = (
        f"      ansible_host: 127.0.0.1\n      ansible_port: {PORT}\n      ansible_user: root\n"
        f"      ansible_python_interpreter: /usr/bin/python3\n"
        f"      ansible_ssh_private_key_file: {LAB / 'id_ed25519'}\n"
        f"      ansible_ssh_common_args: '-o UserKnownHostsFile={LAB / 'known_hosts'} -o StrictHostKeyChecking=yes'\n"
    )
    if kind == "pct":
        hosts = "    h1: {pct_vmid: 129}\n    h2: {pct_vmid: 130}\n"
        conn = "      ansible_connection: pct\n"
    elif kind == "peer":
        hosts = "    h1: {proxmox_vmid: 129}\n    h2: {proxmox_vmid: 130}\n"
        conn = "      ansible_connection: community.proxmox.proxmox_pct_remote\n"
    else:
        hosts = "    h1: {}\n    h2: {}\n"
        conn = "      ansible_connection: ssh\n"
    return f"bench:\n  hosts:\n{hosts}  vars:\n{common}{conn}"


def tasks_playbook(n: int) -> str:
    lines = ["- name: Small tasks", "  hosts: bench", "  gather_facts: false", "  tasks:"]
    for i in range(n):
        if i % 2:
            lines += [f"    - name: stat {i}", "      ansible.builtin.stat:", "        path: /etc/hostname"]
        else:
            lines += [
                f"    - name: command {i}",
                "      ansible.builtin.command: /bin/true",
                "      changed_when: false",
            ]
    return "\n".join(lines) + "\n"


COPY_PLAYBOOK = """- name: Copy
  hosts: h1
  gather_facts: false
  tasks:
    - name: copy
      ansible.builtin.copy:
        src: "{{ src }}"
        dest: "/tmp/bench-{{ tag }}.bin"
        mode: "0644"
    - name: remove
      ansible.builtin.file:
        path: "/tmp/bench-{{ tag }}.bin"
        state: absent
"""


TRANSFER = r"""
import json, os, resource, sys, time
os.environ["ANSIBLE_CONFIG"] = {cfg!r}
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader, init_plugin_loader
init_plugin_loader()
kind, src, dest = sys.argv[1], sys.argv[2], sys.argv[3]
name = "pct" if kind == "pct" else "community.proxmox.proxmox_pct_remote"
pc = PlayContext()
conn = connection_loader.get(name, pc, None)
opts = {{"remote_addr": "127.0.0.1", "port": {port}, "remote_user": "root", "private_key_file": {key!r}, "vmid": 129}}
if kind == "pct":
    opts = {{"host": "127.0.0.1", "port": {port}, "remote_user": "root", "private_key_file": {key!r}, "vmid": 129,
            "ssh_common_args": "-o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes"}}
conn.set_options(direct=opts)
conn._connect()
conn.exec_command("true")  # connection set up before the clock starts
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
conn.put_file(src, dest)
elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "rss_growth_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}}))
conn.exec_command("rm -f " + dest)
conn.close()
"""


def transfer(kind: str, src: Path, env: dict[str, str]) -> dict[str, float]:
    """put_file alone, in a fresh process: seconds and the growth of peak RSS during it."""
    import json
    import subprocess

    code = TRANSFER.format(
        cfg=str(ROOT / "ansible.cfg"), port=PORT, key=str(LAB / "id_ed25519"), kh=str(LAB / "known_hosts")
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, kind, str(src), "/tmp/bench-transfer.bin"],  # noqa: S108 -- in the container
        env=env,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    if proc.returncode != 0:
        raise SystemExit(f"transfer through {kind} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run(playbook: Path, inv: Path, env: dict[str, str], extra: list[str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) over the whole ansible-playbook process tree."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(inv), str(playbook), *(extra or [])]
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, 1)
        os.chdir(ROOT)
        os.execve(cmd[0], cmd, env)  # noqa: S606 -- fork+exec so wait4 reports the tree's peak RSS
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: rerun it by hand to see why")
    return elapsed, usage.ru_maxrss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--big-mb", type=int, default=500)
    ap.add_argument("--skip-peer", action="store_true")
    args = ap.parse_args()
    if not (LAB / "known_hosts").exists():
        raise SystemExit("the lab is not up: run ansible-playbook lab.yml first")
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-conn-"))
    linked_pct = False
    try:
        peer_home = work / "peer-home"
        (peer_home / ".ssh").mkdir(parents=True)
        shutil.copy(LAB / "known_hosts", peer_home / ".ssh" / "known_hosts")
        if not os.path.exists("/usr/sbin/pct"):
            os.symlink("/usr/local/sbin/pct", "/usr/sbin/pct")
            linked_pct = True
        base_env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"}
        envs = {
            "pct": base_env,
            "peer": {} if args.skip_peer else _peer.env({**base_env, "HOME": str(peer_home),
                                                          "ANSIBLE_LOCAL_TEMP": str(peer_home / "tmp")}),
            "floor": base_env,
        }
        kinds = ["pct", "floor"] + ([] if args.skip_peer else ["peer"])
        invs = {}
        for kind in kinds:
            invs[kind] = work / f"{kind}.yml"
            invs[kind].write_text(inventory(kind))
        tasks = work / "tasks.yml"
        tasks.write_text(tasks_playbook(args.tasks))
        copy = work / "copy.yml"
        copy.write_text(COPY_PLAYBOOK)
        small, big = work / "small.bin", work / "big.bin"
        small.write_bytes(os.urandom(1 << 20))
        with big.open("wb") as fh:
            chunk = os.urandom(1 << 24)
            for _ in range(args.big_mb * (1 << 20) // len(chunk)):
                fh.write(chunk)

        results: dict[str, dict[str, list[float]]] = {
            k: {"tasks": [], "small": [], "big": [], "small_rss": [], "big_rss": []} for k in kinds
        }
        for _ in range(args.runs):
            for kind in kinds:
                secs, _ = run(tasks, invs[kind], envs[kind])
                results[kind]["tasks"].append(secs)
                for size, path in (("small", small), ("big", big)):
                    secs, rss = run(copy, invs[kind], envs[kind], ["-e", f"src={path}", "-e", f"tag={size}"])
                    results[kind][size].append(secs)
                    results[kind][f"{size}_rss"].append(rss / 1024)

        raw = {k: [transfer(k, big, envs[k]) for _ in range(args.runs)] for k in kinds if k != "floor"}
        med = {k: {m: statistics.median(v) for m, v in r.items()} for k, r in results.items()}
        names = {"pct": "(a) pct connection", "peer": "(b) proxmox_pct_remote", "floor": "(c) ssh to host (floor)"}
        print(f"{args.tasks} tasks x 2 hosts; copy {args.big_mb} MB; medians of {args.runs} runs")
        print(
            f"{'':<26}{'tasks s':>9}{'1MB s':>8}{f'{args.big_mb}MB s':>9}{'MB/s':>8}{'RSS 1MB':>10}"
            f"{f'RSS {args.big_mb}MB':>12}"
        )
        for kind in kinds:
            m = med[kind]
            print(
                f"{names[kind]:<26}{m['tasks']:>9.1f}{m['small']:>8.2f}{m['big']:>9.2f}{args.big_mb / m['big']:>8.0f}"
                f"{m['small_rss']:>8.0f}MB{m['big_rss']:>10.0f}MB"
            )
        a = med["pct"]
        print(
            f"\n(a) vs (c) floor: tasks {a['tasks'] / med['floor']['tasks']:.2f}x the floor's time, "
            f"copy {a['big'] / med['floor']['big']:.2f}x"
        )
        print(f"(a) peak RSS growth from 1 MB to {args.big_mb} MB: {a['big_rss'] - a['small_rss']:+.0f} MB")
        if "peer" in med:
            b = med["peer"]
            print(
                f"(a) vs (b) peer: tasks {b['tasks'] / a['tasks']:.1f}x faster, "
                f"copy throughput {b['big'] / a['big']:.1f}x, peer RSS growth {b['big_rss'] - b['small_rss']:+.0f} MB"
            )
        print(f"\nput_file alone ({args.big_mb} MB, connection already up), medians:")
        for k, runs in raw.items():
            secs = statistics.median(r["seconds"] for r in runs)
            growth = statistics.median(r["rss_growth_kib"] for r in runs) / 1024
            print(f"  {names[k]:<26}{secs:>7.2f} s {args.big_mb / secs:>7.0f} MB/s   peak RSS growth {growth:+.0f} MB")
        if "peer" in raw:
            ratio = statistics.median(r["seconds"] for r in raw["peer"]) / statistics.median(
                r["seconds"] for r in raw["pct"]
            )
            print(f"  (a) transfer throughput = {ratio:.1f}x (b)'s")
    finally:
        if linked_pct:
            os.unlink("/usr/sbin/pct")
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
