#!/usr/bin/env python3
"""Benchmark: what a fleet-wide run costs as the fleet grows, against its floor and a peer.

On the fleet lab (ansible-playbook -i inventory/lab-fleet lab.yml first): makes up to 16 idle bench containers
(VMIDs 151-166, one emulated GPU each) spread over the lab's nodes, then for K = 1, 2, 4, 8, 16 of them times
  - status.yml (converged: nothing changes) and cleanup.yml (nothing to kill), with the pct connection;
  - the peer: status.yml with community.proxmox's proxmox_pct_remote connection (paramiko) instead;
  - the floor: each of the K containers answering the same nvidia-smi query through a bare `pct exec` over its
    node's hop, all K at once (one ssh each).
Prints seconds per run (median of --runs), the cost of each added container, the ratio to one container and to
the floor. The bench containers are removed at the end (--keep leaves them for another run).

The peer hard-codes /usr/sbin/pct and reads host keys from ~/.ssh/known_hosts: as bench_connection.py does, the
benchmark links /usr/sbin/pct to the lab's pct for its duration (only when nothing is there) and runs the peer with a
temporary HOME whose known_hosts holds the lab's host keys, so host key checking stays on.

Usage: python benchmarks/bench_fleet.py [--runs 3] [--sizes 1,2,4,8,16]
       [--lab-vars inventory/lab/group_vars/all.yml ...] [--nodes pve-lab=10022,pve-lab2=10023] [--state-dir .lab]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FIRST_VMID = 151
SMI = "nvidia-smi --query-gpu=index,memory.used,memory.total,power.draw,utilization.gpu --format=csv,noheader,nounits"


def lab_vars(files: list[str]) -> dict:
    merged: dict = {}
    for name in files:
        merged.update(yaml.safe_load(Path(name).read_text()) or {})
    return merged


def inventory(work: Path, nodes: dict[str, int], vmids: list[int], state: Path, peer: bool = False) -> Path:
    """An inventory of the bench containers, round-robin over the nodes, each reached through its node's hop."""
    names = list(nodes)
    hosts = {}
    for i, vmid in enumerate(vmids):
        node = names[i % len(names)]
        hosts[f"bench{vmid}"] = {"pct_vmid": vmid, "pct_node": node, "ansible_port": nodes[node], "lab_gpu_count": 1,
                                 "lab_hostname": f"bench{vmid}"}  # fmt: skip
        if peer:
            hosts[f"bench{vmid}"]["proxmox_vmid"] = vmid
    conn = {"ansible_connection": "community.proxmox.proxmox_pct_remote" if peer else "eagle3.ops.pct",
            "ansible_host": "127.0.0.1", "ansible_user": "root", "ansible_python_interpreter": "/usr/bin/python3",
            "ansible_ssh_private_key_file": str(state / "id_ed25519"),
            "ansible_ssh_common_args": f"-o UserKnownHostsFile={state / 'known_hosts'} -o StrictHostKeyChecking=yes"}
    data = {"all": {"children": {
        "lab_hosts": {"hosts": {"lab-host": {"ansible_connection": "local",
                                             "ansible_python_interpreter": "{{ ansible_playbook_python }}"}}},
        "hypervisors": {"hosts": {n: {"ansible_host": "127.0.0.1", "ansible_port": p, "ansible_user": "root",
                                      "proxmox_node": n, "ansible_python_interpreter": "/usr/bin/python3"}
                                  for n, p in nodes.items()}},
        "containers": {"vars": conn, "hosts": hosts}}}}  # fmt: skip
    path = work / ("peer" if peer else "pct") / f"k{len(vmids)}" / "hosts.yml"
    (path.parent / "group_vars").mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def playbook(name: str, inv: Path, extra_vars: Path, home: Path | None = None) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    if home:
        env.update(HOME=str(home), ANSIBLE_LOCAL_TEMP=str(home / "tmp"))
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "-e", f"@{extra_vars}", name], cwd=ROOT,
                          env=env, capture_output=True, text=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} over {inv} failed:\n{proc.stdout[-3000:]}{proc.stderr[-1000:]}")
    return elapsed


def hop(nodes: dict[str, int], state: Path, node: str, command: str, check: bool = True) -> None:
    """One command on a node over its ssh hop, host key checked."""
    subprocess.run(["ssh", "-p", str(nodes[node]), "-i", str(state / "id_ed25519"), "-o", "BatchMode=yes", "-o",
                    f"UserKnownHostsFile={state / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes", "root@127.0.0.1",
                    command], check=check, capture_output=True)  # fmt: skip


