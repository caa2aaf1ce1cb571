"""The status table and the progress lines of eagle3-ops."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_ops.cli import build_parser, progress_bar, render_status, wait_line


def test_status_table():
    rows = {
        "ct129": {"state": "running", "gpus": [
            {"memory_used": 30003, "memory_total": 97887, "power_draw": 462.5, "power_limit": 600.0,
             "utilization_gpu": 95}] * 4,
            "training": {"attempt": 3, "total_seq_len": 16384, "cause": "running", "epoch": 2, "epochs": 5,
                         "step": 812, "result": False}},
        "ct130": {"state": "running", "gpus": [], "training": None,
                  "serving": {"draft": "/srv/eagle3/drafts/kimi-eagle3", "draft_tokens": 16, "accept_length": 2.947}},
        "ct131": {"state": "unreachable"},
    }  # fmt: skip
    lines = render_status(rows).splitlines()
    assert lines[0].split() == ["HOST", "STATE", "GPUS", "MEMORY", "USED/TOTAL", "POWER", "UTIL", "TRAINING", "SERVING"]
    assert lines[1].split()[:3] == ["ct129", "running", "4"]
    assert "117.2/382.4 GiB" in lines[1] and "1850/2400 W" in lines[1] and "95%" in lines[1]
    assert "#3 seq 16384 running epoch 2/5 step 812" in lines[1] and lines[1].rstrip().endswith("-")
    assert lines[2].rstrip().endswith("kimi-eagle3 x16 accept 2.95")
    assert lines[3].split() == ["ct131", "unreachable", "-", "-", "-", "-", "-", "-"]
    # With the nodes known (pct_node): a NODE column, "-" for a host whose node is not named.
    from eagle3_ops.cli import status_table_rows

    noded = status_table_rows([{"host": "ct130", "gpus": []}], ["ct131"], ["ct132"],
                              {"ct130": "pve-lab", "ct131": "pve-lab2"})  # fmt: skip
    lines = render_status(noded).splitlines()
    assert lines[0].split()[:3] == ["HOST", "NODE", "STATE"]
    assert [line.split()[:3] for line in lines[1:]] == [["ct130", "pve-lab", "running"],
                                                        ["ct131", "pve-lab2", "unreachable"], ["ct132", "-", "failed"]]
    rows["ct131"] = {"state": "running", "gpus": [], "router": [
        {"url": "http://10.0.0.33:30000", "healthy": True, "status": "ready", "load": 2},
        {"url": "http://10.0.0.34:30000", "healthy": False, "status": "pending", "load": None}]}  # fmt: skip
    tail = render_status(rows).splitlines()[-3:]
    assert tail == ["router on ct131: 2 server(s)", "  http://10.0.0.33:30000  healthy  ready  load 2",
                    "  http://10.0.0.34:30000  UNHEALTHY  pending  load -"]  # fmt: skip


def test_progress_lines():
    assert progress_bar(3, 12, width=12) == "[###.........]  25%"
    sample = {"attempt": 2, "total_seq_len": 512, "epoch": 4, "epochs": 12, "step": 40, "tokens_per_s": 3590.0,
              "gpus": [{"power_draw": 250.0, "power_limit": 600.0}]}  # fmt: skip
    line = wait_line("ActiveState=active\nNRestarts=0\n" + json.dumps(sample))
    assert line is not None and "epoch 4/12 step 40 3590 tok/s (attempt 2, total_seq_len 512) 250/600 W" in line
    regen = wait_line("ActiveState=active\n[regen] 40/160 (8.4/s)")
    assert regen == "[######..................]  25% [regen] 40/160 (8.4/s)"
    assert wait_line("ActiveState=active\nResult=success") is None
    timed = wait_line(json.dumps({**sample, "eta_epoch_s": 5400, "eta_s": 600}))
    assert timed is not None and "step 40 3590 tok/s, ETA epoch 1.5 h, run 10 min (attempt 2" in timed
    hidden = wait_line("ActiveState=active\n[hidden] 1200/4600 GB written, 3400 GB to go, ETA 5.2 h (180.0 MB/s)")
    assert hidden is not None and hidden.startswith("[######") and "3400 GB to go, ETA 5.2 h" in hidden


def test_parser_has_the_commands():
    parser = build_parser()
    for argv in (["lab", "up"], ["cleanup", "-l", "trainers", "--check"], ["provision", "-i", "x"], ["status"],
                 ["plan"], ["train"], ["deploy", "--draft-tokens", "10"], ["bench", "--draft-tokens", "16", "5"]):
        assert parser.parse_args(argv).func
    args = parser.parse_args(["deploy", "--topk", "4", "--steps", "3", "--draft-tokens", "8"])
    assert (args.topk, args.steps, args.draft_tokens) == (4, 3, 8)
    auto = parser.parse_args(["deploy", "--draft-tokens", "AUTO", "--prompts", "/srv/p.jsonl", "--objective", "itl"])
    assert (auto.draft_tokens, auto.prompts, auto.objective) == ("auto", "/srv/p.jsonl", "itl")
    with pytest.raises(SystemExit):
        parser.parse_args(["deploy", "--draft-tokens", "many"])


def test_sweep_progress_counts_measured_configurations(capsys):
    from eagle3_ops.cli import sweep_progress

    on_event = sweep_progress(4)
    points: list[dict] = []
    for label in ("baseline", "5"):
        points = [*points, {"label": label, "max_concurrency": 1}]
        # The marker is the fact spec_bench sets, whatever the task is called.
        res = {"ansible_facts": {"spec_bench_points": points}}
        on_event({"event": "runner_on_ok", "event_data": {"host": "ct130", "res": res, "task": "renamed task"}})
    # A task merely named like the old one does not count.
    on_event({"event": "runner_on_ok", "event_data": {"host": "ct130", "res": {}, "task": "Drive load at 16"}})
    lines = [line for line in capsys.readouterr().out.splitlines() if "sweep" in line]
    assert len(lines) == 2
    assert lines[-1].split()[1:] == ["[############............]", "50%", "sweep", "2/4", "measured", "(5)"]


def test_outcomes_come_from_set_stats(capsys):
    from eagle3_ops.cli import _progress

    stats = {"eagle3_outcomes": ["ct129: drafter trained, best epoch 14"], "eagle3_report": ["| 16 | 1 |"]}
    _progress({"event": "playbook_on_stats", "event_data": {"artifact_data": stats}})
    out = capsys.readouterr().out
    assert "== outcome" in out and "ct129: drafter trained, best epoch 14" in out and "| 16 | 1 |" in out


def test_init_writes_a_fleet_inventory_ansible_reads(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from eagle3_ops.cli import main

    inv = tmp_path / "fleet"
    rc = main(["init", str(inv), "--node", "pve1=10.0.0.11", "--node", "pve2=pve2.example.org",
               "--trainer", "pve1:129", "--trainer", "pve2:131", "--server", "pve2:130"])
    assert rc == 0
    listing = subprocess.run([str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inv), "--list"],
                             capture_output=True, text=True, check=True).stdout
    data = json.loads(listing)
    hostvars = data["_meta"]["hostvars"]
    assert sorted(data["trainers"]["hosts"]) == ["trainer-129", "trainer-131"]
    assert data["servers"]["hosts"] == ["server-130"]
    assert hostvars["trainer-131"]["ansible_host"] == "pve2.example.org" and hostvars["trainer-131"]["pct_vmid"] == 131
    assert hostvars["server-130"]["ansible_connection"] == "eagle3.ops.pct"
    assert hostvars["pve1"]["proxmox_node"] == "pve1"
    # An existing inventory is not overwritten, and bad answers are refused by name.
    assert main(["init", str(inv), "--node", "pve1=x", "--server", "pve1:130"]) == 64
    with pytest.raises(SystemExit, match="node 'pve9' was not given"):
        main(["init", str(tmp_path / "other"), "--node", "pve1=x", "--server", "pve9:130"])


def test_force_runs_past_the_fingerprints(monkeypatch):
    from eagle3_ops import cli

    seen: list[tuple[str, dict]] = []
    monkeypatch.setattr(cli, "_run", lambda args, playbook, extra=None, on_event=None: seen.append(
        (playbook, extra or {})) or 0)  # fmt: skip
    parser = build_parser()
    for argv in (["train", "--force"], ["train"], ["deploy", "--force", "--draft-tokens", "5"], ["deploy"]):
        args = parser.parse_args(argv)
        assert args.func(args) == 0
    assert seen == [("train.yml", {"eagle3_force": True}), ("train.yml", {}),
                    ("deploy.yml", {"draft_tokens": 5, "eagle3_force": True}), ("deploy.yml", {"draft_tokens": 16})]


def test_canary_asks_deploy_yml_for_one(monkeypatch):
    from eagle3_ops import cli

    seen: list[dict] = []
    monkeypatch.setattr(cli, "_run", lambda args, playbook, extra=None, on_event=None: seen.append(extra or {}) or 0)
    args = build_parser().parse_args(["deploy", "--canary", "--draft-tokens", "10"])
    assert args.func(args) == 0 and seen == [{"draft_tokens": 10, "draft_canary": True}]


def test_a_server_shows_its_live_accept_length_and_throughput_beside_the_gates_and_warns_on_drift():
    serving = {"draft": "/d/kimi-eagle3", "draft_tokens": 16, "accept_length": 2.61, "live_accept_length": 2.05,
               "gate_accept_length": 2.7, "tokens_per_s": 812.4,
               "drift_warning": "accepts 2.05 tokens per step live, 24% below the 2.70 its gate measured at deploy"}
    lines = render_status({"ct130": {"state": "running", "gpus": [], "serving": serving}}).splitlines()
    assert lines[1].rstrip().endswith("kimi-eagle3 x16 accept 2.61 live 2.05 gate 2.70 812 tok/s")
    assert lines[2] == ("WARNING: ct130 accepts 2.05 tokens per step live, 24% below the 2.70 its gate measured at "
                        "deploy")
    quiet = {**serving, "live_accept_length": None, "tokens_per_s": None, "drift_warning": None}
    lines = render_status({"ct130": {"state": "running", "gpus": [], "serving": quiet}}).splitlines()
    assert lines[1].rstrip().endswith("kimi-eagle3 x16 accept 2.61 gate 2.70") and len(lines) == 2
    # an immutable draft version shows as its root's name and the first digits of its own
    versioned = {**quiet, "draft": "/d/kimi-eagle3/3f9c2a7be01d44c5"}
    lines = render_status({"ct130": {"state": "running", "gpus": [], "serving": versioned}}).splitlines()
    assert lines[1].rstrip().endswith("kimi-eagle3@3f9c2a7b x16 accept 2.61 gate 2.70")


def test_plan_prints_each_hosts_table_and_each_refusal(monkeypatch, capsys):
    from eagle3_ops import cli
    from eagle3_ops.runner import RunResult

    def fake_run(playbook, extravars, inventory, limit, on_event):
        assert playbook == "plan.yml" and extravars == {"eagle3_plan_force": "true"}
        on_event({"event": "runner_on_failed", "event_data": {"host": "srv1", "res": {
            "msg": "srv1's GPUs cannot hold what it would load: 80.1 GiB per GPU"}}})
        on_event({"event": "playbook_on_stats", "event_data": {"artifact_data": {"eagle3_plan": {
            "ct129": {"table": ["stage | what", "training | start 16384"], "warnings": ["declared throughput"]}}}}})
        return RunResult(playbook=playbook, rc=2, status="failed", stats={"srv1": {"failures": 1}},
                         run_dir=Path("/tmp/run"))

    monkeypatch.setattr(cli, "run_playbook", fake_run)
    args = build_parser().parse_args(["plan", "-e", "eagle3_plan_force=true"])
    assert args.func(args) == cli.EXIT_FAILED
    out = capsys.readouterr().out
    assert "ct129:\n  stage | what\n  training | start 16384\n  warning: declared throughput\n" in out
    assert "srv1: REFUSED - srv1's GPUs cannot hold what it would load: 80.1 GiB per GPU" in out
