"""``eagle3-ops``: the project's playbooks behind one command, run through ansible-runner."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from eagle3_ops.runner import RunResult, run_playbook


def _collection_module(kind: str, name: str) -> Any:
    """One of the collection's standard-library helpers (plugins/KIND/NAME.py), shared with its plugins: from the
    collection on the import path, else from the collection this package ships in (its root holds both)."""
    import importlib
    import importlib.util
    from pathlib import Path

    try:
        return importlib.import_module(f"ansible_collections.eagle3.ops.plugins.{kind}.{name}")
    except ImportError:
        pass
    path = Path(__file__).resolve().parent.parent / "plugins" / kind / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"eagle3_ops{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_progress_helpers = _collection_module("plugin_utils", "_progress")
served_setting = _collection_module("module_utils", "_setting").served_setting
progress_bar = _progress_helpers.progress_bar
wait_line = _progress_helpers.wait_line
render_status = _progress_helpers.render_status
status_table_rows = _progress_helpers.status_table_rows

EXIT_OK = 0
EXIT_FAILED = 2  # a play failed on some host
EXIT_UNREACHABLE = 4  # some host could not be reached
EXIT_USAGE = 64
# The plays' outcomes reach the CLI as set_stats data (an explicit contract, not task names): the drafter,
# what is served and the benchmark report as lines, the status table as records.
OUTCOME_STATS = ("eagle3_outcomes", "eagle3_report")
# A fact whose setting marks one measured benchmark configuration (spec_bench's "Record the points").
SWEEP_MARKER = "spec_bench_points"


def _progress(event: dict[str, Any]) -> None:
    """One line per finished task and host, like a terse ansible-playbook; a live line for long stages."""
    data = event.get("event_data", {})
    kind = event.get("event", "")
    if kind == "runner_retry":
        line = wait_line(str(data.get("res", {}).get("stdout", "")))
        if line:
            print(f"  {data.get('host', '?'):<14} {line}", flush=True)
        return
    marks = {
        "runner_on_ok": "ok",
        "runner_on_failed": "FAILED",
        "runner_on_unreachable": "UNREACHABLE",
        "runner_on_skipped": None,
    }
    if kind == "playbook_on_play_start":
        print(f"== {data.get('play', '')}", flush=True)
    elif marks.get(kind):
        res = data.get("res", {})
        mark = "changed" if kind == "runner_on_ok" and res.get("changed") else marks[kind]
        line = f"  {data.get('host', '?'):<14} {mark:<11} {data.get('task', '')}"
        if kind != "runner_on_ok" and not data.get("ignore_errors"):
            line += f"\n      {res.get('msg', '')}"
        print(line, flush=True)
    elif kind == "playbook_on_stats":
        stats = data.get("artifact_data") or {}
        lines = [str(line) for key in OUTCOME_STATS for line in stats.get(key) or []]
        if lines:
            print("== outcome", flush=True)
            print("".join(f"  {line}\n" for line in lines), end="", flush=True)


def _report(result: RunResult) -> int:
    for host, counts in sorted(result.stats.items()):
        print(
            f"  {host:<14} ok={counts.get('ok', 0)} changed={counts.get('changed', 0)} "
            f"failed={counts.get('failures', 0)} unreachable={counts.get('dark', 0)}"
        )
    print(f"artifacts: {result.run_dir}")
    if result.ok:
        return EXIT_OK
    if any(c.get("dark") for c in result.stats.values()):
        return EXIT_UNREACHABLE
    return EXIT_FAILED


def _extravars(pairs: list[str]) -> dict[str, Any]:
    """-e KEY=VALUE (a string, as ansible-playbook takes it) or -e '{"key": ...}' (JSON, for lists and dicts)."""
    out: dict[str, Any] = {}
    for pair in pairs:
        if pair.lstrip().startswith("{"):
            try:
                value = json.loads(pair)
            except ValueError as exc:
                raise SystemExit(f"eagle3-ops: -e {pair!r} is not a JSON object: {exc}") from None
            if not isinstance(value, dict):
                raise SystemExit(f"eagle3-ops: -e {pair!r} must be a JSON object")
            out.update(value)
            continue
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"eagle3-ops: -e expects KEY=VALUE, got {pair!r}")
        out[key] = value
    return out


def sweep_progress(total: int):
    """Progress of a benchmark sweep: a bar after each configuration has been measured (per host)."""
    done: dict[str, int] = {}

    def on_event(event: dict[str, Any]) -> None:
        _progress(event)
        data = event.get("event_data", {})
        facts = (data.get("res") or {}).get("ansible_facts") or {}
        if event.get("event") == "runner_on_ok" and SWEEP_MARKER in facts:
            host = data.get("host", "?")
            done[host] = done.get(host, 0) + 1
            points = facts[SWEEP_MARKER] or [{}]
            label = points[-1].get("label", "?") if isinstance(points[-1], dict) else "?"
            print(f"  {host:<14} {progress_bar(done[host], total)} sweep {done[host]}/{total} measured ({label})",
                  flush=True)  # fmt: skip

    return on_event


def _run(args: argparse.Namespace, playbook: str, extra: dict[str, Any] | None = None,
         on_event: Any = None) -> int:  # fmt: skip
    extravars = {**_extravars(args.extra_vars), **(extra or {})}
    result = run_playbook(
        playbook,
        extravars=extravars,
        inventory=args.inventory,
        limit=args.limit,
        check=args.check,
        tags=args.tags,
        on_event=None if args.verbose else (on_event or _progress),
        verbosity=args.verbose,
    )
    return _report(result)


def cmd_lab(args: argparse.Namespace) -> int:
    if args.action == "up":
        return _run(args, "lab.yml", {"lab_state": "present"})
    if args.action == "down":
        return _run(args, "lab.yml", {"lab_state": "absent", "lab_purge": args.purge})
    return _run(args, "smoke.yml")


def cmd_status(args: argparse.Namespace) -> int:
    records: list[dict[str, Any]] = []
    nodes: dict[str, str] = {}
    unreachable: list[str] = []
    failed: list[str] = []

    def collect(event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        host = data.get("host")
        if event.get("event") == "runner_on_unreachable" and host:
            unreachable.append(host)
        elif event.get("event") == "runner_on_failed" and host and not data.get("ignore_errors"):
            failed.append(host)
        elif event.get("event") == "playbook_on_stats":
            stats = data.get("artifact_data") or {}
            records.extend(stats.get("eagle3_status") or [])
            nodes.update(stats.get("eagle3_status_nodes") or {})

    result = run_playbook("status.yml", extravars=_extravars(args.extra_vars), inventory=args.inventory,
                          limit=args.limit, on_event=collect)  # fmt: skip
    print(render_status(status_table_rows(records, unreachable, failed, nodes)))
    print(f"artifacts: {result.run_dir}")
    return EXIT_OK if result.ok else (EXIT_UNREACHABLE if any(c.get("dark") for c in result.stats.values())
                                      else EXIT_FAILED)  # fmt: skip


def render_plan(plans: dict[str, Any], failed: dict[str, str]) -> str:
    """One table per host (the plan module's rows), its warnings, and each refused host's sentence."""
    out: list[str] = []
    for host in sorted(plans):
        out += [f"{host}:", *(f"  {row}" for row in plans[host].get("table", []))]
        out += [f"  warning: {w}" for w in plans[host].get("warnings", [])]
    out += [f"{host}: REFUSED - {msg}" for host, msg in sorted(failed.items())]
    return "\n".join(out)


def cmd_plan(args: argparse.Namespace) -> int:
    plans: dict[str, Any] = {}
    failed: dict[str, str] = {}

    def collect(event: dict[str, Any]) -> None:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_failed" and data.get("host") and not data.get("ignore_errors"):
            failed[data["host"]] = str((data.get("res") or {}).get("msg", "failed"))
        elif event.get("event") == "playbook_on_stats":
            plans.update((data.get("artifact_data") or {}).get("eagle3_plan") or {})

    result = run_playbook("plan.yml", extravars=_extravars(args.extra_vars), inventory=args.inventory,
                          limit=args.limit, on_event=collect)  # fmt: skip
    print(render_plan(plans, failed))
    return _report(result)


def cmd_playbook(playbook: str):
    def run(args: argparse.Namespace) -> int:
        return _run(args, playbook, {"eagle3_force": True} if getattr(args, "force", False) else None)

    return run


def _draft_tokens(value: str) -> int | str:
    """--draft-tokens: an integer, or auto (read as deploy.yml reads -e draft_tokens)."""
    setting = served_setting(value)
    if setting["auto"]:
        return str(setting["draft_tokens"])
    try:
        return int(setting["draft_tokens"])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is neither a number of draft tokens nor auto") from None


def cmd_deploy(args: argparse.Namespace) -> int:
    extra: dict[str, Any] = {"draft_tokens": args.draft_tokens}
    if args.prompts:
        extra["eagle3_auto_prompts"] = args.prompts
    if args.objective:
        extra["eagle3_auto_objective"] = args.objective
    if args.topk is not None:
        extra["speculative_topk"] = args.topk
    if args.steps is not None:
        extra["speculative_steps"] = args.steps
    if args.no_speculation:
        extra["speculative"] = False
    if args.canary:
        extra["draft_canary"] = True
    if args.force:
        extra["eagle3_force"] = True
    return _run(args, "deploy.yml", extra)


def cmd_bench(args: argparse.Namespace) -> int:
    points = len(args.draft_tokens or [16, 10, 5]) + 1  # and the baseline
    return _run(args, "bench.yml", {"bench_draft_tokens": args.draft_tokens} if args.draft_tokens else None,
                on_event=sweep_progress(points))


def _parse_node(text: str) -> dict[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise SystemExit(f"eagle3-ops init: --node expects NAME=ADDRESS (e.g. pve1=pve1.example.org), got {text!r}")
    return {"name": name, "address": address}


def _parse_ct(text: str, nodes: dict[str, str], role: str) -> dict[str, Any]:
    node, sep, vmid = text.partition(":")
    if not sep or not vmid.isdigit() or not 100 <= int(vmid) <= 999999999:
        raise SystemExit(f"eagle3-ops init: --{role} expects NODE:VMID with a VMID of 100 or more, got {text!r}")
    if node not in nodes:
        raise SystemExit(f"eagle3-ops init: --{role} {text}: node {node!r} was not given with --node "
                         f"(nodes: {', '.join(nodes) or 'none'})")  # fmt: skip
    return {"name": f"{role}-{vmid}", "node": node, "address": nodes[node], "vmid": int(vmid)}


def _ask(question: str) -> list[str]:
    """Space-separated answers to one question (only when stdin is a terminal)."""
    if not sys.stdin.isatty():
        return []
    return input(f"{question}: ").split()


def render_inventory(nodes: list[dict[str, str]], trainers: list[dict], servers: list[dict], user: str) -> str:
    """The fleet inventory from this package's templates/fleet-inventory.yml.j2."""
    import datetime
    from pathlib import Path

    import jinja2

    templates = Path(__file__).resolve().parent / "templates"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), trim_blocks=True, lstrip_blocks=True,
                             keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)  # noqa: S701
    groups = {name: members for name, members in (("trainers", trainers), ("servers", servers)) if members}
    return env.get_template("fleet-inventory.yml.j2").render(
        nodes=nodes, groups=groups, user=user, date=datetime.date.today().isoformat())


