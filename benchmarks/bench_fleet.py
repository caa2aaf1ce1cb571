#!/usr/bin/env python3
"""Benchmark: what a fleet-wide run costs as the fleet grows, against its floor and a peer.

On the fleet lab (ansible-playbook -i inventory/lab-fleet lab.yml first): makes up to 16 idle bench containers
(VMIDs 151-166, one emulated GPU each) spread over the lab's nodes, then for K = 1, 2, 4, 8, 16 of them times
  - status.yml (converged: nothing changes) and cleanup.yml (nothing to kill), with the pct connection;
  - the peer: status.yml with community.proxmox's proxmox_pct_remote connection (paramiko) instead;
  - the floor: each of the K containers answering the same nvidia-smi query through a bare `pct exec` over its
    node's hop, all K at once (one ssh each).
Prints seconds per run (median of --runs), the cost of each added container, the ratio to one container and to
the floor. Then, for each K of --deploy-sizes that this machine has room for (a deployed lab server is about
SERVER_DISK_GIB of runtimes on its container's disk and SERVER_MEMORY_GIB of serving processes), the first K bench
containers become servers for real - deploy.yml with the pipeline's variables (--pipeline-vars, the fleet lab's),
all at once (eagle3_rollout_batch=K), serving the drafter the fleet lab trained (train.yml -i inventory/lab-fleet
first) - and a converged deploy.yml over them is timed, its recap checked for changed=0 on every server. A size
without room is named with the reason. The bench containers are removed at the end (--keep leaves them for another
run).

The peer hard-codes /usr/sbin/pct and reads host keys from ~/.ssh/known_hosts: as bench_connection.py does, the
benchmark links /usr/sbin/pct to the lab's pct for its duration (only when nothing is there) and runs the peer with a
temporary HOME whose known_hosts holds the lab's host keys, so host key checking stays on.

Usage: python benchmarks/bench_fleet.py [--runs 3] [--sizes 1,2,4,8,16] [--deploy-sizes 1,2,4,8,16 | --no-deploy]
       [--inventory inventory/lab-fleet | --nodes pve-lab=10022,pve-lab2=10023]
       [--lab-vars inventory/lab/group_vars/all.yml ...] [--state-dir .lab]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import _peer  # benchmarks/_peer.py: the peer's paramiko, apart from the project's environment
import yaml
from _record import record  # benchmarks/_record.py

from eagle3_ops.recap import converged

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
FIRST_VMID = 151
# What deploying one lab server adds: its server's resident memory 0.47 GiB (measured 2026-12-04 on the fleet lab), and
# on its container's disk 0.27 GiB (2026-12-05, the one-node test lab's server after its deploy): its environments
# link their files from the labs' one uv cache (inventory/lab), which holds 3.8 GiB once per machine (before, each
# container unpacked its own: a bench container grew from 0.22 to 3.0 GiB). With the room this machine keeps free.
SERVER_DISK_GIB = 0.3
SERVER_MEMORY_GIB = 0.5
SHARED_CACHE_GIB = 4.0  # counted whether or not the cache is there yet: the first install fills it
SPARE_DISK_GIB, SPARE_MEMORY_GIB = 5.0, 4.0
SMI = "nvidia-smi --query-gpu=index,memory.used,memory.total,power.draw,utilization.gpu --format=csv,noheader,nounits"


def lab_vars(files: list[str]) -> dict:
    merged: dict = {}
    for name in files:
        merged.update(yaml.safe_load(Path(name).read_text()) or {})
    return merged


def inventory(work: Path, nodes: dict[str, int], vmids: list[int], state: Path, peer: bool = False,
              pipeline: Path | None = None) -> Path:
    """An inventory of the bench containers, round-robin over the nodes, each reached through its node's hop; with
    pipeline (a group_vars directory), the containers are the servers group and the pipeline's variables apply."""
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
    kind = "peer" if peer else "deploy" if pipeline else "pct"
    path = work / kind / f"k{len(vmids)}" / "hosts.yml"
    (path.parent / "group_vars").mkdir(parents=True, exist_ok=True)
    if pipeline:
        data["all"]["children"]["containers"] = {"vars": conn, "children": {"servers": {"hosts": hosts}}}
        for source in pipeline.glob("*.yml"):
            shutil.copyfile(source, path.parent / "group_vars" / source.name)
    path.write_text(yaml.safe_dump(data))
    return path


def inventory_nodes(inv: Path) -> dict[str, int]:
    """The lab's nodes as the inventory names them (its hypervisors: proxmox_node and the hop's port), templates
    resolved by Ansible itself, so that a grown lab's inventory is benchmarked over all of its nodes."""
    proc = subprocess.run([str(BIN / "ansible"), "-i", str(inv), "hypervisors", "-o", "-m", "ansible.builtin.debug",
                           "-a", "msg={{ proxmox_node }}={{ ansible_port }}"],
                          cwd=ROOT, env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")},
                          capture_output=True, text=True, check=False)  # fmt: skip
    pairs = re.findall(r'"msg": "([^"=]+)=(\d+)"', proc.stdout)
    if proc.returncode != 0 or not pairs:
        raise SystemExit(f"cannot read the lab's nodes from {inv} (its hypervisors' proxmox_node and ansible_port): "
                         f"{(proc.stdout + proc.stderr).strip()[-500:]}; name them with --nodes node=port,...")
    return {node: int(port) for node, port in sorted(pairs, key=lambda pair: int(pair[1]))}  # in the hops' order


