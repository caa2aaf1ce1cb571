# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""One gpu_cleanup run (eagle3.ops.gpu_cleanup): scan, select, guard, then - unless it is a dry run - the ladder and
the verification. Standard library only."""

from __future__ import annotations

import os
import shlex
import subprocess
import time
import typing as t
from typing import Any

from ansible_collections.eagle3.ops.plugins.module_utils._gpu import (
    DEFAULT_EXCLUDE,
    Proc,
    Selection,
    alive,
    kill,
    read_stat,
    resolve_gpus,
    scan,
    select,
    state_word,
    terminate,
    unit_facts,
    unit_of,
    wait_gone,
)
from ansible_collections.eagle3.ops.plugins.module_utils._smi import app_memory, gpu_memory

ARGUMENT_SPEC = {
    "gpus": {"type": "list", "elements": "str", "default": []},
    "match": {"type": "list", "elements": "str", "default": []},
    "exclude": {"type": "list", "elements": "str", "default": list(DEFAULT_EXCLUDE)},
    "include_non_gpu": {"type": "bool", "default": False},
    "include_observers": {"type": "bool", "default": False},
    "stop_unit": {"type": "str"},
    "grace": {"type": "float", "default": 10},
    "timeout": {"type": "float", "default": 30},
    "settle": {"type": "float", "default": 2},
    "free_threshold_mib": {"type": "int", "default": 512},
    "require_paths": {"type": "list", "elements": "path", "default": []},
    "require_paths_optional": {"type": "bool", "default": False},
    "force": {"type": "bool", "default": False},
    "nvidia_smi": {"type": "str", "default": "nvidia-smi"},
    "device_dir": {"type": "path", "default": "/dev"},
}


class CleanupFailed(Exception):
    """A refusal or a failed verification: its message is the task's, the result so far goes with it."""