def cmd_init(args: argparse.Namespace) -> int:
    """Write a fleet inventory from a few answers: the Proxmox nodes and which VMIDs train and serve."""
    from pathlib import Path

    import yaml

    out = Path(args.directory) / "hosts.yml"
    if out.exists() and not args.force:
        print(f"eagle3-ops init: {out} exists; pass --force to replace it", file=sys.stderr)
        return EXIT_USAGE
    node_args = args.node or _ask("Proxmox nodes as NAME=ADDRESS (e.g. pve1=pve1.example.org pve2=10.0.0.12)")
    nodes = [_parse_node(n) for n in node_args]
    if not nodes:
        print("eagle3-ops init: give at least one --node NAME=ADDRESS", file=sys.stderr)
        return EXIT_USAGE
    by_name = {n["name"]: n["address"] for n in nodes}
    trainers = [_parse_ct(t, by_name, "trainer") for t in (args.trainer or _ask("Trainer containers as NODE:VMID"))]
    servers = [_parse_ct(t, by_name, "server") for t in (args.server or _ask("Server containers as NODE:VMID"))]
    if not trainers and not servers:
        print("eagle3-ops init: give at least one --trainer or --server NODE:VMID", file=sys.stderr)
        return EXIT_USAGE
    text = render_inventory(nodes, trainers, servers, args.user)
    yaml.safe_load(text)  # a template bug must not reach the user's inventory
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}: {len(nodes)} nodes, {len(trainers)} trainers, {len(servers)} servers; "
          f"use it with -i {out.parent}")  # fmt: skip
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eagle3-ops",
        description="Train, export, clean up after and serve EAGLE-3 drafters on Proxmox GPU containers.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-i", "--inventory", help="inventory (default: the lab, from ansible.cfg)")
    common.add_argument("-l", "--limit", help="limit to these hosts or groups (Ansible pattern)")
    common.add_argument("-C", "--check", action="store_true", help="check mode: report what would change")
    common.add_argument("-e", "--extra-vars", action="append", default=[], metavar="KEY=VALUE|JSON")
    common.add_argument("-t", "--tags", help="only the stages with these tags (e.g. data, train, serve)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="show Ansible's own output")
    sub = parser.add_subparsers(dest="command", required=True)
    lab = sub.add_parser("lab", parents=[common], help="the local lab: up, down, status")
    lab.add_argument("action", choices=["up", "down", "status"])
    lab.add_argument("--purge", action="store_true", help="with down: also remove the cached container template")
    lab.set_defaults(func=cmd_lab)
    cleanup = sub.add_parser("cleanup", parents=[common], help="free GPUs across the fleet (cleanup.yml)")
    cleanup.set_defaults(func=cmd_playbook("cleanup.yml"))
    provision = sub.add_parser("provision", parents=[common], help="converge containers through the API")
    provision.set_defaults(func=cmd_playbook("provision.yml"))
    train = sub.add_parser("train", parents=[common], help="data, hidden states, training, export check (train.yml)")
    train.add_argument("--force", action="store_true",
                       help="run every stage even where the trainers' fingerprints match their last complete run")
    train.set_defaults(func=cmd_playbook("train.yml"))
    deploy = sub.add_parser("deploy", parents=[common], help="serve the drafter with SGLang EAGLE-3 (deploy.yml)")
    deploy.add_argument("--draft-tokens", type=_draft_tokens, default=16,
                        help="tokens verified per step (chain: steps + 1), or auto: benchmark the workload "
                             "(--prompts) over a search space on one server and serve the best")  # fmt: skip
    deploy.add_argument("--prompts", help="draft tokens auto: the workload's prompts, a JSONL on the servers")
    deploy.add_argument("--objective", choices=["throughput", "itl"], help="draft tokens auto: what best means")
    deploy.add_argument("--topk", type=int, help="tree drafting: branching per step (with --steps)")
    deploy.add_argument("--steps", type=int, help="tree drafting: depth (with --topk)")
    deploy.add_argument("--no-speculation", action="store_true", help="serve the target alone")
    deploy.add_argument("--canary", action="store_true",
                        help="a new draft on the first server only, promoted by its live accept length against the "
                             "others' over real traffic through the router, or rolled back")
    deploy.add_argument("--force", action="store_true",
                        help="run every step even where a server's fingerprint matches its last complete deploy")
    deploy.set_defaults(func=cmd_deploy)
    bench = sub.add_parser("bench", parents=[common], help="sweep draft tokens plus a baseline; report (bench.yml)")
    bench.add_argument("--draft-tokens", type=int, nargs="+", help="values to sweep (default 16 10 5)")
    bench.set_defaults(func=cmd_bench)
    plan = sub.add_parser("plan", parents=[common],
                          help="disk, GPU memory and time for every stage at the target's scale, before anything runs")
    plan.set_defaults(func=cmd_plan)
    status = sub.add_parser("status", parents=[common], help="one table for the fleet: GPUs, training, serving")
    status.set_defaults(func=cmd_status)
    init = sub.add_parser("init", help="write a fleet inventory from a few answers (asks when flags are missing)")
    init.add_argument("directory", help="inventory directory to write hosts.yml into")
    init.add_argument("--node", action="append", metavar="NAME=ADDRESS", help="a Proxmox node (repeatable)")
    init.add_argument("--trainer", action="append", metavar="NODE:VMID", help="a training container (repeatable)")
    init.add_argument("--server", action="append", metavar="NODE:VMID", help="a serving container (repeatable)")
    init.add_argument("--user", default="root", help="ssh user on the nodes (non-root users reach pct with sudo -n)")
    init.add_argument("--force", action="store_true", help="replace an existing hosts.yml")
    init.set_defaults(func=cmd_init)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