def floor(nodes: dict[str, int], vmids: list[int], state: Path) -> float:
    """The same query answered by each container through a bare pct exec over its node's hop, all at once."""
    names = list(nodes)

    def one(i: int) -> None:
        hop(nodes, state, names[i % len(names)], f"pct exec {vmids[i]} -- {SMI}")

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(vmids)) as pool:
        list(pool.map(one, range(len(vmids))))
    return time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--lab-vars", nargs="+", default=[str(ROOT / "inventory" / "lab" / "group_vars" / "all.yml")],
                    help="the lab's group_vars files (a test or second lab layers its own over the first)")
    ap.add_argument("--nodes", default=None, help="node=port,... (default: lab_ssh_port and the next port)")
    ap.add_argument("--state-dir", help="the lab's key and known_hosts (default .lab; the test lab's is .lab-test)")
    ap.add_argument("--no-peer", action="store_true", help="skip community.proxmox's connection")
    ap.add_argument("--keep", action="store_true", help="leave the bench containers for another run")
    args = ap.parse_args()
    # A stop (SIGTERM) unwinds like Ctrl-C, so the finally below removes the link and the bench containers.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    sizes = [int(k) for k in args.sizes.split(",")]
    variables = lab_vars(args.lab_vars)
    port = int(variables.get("lab_ssh_port", 10022))
    nodes = dict((pair.split("=")[0], int(pair.split("=")[1])) for pair in args.nodes.split(",")) if args.nodes \
        else {"pve-lab": port, "pve-lab2": port + 1}  # fmt: skip
    state = Path(str(variables.get("eagle3_lab_state_dir", ROOT / ".lab")).strip())
    if args.state_dir:
        state = Path(args.state_dir).resolve()
    elif "{{" in str(state):
        state = ROOT / ".lab"
    if not (state / "known_hosts").exists():
        raise SystemExit(f"the lab is not up ({state}/known_hosts is missing): "
                         "ansible-playbook -i inventory/lab-fleet lab.yml")
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-fleet-"))
    extra = work / "lab-vars.yml"
    extra.write_text(yaml.safe_dump({k: v for k, v in variables.items() if not str(v).startswith("{{")
                                     and k.startswith(("lab_", "eagle3_lab"))}))  # fmt: skip
    vmids = list(range(FIRST_VMID, FIRST_VMID + max(sizes)))
    peer_home = work / "peer-home"
    (peer_home / ".ssh").mkdir(parents=True)
    (peer_home / ".ssh" / "known_hosts").write_text((state / "known_hosts").read_text())
    lab_pct = str(variables.get("lab_host_pct_path", "/usr/local/sbin/pct"))
    linked_pct = not args.no_peer and not os.path.lexists("/usr/sbin/pct")
    if linked_pct:
        os.symlink(lab_pct, "/usr/sbin/pct")
    rows = []
    try:
        print(f"creating {len(vmids)} bench containers over {', '.join(nodes)} ...", flush=True)
        playbook("lab.yml", inventory(work, nodes, vmids, state), extra)
        for k in sizes:
            inv = inventory(work, nodes, vmids[:k], state)
            peer_inv = inventory(work, nodes, vmids[:k], state, peer=True)
            status = statistics.median(playbook("status.yml", inv, extra) for _ in range(args.runs))
            cleanup = statistics.median(playbook("cleanup.yml", inv, extra) for _ in range(args.runs))
            peer = None if args.no_peer else statistics.median(
                playbook("status.yml", peer_inv, extra, home=peer_home) for _ in range(args.runs))  # fmt: skip
            low = statistics.median(floor(nodes, vmids[:k], state) for _ in range(args.runs))
            rows.append((k, status, cleanup, peer, low))
            print(f"  K={k}: status {status:.1f} s, cleanup {cleanup:.1f} s, peer status "
                  f"{'-' if peer is None else f'{peer:.1f} s'}, floor {low:.2f} s", flush=True)  # fmt: skip
    finally:
        if linked_pct:
            os.unlink("/usr/sbin/pct")
        if not args.keep:
            names = list(nodes)
            for i, vmid in enumerate(vmids):
                hop(nodes, state, names[i % len(names)], f"pct destroy {shlex.quote(str(vmid))} --force 1", check=False)
    base_status, base_cleanup = rows[0][1], rows[0][2]
    print(f"\nfleet-wide runs over K idle containers on {len(nodes)} nodes (medians of {args.runs}; "
          f"{os.cpu_count()} cores)")  # fmt: skip
    print(f"{'K':>3} {'status s':>9} {'x K=1':>6} {'s/added':>8} {'cleanup s':>10} {'x K=1':>6} {'s/added':>8} "
          f"{'peer status s':>14} {'floor s':>8} {'status/floor':>13}")  # fmt: skip
    for k, status, cleanup, peer, low in rows:
        added = max(k - 1, 1)
        print(f"{k:>3} {status:>9.1f} {status / base_status:>6.2f} {(status - base_status) / added:>8.2f} "
              f"{cleanup:>10.1f} {cleanup / base_cleanup:>6.2f} {(cleanup - base_cleanup) / added:>8.2f} "
              f"{'-' if peer is None else f'{peer:.1f}':>14} {low:>8.2f} {status / low:>13.1f}")  # fmt: skip
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
