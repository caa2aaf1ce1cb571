"""eagle3_planner on the controller, as train.yml and deploy.yml run it: in check mode, the trainer's table and the
JSON report from the target's config.json, the controller's prompts and the GPUs; a refusal in one sentence before
anything runs, and eagle3_plan_force turning it into a warning; a server too small for the target refused."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.conftest import ansible_env, run_playbook

ROOT = Path(__file__).resolve().parents[3]
PLAY = """- name: The plan on the controller
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: eagle3.ops.eagle3_defaults
  tasks:
    - name: The plan
      ansible.builtin.import_role:
        name: eagle3.ops.eagle3_planner
        tasks_from: {tasks}
"""
GPU_96GB = {"index": 0, "memory_total": 98304, "memory_used": 0}
GPU_80GB = {"index": 0, "memory_total": 81559, "memory_used": 0}


def plan(tmp_path: Path, tasks: str, **values):
    (tmp_path / "kimi").mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests/data/targets/kimi-k2.5.config.json", tmp_path / "kimi" / "config.json")
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"id": "p{i}"}}\n' for i in range(1000)))
    (tmp_path / f"{tasks}.yml").write_text(PLAY.format(tasks=tasks))
    extra = {"ansible_python_interpreter": sys.executable, "eagle3_target_path": str(tmp_path / "kimi"),
             "eagle3_prompts": str(tmp_path / "prompts.jsonl"), "eagle3_run_dir": str(tmp_path / "run"),
             "eagle3_reports_dir": str(tmp_path / "reports"), "eagle3_train_ttt_steps": 5, **values}  # fmt: skip
    proc = run_playbook(tmp_path / f"{tasks}.yml", "-i", "localhost,", "--check", "-e", json.dumps(extra),
                        check=False, env=ansible_env(), timeout=180)  # fmt: skip
    report = tmp_path / "reports" / "plan" / "localhost.json"
    return proc, {"localhost": json.loads(report.read_text())} if report.exists() else {}


def test_the_trainers_plan_in_check_mode(tmp_path):
    proc, report = plan(tmp_path, "main", gpu_facts_gpus=[GPU_96GB] * 4, eagle3_data_mean_tokens=100)
    assert proc.returncode == 0, proc.stdout[-3000:]
    stages = report["localhost"]["stages"]
    assert stages["regeneration"]["prompts"] == 1000, proc.stdout
    assert stages["hidden_states"]["path"] == str(tmp_path / "run" / "data" / "hidden_states")
    assert stages["training"]["start"] == 16384 and stages["training"]["world_size"] == 4
    assert "hidden_states" in proc.stdout and "16384" in proc.stdout  # the table, printed
    assert not (tmp_path / "run").exists()  # nothing written where the stages will write


def test_a_refusal_before_anything_runs_and_the_force_to_proceed(tmp_path):
    proc, report = plan(tmp_path, "main", gpu_facts_gpus=[GPU_96GB], eagle3_data_mean_tokens=10**12)
    assert proc.returncode == 2 and "Hidden states need " in proc.stdout and report == {}
    assert "(-e eagle3_plan_force=true proceeds anyway)" in proc.stdout
    forced, report = plan(tmp_path, "main", gpu_facts_gpus=[GPU_96GB], eagle3_data_mean_tokens=10**12,
                          eagle3_plan_force=True)  # fmt: skip
    assert forced.returncode == 0 and report["localhost"]["refusals"][0].startswith("Hidden states need ")
    assert "Forced past a refusal: Hidden states need " in forced.stdout + forced.stderr


def test_a_server_too_small_for_the_target(tmp_path):
    proc, _ = plan(tmp_path, "serving", gpu_facts_gpus=[GPU_80GB] * 8, eagle3_planner_context_length=32768,
                   eagle3_planner_concurrency=8)  # fmt: skip
    assert proc.returncode == 2 and "localhost's GPUs cannot hold what it would load" in proc.stdout
    ok, report = plan(tmp_path, "serving", gpu_facts_gpus=[{**GPU_80GB, "memory_total": 144384}] * 8)
    assert ok.returncode == 0 and report["localhost"]["stages"]["serving"]["tp"] == 8, ok.stdout[-2000:]