def no_room(k: int, lxc_path: str) -> str | None:
    """Why this machine cannot hold K deployed bench servers beside what runs now, or None."""
    disk = shutil.disk_usage(lxc_path).free / 2**30
    available = re.search(r"MemAvailable:\s+(\d+) kB", Path("/proc/meminfo").read_text())
    memory = int(available.group(1)) / 2**20 if available else 0.0
    need_disk = k * SERVER_DISK_GIB + SHARED_CACHE_GIB + SPARE_DISK_GIB
    need_memory = k * SERVER_MEMORY_GIB + SPARE_MEMORY_GIB
    if disk < need_disk:
        return f"needs {need_disk:.0f} GiB free at {lxc_path}, {disk:.0f} GiB are"
    if memory < need_memory:
        return f"needs {need_memory:.0f} GiB of memory available, {memory:.0f} GiB are"
    return None


def playbook(name: str, inv: Path, extra_vars: Path, home: Path | None = None, options: tuple[str, ...] = (),
             expect_converged: bool = False) -> float:
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    if home:  # the peer's run
        env = _peer.env({**env, "HOME": str(home), "ANSIBLE_LOCAL_TEMP": str(home / "tmp")})
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", str(inv), "-e", f"@{extra_vars}", *options, name],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{name} over {inv} failed:\n{proc.stdout[-3000:]}{proc.stderr[-1000:]}")
    if expect_converged and not converged(proc.stdout):
        raise SystemExit(f"{name} over {inv} was not converged (a host changed something):\n{proc.stdout[-3000:]}")
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
    ap.add_argument("--inventory", default=str(ROOT / "inventory" / "lab-fleet"),
                    help="the lab inventory whose nodes (its hypervisors) the bench containers spread over, and whose "
                         "group_vars deploy.yml runs with (default inventory/lab-fleet; a grown lab's own)")
    ap.add_argument("--nodes", default=None, help="node=port,... (default: the hypervisors of --inventory)")
    ap.add_argument("--state-dir", help="the lab's key and known_hosts (default .lab; the test lab's is .lab-test)")
    ap.add_argument("--no-peer", action="store_true", help="skip community.proxmox's connection")
    ap.add_argument("--deploy-sizes", default=None,
                    help="K for the converged deploy.yml (default: --sizes; any without room here is named)")
    ap.add_argument("--no-deploy", action="store_true", help="skip the deployed servers and the converged deploy.yml")
    ap.add_argument("--pipeline-vars", default=None,
                    help="the group_vars directory whose variables deploy.yml runs with (default: --inventory's)")
    ap.add_argument("--record", default=None, help="the results file (default benchmarks/results/bench_fleet.jsonl; "
                    "an empty value records nothing)")
    ap.add_argument("--keep", action="store_true",
                    help="leave the bench containers, and their inventories, for another run or a look by hand")
    args = ap.parse_args()
    # A stop (SIGTERM) unwinds like Ctrl-C, so the finally below removes the link and the bench containers.
    signal.signal(signal.SIGTERM, lambda _sig, _frame: sys.exit(143))
    sizes = [int(k) for k in args.sizes.split(",")]
    deploy_sizes = [] if args.no_deploy else [int(k) for k in (args.deploy_sizes or args.sizes).split(",")]
    variables = lab_vars(args.lab_vars)
    nodes = dict((pair.split("=")[0], int(pair.split("=")[1])) for pair in args.nodes.split(",")) if args.nodes \
        else inventory_nodes(Path(args.inventory))  # fmt: skip
    args.pipeline_vars = args.pipeline_vars or str(Path(args.inventory) / "group_vars")
    state = Path(str(variables.get("eagle3_lab_state_dir", ROOT / ".lab")).strip())
    if args.state_dir:
        state = Path(args.state_dir).resolve()
    elif "{{" in str(state):
        state = ROOT / ".lab"
    if not (state / "known_hosts").exists():
        raise SystemExit(f"the lab is not up ({state}/known_hosts is missing): "
                         f"ansible-playbook -i {args.inventory} lab.yml")
    work = Path(tempfile.mkdtemp(prefix="eagle3-bench-fleet-"))
    extra = work / "lab-vars.yml"
    extra.write_text(yaml.safe_dump({k: v for k, v in variables.items() if not str(v).startswith("{{")
                                     and k.startswith(("lab_", "eagle3_lab"))}))  # fmt: skip
    vmids = list(range(FIRST_VMID, FIRST_VMID + max(sizes + deploy_sizes)))  # a deploy size may exceed the others
    peer_home = work / "peer-home"
    (peer_home / ".ssh").mkdir(parents=True)
    (peer_home / ".ssh" / "known_hosts").write_text((state / "known_hosts").read_text())
    lab_pct = str(variables.get("lab_host_pct_path", "/usr/local/sbin/pct"))
    linked_pct = not args.no_peer and not os.path.lexists("/usr/sbin/pct")
    if linked_pct:
        os.symlink(lab_pct, "/usr/sbin/pct")
    rows = []
    lxc_path = str(variables.get("lab_host_lxc_path", "/var/lib/lxc"))
    deploy_rows: list[tuple[int, float | None, str | None]] = []
    first_deploy: tuple[int, float] | None = None
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
        if deploy_sizes:
            why_not = {k: no_room(k, lxc_path) for k in deploy_sizes}  # before any of them is deployed
            fits = [k for k in deploy_sizes if why_not[k] is None]
            pipeline = Path(args.pipeline_vars)
            state_var = ("-e", f"eagle3_lab_state_dir={state}")
            if fits:
                top = max(fits)
                print(f"deploying {top} bench servers at once ...", flush=True)
                servers = inventory(work, nodes, vmids[:top], state, pipeline=pipeline)
                first_deploy = (top, playbook("deploy.yml", servers, extra,
                                              options=(*state_var, "-e", f"eagle3_rollout_batch={top}")))  # fmt: skip
                print(f"  first deploy of {top}: {first_deploy[1]:.1f} s", flush=True)
                os.sync()  # the runtimes just written (GiBs) flushed first: the write-back would stall the timings
            for k in deploy_sizes:
                if why_not[k]:  # every size that fits is at most top, which is deployed
                    deploy_rows.append((k, None, why_not[k]))
                    continue
                inv = inventory(work, nodes, vmids[:k], state, pipeline=pipeline)
                seconds = statistics.median(playbook("deploy.yml", inv, extra, options=state_var, expect_converged=True)
                                            for _ in range(args.runs))  # fmt: skip
                deploy_rows.append((k, seconds, None))
                print(f"  K={k}: converged deploy {seconds:.1f} s", flush=True)
    finally:
        if linked_pct:
            os.unlink("/usr/sbin/pct")
        if not args.keep:
            names = list(nodes)
            for i, vmid in enumerate(vmids):
                hop(nodes, state, names[i % len(names)], f"pct destroy {shlex.quote(str(vmid))} --force 1", check=False)
            shutil.rmtree(work, ignore_errors=True)  # its inventories, the peer's HOME with the lab's host keys
        else:
            print(f"kept: the bench containers, and their inventories under {work}", flush=True)
    base_status, base_cleanup = rows[0][1], rows[0][2]
    print(f"\nfleet-wide runs over K idle containers on {len(nodes)} nodes (medians of {args.runs}; "
          f"{os.cpu_count()} cores)")  # fmt: skip
    print(f"{'K':>3} {'status s':>9} {'x K=1':>6} {'s/added':>8} {'cleanup s':>10} {'x K=1':>6} {'s/added':>8} "
          f"{'peer status s':>14} {'floor s':>8} {'status/floor':>13} {'cleanup/floor':>14}")  # fmt: skip
    for k, status, cleanup, peer, low in rows:
        added = max(k - 1, 1)
        print(f"{k:>3} {status:>9.1f} {status / base_status:>6.2f} {(status - base_status) / added:>8.2f} "
              f"{cleanup:>10.1f} {cleanup / base_cleanup:>6.2f} {(cleanup - base_cleanup) / added:>8.2f} "
              f"{'-' if peer is None else f'{peer:.1f}':>14} {low:>8.2f} {status / low:>13.2f} "
              f"{cleanup / low:>14.2f}")  # fmt: skip
    if deploy_rows:
        first = f"; the first deploy of {first_deploy[0]} at once took {first_deploy[1]:.1f} s" if first_deploy else ""
        print(f"\nconverged deploy.yml over K deployed servers (medians of {args.runs}; each run's recap changed=0)"
              f"{first}")  # fmt: skip
        print(f"{'K':>3} {'deploy s':>9} {'x K=1':>6} {'s/added':>8} {'deploy/floor':>13}")
        one = next((took for k, took, _ in deploy_rows if k == 1 and took), None)
        floors = {k: low for k, *_, low in rows}
        for k, took, why in deploy_rows:
            if took is None:
                print(f"{k:>3} {'-':>9}  ({why})")
                continue
            times_one = f"{took / one:.2f}" if one else "-"
            per_added = f"{(took - one) / max(k - 1, 1):.2f}" if one else "-"
            floor_s = floors.get(k)
            print(f"{k:>3} {took:>9.1f} {times_one:>6} {per_added:>8} "
                  f"{f'{took / floor_s:.1f}' if floor_s else '-':>13}")  # fmt: skip
    print(json.dumps({"rows": rows, "deploy": deploy_rows, "first_deploy": first_deploy}))
    table = [{"K": k, "status s": status, "cleanup s": cleanup, "peer status s": peer, "floor s": low,
              "status/floor": status / low, "cleanup/floor": cleanup / low} for k, status, cleanup, peer, low in rows]
    table += [{"K": k, "converged deploy s": took, "why not": why} for k, took, why in deploy_rows]
    record("bench_fleet", table, note=f"medians of {args.runs}; {len(nodes)} nodes", path=args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