class GpuCleanup:
    """One run: scan, select, guard, then (unless in check mode) the ladder and the verification."""

    def __init__(self, params: dict[str, Any], check_mode: bool) -> None:
        self.check_mode = check_mode
        self.p = params
        self.smi = shlex.split(self.p["nvidia_smi"])
        self.result: dict[str, Any] = {
            "changed": False, "holders": [], "roots": [], "spared": [], "observers": [], "spared_ancestors": [],
            "signalled": [], "killed": [], "survivors": [], "gpus_before": [], "gpus_after": [], "freed_mib": 0,
            "unit_stopped": False, "targets": [], "units": [],
        }  # fmt: skip
        self.stop_units: list[str] = []
        self.wanted: set[int] | None = None

    def fail(self, msg: str) -> t.NoReturn:
        raise CleanupFailed(msg)

    def validate(self) -> None:
        for name in ("grace", "timeout", "settle"):
            if self.p[name] < 0:
                self.fail(f"{name} must be 0 or more seconds, not {self.p[name]}.")
        if self.p["free_threshold_mib"] < 0:
            self.fail(f"free_threshold_mib must be 0 or more MiB, not {self.p['free_threshold_mib']}.")
        if self.p["include_non_gpu"] and not self.p["match"]:
            self.fail("include_non_gpu needs match patterns, or it would stop every process.")

    def scan(self) -> dict[int, Proc]:
        procs = scan(dev_dir=self.p["device_dir"])
        if not any(q.holds_gpu for q in procs.values()):
            return procs  # nvidia-smi lists the memory of device holders only: none here, nothing to ask
        mem = app_memory(self.smi)
        for q in procs.values():
            q.memory_mib = mem.get(q.pid)
        return procs

    def run(self) -> None:
        before = gpu_memory(self.smi)
        self.result["gpus_before"] = before or []
        procs = self.scan()
        try:
            self.wanted = resolve_gpus(self.p["gpus"], before)
        except ValueError as exc:
            self.fail(f"{exc}: list indices from 'nvidia-smi -L'.")
        used = None if before is None else {g["index"]: g["memory_used"] for g in before}
        sel = select(procs, self.wanted, self.p["match"], self.p["exclude"], self.p["include_non_gpu"],
                     include_observers=self.p["include_observers"], gpu_used=used,
                     free_threshold_mib=self.p["free_threshold_mib"])
        self.report_selection(sel)
        if not sel.holders and self.named_unit() is None:
            self.result["gpus_after"] = self.result["gpus_before"]
            return
        self.plan_units(sel, procs)
        self.guard(sel)
        if self.check_mode:
            self.result["changed"] = bool(sel.holders) or any(u["action"] == "stop" for u in self.result["units"])
            self.result["signalled"] = sorted(sel.job_pids())
            return
        targets = self.ladder(sel, procs)
        self.verify(sel, procs, targets, before)

    def named_unit(self) -> str | None:
        """The unit stop_unit names, or None when it names none (unset, empty, auto)."""
        return None if self.p["stop_unit"] in (None, "", "auto") else self.p["stop_unit"]

    def plan_units(self, sel: Selection, procs: dict[int, Proc]) -> None:
        """Which systemd units to stop first: the one named, or (auto) every service whose main process is the job."""
        wanted = self.named_unit()
        if wanted is not None:
            try:
                active = subprocess.run(["systemctl", "is-active", "--quiet", wanted], check=False).returncode == 0
            except OSError:  # no systemd here: nothing to stop
                active = False
            facts = (unit_facts(wanted) or {}) if active else {}
            self.stop_units = [wanted] if active else []
            self.result["units"] = [{"unit": wanted, "main_pid": None, "restart": None,
                                     "boot": facts.get("UnitFileState") == "enabled",
                                     "action": "stop" if active else "inactive",
                                     "why": "named by stop_unit" + ("" if active else ", not running")}]  # fmt: skip
            return
        job = sel.job_pids()
        found = sorted({u for u in (unit_of(q.pid) for q in [*sel.roots, *sel.chain, *sel.holders]) if u})
        for unit in found:
            facts = unit_facts(unit) or {}
            main = facts.get("MainPID", 0)
            entry = {"unit": unit, "main_pid": main or None, "restart": facts.get("Restart"),
                     "boot": facts.get("UnitFileState") == "enabled", "spans": facts.get("spans", [])}  # fmt: skip
            if not facts:
                entry.update(action="leave", why="systemctl could not tell its main process")
            elif main in job:
                why = "its main process is the job" + (f" (pid {main})" if main else "")
                if self.p["stop_unit"] == "auto":
                    entry.update(action="stop", why=why)
                    self.stop_units.append(unit)
                else:
                    entry.update(action="leave", why=f"{why}, but stop_unit is not set (auto would stop it)")
            else:
                cmd = procs[main].cmdline[:60] if main in procs else "not running"
                entry.update(action="leave", why=f"its main process (pid {main}: {cmd}) is not part of the job")
            self.result["units"].append(entry)

    def report_selection(self, sel: Selection) -> None:
        self.result["holders"] = [h.describe() for h in sel.holders]
        self.result["roots"] = [r.describe() for r in sel.roots]
        self.result["spared"] = [s.describe(sel.reasons.get(s.pid)) for s in sel.spared]
        self.result["observers"] = [o.describe(sel.reasons.get(o.pid)) for o in sel.observers]
        self.result["spared_ancestors"] = [a.describe(sel.reasons.get(a.pid)) for a in sel.spared_ancestors]
        targets = [{**r.describe("job root: stopped first, so it cannot restart its workers"), "role": "root"}
                   for r in sel.roots]  # fmt: skip
        targets += [{**c.describe("runs between the job root and a holder: a loop there would start it again"),
                     "role": "chain"} for c in sel.chain]  # fmt: skip
        for h in sel.holders:
            held = f"GPU {', '.join(map(str, sorted(h.gpus)))}" if h.gpus else "nvidiactl/nvidia-uvm"
            mib = f", {h.memory_mib} MiB" if h.memory_mib else ""
            targets.append({**h.describe(f"holds {held}{mib}"), "role": "holder"})
        self.result["targets"] = targets

    def guard(self, sel: Selection) -> None:
        """Refuse while the final checkpoint is missing or incomplete (the job may still be writing it)."""
        if not sel.holders or self.p["force"]:
            return
        paths = [p for p in self.p["require_paths"]
                 if not self.p["require_paths_optional"] or os.path.isdir(os.path.dirname(p))]  # fmt: skip
        if not paths:
            return
        # Imported here: only a guard with paths reads a checkpoint's header.
        from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import file_problem

        problems = [why for why in map(file_problem, paths) if why]
        if problems:
            self.fail(f"Refusing to stop {len(sel.holders)} GPU holders: {'; '.join(problems)}; the job may still be "
                      "writing its last checkpoint, so wait for it or set force: true.")

    def disable_unit(self, unit: str) -> None:
        """systemctl disable UNIT: a unit started at boot (eagle3_train's job, an SGLang server) would take the GPUs
        again at the host's next boot; the playbook that starts the job enables it again."""
        proc = subprocess.run(["systemctl", "disable", "--quiet", unit], capture_output=True, text=True, timeout=60,
                              check=False)  # fmt: skip
        if proc.returncode != 0:
            self.fail(f"systemctl disable {unit} failed ({proc.stderr.strip()}): the job would start again at the "
                      "next boot, so disable it by hand and rerun the cleanup.")  # fmt: skip

    def stop_unit(self, unit: str) -> bool:
        """systemctl stop UNIT (which stops its restarts too); True when it was active."""
        active = subprocess.run(["systemctl", "is-active", "--quiet", unit], check=False).returncode == 0
        if not active:
            return False
        # systemctl stop returns once the unit has stopped, SIGKILLing it after its own TimeoutStopSec (a trainer
        # saves an interrupt checkpoint in that time): wait that long, and a little more.
        limit = (unit_facts(unit) or {}).get("stop_timeout") or 0
        proc = subprocess.run(["systemctl", "stop", unit], capture_output=True, text=True,
                              timeout=max(self.p["timeout"], 10, limit + 15), check=False)  # fmt: skip
        if proc.returncode != 0:
            self.fail(f"systemctl stop {unit} failed ({proc.stderr.strip()}): check the unit's ExecStop.")
        return True

    def ladder(self, sel: Selection, procs: dict[int, Proc]) -> list[Proc]:
        """Unit, then SIGTERM to roots and holders' groups, grace, SIGKILL what is left."""
        for unit in self.stop_units:
            entries = [entry for entry in self.result["units"] if entry["unit"] == unit]
            boot = any(entry.get("boot") for entry in entries)
            if boot:  # first: a stopped job must not come back at the next boot
                self.disable_unit(unit)
            stopped = self.stop_unit(unit)
            self.result["unit_stopped"] |= stopped or boot
            for entry in entries:
                entry["action"] = "stopped" if stopped else "inactive"
                entry["disabled"] = boot
        targets = [*sel.roots, *sel.chain, *sel.holders]
        self.result["signalled"] = sorted(terminate(sel, procs))
        left = wait_gone(targets, self.p["grace"])
        self.result["killed"] = sorted(kill(left))
        self.result["changed"] = bool(self.result["signalled"] or self.result["killed"] or self.result["unit_stopped"])
        return targets

    def restarted_by_job(self, targets: list[Proc]) -> list[Proc]:
        """New holders of the selected GPUs that a process of the job started (a loop's last turn): killed too."""
        job = {q.pid for q in targets}
        seen = {(q.pid, q.starttime) for q in targets}
        fresh = [q for q in scan(dev_dir=self.p["device_dir"], parents=job).values()
                 if q.holds_gpu and (q.pid, q.starttime) not in seen
                 and (self.wanted is None or not q.gpus or q.gpus & self.wanted)]  # fmt: skip
        self.result["killed"] = sorted({*self.result["killed"], *kill(fresh)})
        return fresh

    def busy(self, after: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        return [g for g in after or []
                if (self.wanted is None or g["index"] in self.wanted)
                and g["memory_used"] > self.p["free_threshold_mib"]]  # fmt: skip

    def verify(self, sel: Selection, procs: dict[int, Proc], targets: list[Proc], before: list | None) -> None:
        """Selected holders gone and selected GPUs at or below the threshold, within the timeout."""
        deadline = time.monotonic() + self.p["timeout"]
        free_since: float | None = None
        while True:
            survivors = [q for q in targets if alive(q)]
            after = gpu_memory(self.smi)
            busy = self.busy(after)
            now = time.monotonic()
            free_since = (free_since or now) if not survivors and not busy else None
            settled = free_since is not None and now - free_since >= min(self.p["settle"], deadline - free_since)
            if settled or now >= deadline:
                break
            if survivors:
                kill(survivors)  # a holder that came back from SIGSTOP or was mid-fork
            elif busy:
                targets += self.restarted_by_job(targets)
            time.sleep(0.2)
        self.result["gpus_after"] = after or []
        selected = [g for g in before or [] if self.wanted is None or g["index"] in self.wanted]
        used_after = {g["index"]: g["memory_used"] for g in after or []}
        self.result["freed_mib"] = sum(max(0, g["memory_used"] - used_after.get(g["index"], 0)) for g in selected)
        for q in survivors:
            st = read_stat(q.pid)
            q.state = st[0] if st else q.state
        self.result["survivors"] = [{**q.describe(), "state": state_word(q.state)} for q in survivors]
        if survivors or busy:
            self.fail(self.explain(sel, procs, survivors, busy))

    def explain(self, sel: Selection, procs: dict[int, Proc], survivors: list[Proc], busy: list[dict]) -> str:
        """Scan again and say who holds the memory now: restarts, survivors by state, spared processes."""
        now = self.scan()
        busy_idx = {g["index"] for g in busy}
        first_seen = {(q.pid, q.starttime) for q in procs.values()}
        spared = {q.pid: sel.reasons.get(q.pid, "spared") for q in [*sel.spared, *sel.observers]}
        holders_after, parts, restarted, stuck = [], [], False, any(q.state in ("D", "Z") for q in survivors)
        units: set[str] = set()
        for q in sorted(now.values(), key=lambda q: q.pid):
            if not (q.gpus & busy_idx or (q.control and not q.gpus and busy_idx)) or q.pid in sel.protected:
                continue
            entry = {**q.describe(), "state": state_word(q.state), "new": (q.pid, q.starttime) not in first_seen}
            holders_after.append(entry)
            stuck |= q.state in ("D", "Z")
            if entry["new"]:
                restarted = True
                parent = now.get(q.ppid)
                by = f"pid {q.ppid} ({parent.cmdline[:60]})" if parent else f"pid {q.ppid}"
                unit = unit_of(q.pid)
                if unit:
                    facts = unit_facts(unit) or {}
                    by += f" for the unit {unit} (Restart={facts.get('Restart', '?')})"
                    units.add(unit)
                    entry["unit"] = unit
                parts.append(f"pid {q.pid} is new since the scan, started by {by}: a restart")
            elif q.pid in spared:
                parts.append(f"pid {q.pid} was spared ({spared[q.pid]})")
            elif q.state in ("D", "Z"):
                parts.append(f"pid {q.pid} is in {state_word(q.state)}")
            else:
                parts.append(f"pid {q.pid} ({state_word(q.state)}) {q.cmdline[:60]}")
        self.result["holders_after"] = holders_after
        gpus = ", ".join(f"GPU {g['index']} uses {g['memory_used']} MiB" for g in busy)
        waited = f"{self.p['grace'] + self.p['timeout']:.0f} s"
        if units:
            names = ", ".join(sorted(units))
            fix = (f"systemd restarts it: stop {names} first (stop_unit: {sorted(units)[0]}, or stop_unit: auto) "
                   "and run again")
        elif restarted:
            fix = "stop what restarts the job (its supervisor or unit: stop_unit, or widen match) and run again"
        elif stuck:
            fix = ("processes in D state or zombies wait on the driver, so check dmesg and, if they persist, "
                   "reset the GPU")
        elif holders_after:
            fix = "stop the processes named, or widen gpus, match or include_observers"
        else:
            fix = "no process holds them now, so the driver still frees the memory: check dmesg and nvidia-smi"
        survivor_text = "; ".join(f"pid {q.pid} survived ({state_word(q.state)})" for q in survivors)
        holders_text = "; ".join(parts) or "no process holds them"
        detail = "; ".join(t for t in (gpus, survivor_text, holders_text) if t)
        return f"GPUs are not free after {waited}: {detail}; {fix}."


def summarised(result: dict[str, Any]) -> dict[str, Any]:
    """The result with what a fleet's summary and the role's next step read from it, computed here so that a converged
    host costs the play no task of its own: ``idle`` (nothing to signal and no unit to stop: the real pass and its
    verification would find the same) and ``summary`` (counts, the units stopped and the targets)."""
    stopped = [u["unit"] for u in result["units"] if u.get("action") in ("stop", "stopped")]
    result["idle"] = not result["holders"] and not result["targets"] and not any(
        u.get("action") == "stop" for u in result["units"])
    result["summary"] = {
        "holders": len(result["holders"]), "signalled": len(result["signalled"]), "killed": len(result["killed"]),
        "survivors": len(result["survivors"]), "freed_mib": result["freed_mib"], "observers": len(result["observers"]),
        "spared_sessions": len(result["spared_ancestors"]), "units_stopped": stopped, "targets": result["targets"],
    }  # fmt: skip
    return result


def outcome(params: dict[str, Any], check_mode: bool) -> tuple[dict[str, Any], str | None, str | None]:
    """One run's result, its failure message (None when it succeeded) and, for the unexpected, the traceback."""
    cleanup = GpuCleanup(params, check_mode)
    try:
        cleanup.validate()
        cleanup.run()
    except CleanupFailed as exc:
        return summarised(cleanup.result), str(exc), None
    except Exception as exc:  # the unexpected gets a traceback
        import traceback  # pylint: disable=import-outside-toplevel  # only here: a dry run would import it for nothing

        return summarised(cleanup.result), f"gpu_cleanup failed unexpectedly: {exc}", traceback.format_exc()
    return summarised(cleanup.result), None, None
