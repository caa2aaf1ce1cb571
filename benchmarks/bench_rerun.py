#!/usr/bin/env python3
"""Benchmark: reruns that find nothing to do, and a switch of the served setting, against a peer and a floor.

On the lab after the main job (ansible-playbook lab.yml train.yml deploy.yml), in one run:

  converged   lab.yml, train.yml and deploy.yml as they are: one fingerprint check per host
              (eagle3.ops.stage_stamp), the stages (the lab's build) skipped as a whole;
  peer        the same playbooks with -e eagle3_force=true: every stage runs and finds its own work done - how a
              rerun behaved before the fingerprints;
  floor       a playbook of one ping per host on the same inventory: Ansible's start and one round trip;
  switch      deploy.yml -e draft_tokens=B after A (and back), whole, and its engine part: the seconds from the
              unit's restart to the first healthy /health answer, which the switch itself reports ("restarted and
              healthy in N s", measured by eagle3.ops.sglang_service on the server). Ansible's share is each switch
              less its own engine part. The engine's part is also measured alone, as a check: a playbook of one task
              that restarts the unit and polls /health, less the floor.

Prints medians of --runs runs and ratios. The served setting is left as it was found (A).

Usage: python benchmarks/bench_rerun.py [--runs 3] [-i inventory/lab] [--switch 16,10] [--skip-train] [--skip-lab]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _record import record  # benchmarks/_record.py (this script's directory is on sys.path)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

FLOOR = """- name: Floor
  hosts: "{{ target }}"
  gather_facts: false
  tasks:
    - name: One round trip
      ansible.builtin.ping:
"""

# The engine's own part of a switch: restart the unit, wait until /health answers (one task, one round trip), polled
# every 0.1 s by one Python - tighter than sglang_service's 0.2 s, so the engine's part is not overstated.
ENGINE = """- name: The engine's restart and health wait
  hosts: servers
  gather_facts: false
  tasks:
    - name: Restart and wait for health
      ansible.builtin.command:
        argv:
          - sh
          - -c
          - |
            systemctl restart sglang &&
            exec python3 -c 'import time, urllib.request
            for _ in range(6000):
                try:
                    urllib.request.urlopen("http://127.0.0.1:30000/health", timeout=2)
                    raise SystemExit(0)
                except OSError:
                    time.sleep(0.1)
            raise SystemExit(1)'
      changed_when: true
"""


# What a switch says of its engine part (roles/sglang_serve/vars/main.yml, _sglang_serve_served).
HEALTHY = re.compile(r"restarted and healthy in ([\d.]+) s")


def run_out(inventory: str, playbook: str | Path, *args: str) -> tuple[float, str]:
    """Seconds the playbook took, and its output (whitespace collapsed: the callback wraps long messages)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "PATH": f"{BIN}:{os.environ['PATH']}"}
    t0 = time.monotonic()
    proc = subprocess.run([str(BIN / "ansible-playbook"), "-i", inventory, str(playbook), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        sys.exit(f"{playbook} {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    return seconds, " ".join(proc.stdout.split())


def run(inventory: str, playbook: str | Path, *args: str) -> float:
    return run_out(inventory, playbook, *args)[0]


def switch(inventory: str, setting: int) -> tuple[float, float]:
    """One switch: its seconds and its engine part (the restart to the first healthy answer, as the switch reports
    it; the servers of an inventory with several restart one after another - deploy.yml's rollout batch of one -, so
    their waits add up)."""
    seconds, out = run_out(inventory, "deploy.yml", "-e", f"draft_tokens={setting}")
    healthy = [float(x) for x in HEALTHY.findall(out)]
    if not healthy:
        sys.exit(f"deploy.yml -e draft_tokens={setting} did not say when the server was healthy:\n{out[-3000:]}")
    return seconds, sum(healthy)


def median(inventory: str, runs: int, playbook: str | Path, *args: str) -> float:
    return statistics.median(run(inventory, playbook, *args) for _ in range(runs))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("-i", "--inventory", default="inventory/lab")
    ap.add_argument("--switch", default="16,10", help="A,B: the setting served, and the one switched to and back")
    ap.add_argument("--skip-train", action="store_true", help="no train.yml")
    ap.add_argument("--skip-lab", action="store_true", help="no lab.yml")
    ap.add_argument("--record", default=None, help="the results file (default benchmarks/results/bench_rerun.jsonl; "
                    "an empty value records nothing)")
    args = ap.parse_args()
    first, second = (int(x) for x in args.switch.split(","))
    inv = args.inventory
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-rerun-") as tmp:
        floor_pb, engine_pb = Path(tmp, "floor.yml"), Path(tmp, "engine.yml")
        floor_pb.write_text(FLOOR)
        engine_pb.write_text(ENGINE)
        rows: list[tuple[str, float, float, float]] = []
        plays = [("deploy.yml", "servers", ("-e", f"draft_tokens={first}"))]
        if not args.skip_train:
            plays.insert(0, ("train.yml", "trainers", ()))
        if not args.skip_lab:
            plays.insert(0, ("lab.yml", "lab_hosts", ()))
        for name, group, extra in plays:
            run(inv, name, *extra)  # converged from here on (the first run may still keep its fingerprint)
            converged = median(inv, args.runs, name, *extra)
            forced = median(inv, args.runs, name, *extra, "-e", "eagle3_force=true")
            floor = median(inv, args.runs, floor_pb, "-e", f"target={group}")
            rows.append((name, converged, forced, floor))
        switches: list[tuple[float, float]] = []
        engine = []
        for _ in range(args.runs):
            switches.append(switch(inv, second))
            switches.append(switch(inv, first))
            engine.append(run(inv, engine_pb))
        floor = median(inv, args.runs, floor_pb, "-e", "target=servers")
    print(f"converged reruns ({inv}, medians of {args.runs}; 2 cores)")
    print(f"{'playbook':<12} {'converged s':>12} {'peer (forced) s':>16} {'floor s':>8} {'peer/converged':>15} "
          f"{'converged/floor':>16}")  # fmt: skip
    for name, converged, forced, floor_s in rows:
        print(f"{name:<12} {converged:12.1f} {forced:16.1f} {floor_s:8.1f} {forced / converged:15.1f} "
              f"{converged / floor_s:16.1f}")  # fmt: skip
    whole = statistics.median(s for s, _ in switches)
    in_switch = statistics.median(e for _, e in switches)
    share = statistics.median(s - e for s, e in switches)  # each switch less its own engine part
    engine_s = statistics.median(engine)
    engine_alone = engine_s - floor  # the restart and health wait, without Ansible's start and round trip
    print(f"\nswitch draft_tokens {first} <-> {second} (medians of {len(switches)} switches)")
    print(f"  whole switch          {whole:6.1f} s")
    print(f"  engine restart+health {in_switch:6.1f} s  (in each switch, from the unit's restart to the first healthy "
          "answer, as the switch reports it)")  # fmt: skip
    print(f"  Ansible's share       {share:6.1f} s  ({share / whole:.0%} of the switch; each switch less its own "
          "engine part)")  # fmt: skip
    print(f"  check: the engine alone {engine_alone:4.1f} s  (one task restarting the unit and polling /health: "
          f"{engine_s:.1f} s, less the floor {floor:.1f} s); the whole switch less it: {whole - engine_alone:.1f} s")
    table = [{"run": name, "converged s": converged, "forced s": forced, "floor s": floor_s}
             for name, converged, forced, floor_s in rows]  # fmt: skip
    table.append({"run": f"switch {first}<->{second}", "whole s": whole, "engine s": in_switch, "Ansible s": share})
    record("bench_rerun", table, note=f"medians of {args.runs}; {inv}", path=args.record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
