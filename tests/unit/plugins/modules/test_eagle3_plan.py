"""eagle3_plan: one host's plan from its config.json, disks and GPUs; check mode the same; refusals in one sentence
with the way to force them; the throughput an earlier attempt logged is the measured one."""

from __future__ import annotations

import shutil
from pathlib import Path

from tests.modules import run_module

ROOT = Path(__file__).resolve().parents[4]
KIMI = ROOT / "tests/data/targets/kimi-k2.5.config.json"


def run(capsys, check=False, **args):
    return run_module("eagle3_plan", args, check=check, capsys=capsys)


def kimi_dir(tmp_path: Path) -> str:
    (tmp_path / "kimi").mkdir()
    shutil.copy(KIMI, tmp_path / "kimi" / "config.json")
    return str(tmp_path / "kimi")


def test_train_plan_in_check_mode(tmp_path, capsys):
    res = run(capsys, check=True, target_config=kimi_dir(tmp_path), prompts=100, max_tokens=100,
              hidden_path=str(tmp_path / "hs"), gpu_memory_mib=98304, gpus=4, ttt_steps=5, host="ct129")
    assert not res.get("failed") and not res["changed"], res
    stages = res["plan"]["stages"]
    assert list(stages) == ["regeneration", "hidden_states", "training", "export"]
    assert stages["regeneration"]["expected_tokens"] == 100 * (256 + 100)
    assert stages["hidden_states"]["bytes"] == 100 * 356 * (7168 * 4 * 2 + 8) + 100 * 512
    assert stages["training"]["start"] == 16384 and stages["training"]["throughput_source"] == "declared"
    assert res["table"][0].startswith("stage") and len(res["table"]) == 5
    assert not (tmp_path / "hs").exists()


def test_measured_throughput_from_the_last_attempt(tmp_path, capsys):
    state = tmp_path / "state"
    state.mkdir()
    (state / "attempt-1.log").write_text("profile/tokens_per_s=100.0\n")
    (state / "attempt-2.log").write_text("global_step=3 profile/tokens_per_s=1234.5\nno figure\n")
    res = run(capsys, target_config=kimi_dir(tmp_path), stages=["training"], samples=10, mean_tokens=100,
              gpu_memory_mib=98304, train_state=str(state))
    tr = res["plan"]["stages"]["training"]
    assert tr["throughput_source"] == "measured" and tr["tokens_per_second_per_gpu"] == 1234.5


def test_refusal_and_force(tmp_path, capsys):
    args = {"target_config": kimi_dir(tmp_path), "stages": ["serving"], "gpu_memory_mib": 81559, "gpus": 8,
            "context_length": 32768, "concurrency": 8, "host": "srv1"}
    res = run(capsys, **args)
    assert res["failed"] and res["msg"].startswith("srv1's GPUs cannot hold what it would load: ")
    assert res["msg"].endswith("(-e eagle3_plan_force=true proceeds anyway)") and res["table"]
    forced = run(capsys, force=True, **args)
    assert not forced.get("failed") and forced["plan"]["refusals"] == res["plan"]["refusals"]


def test_bad_input_is_named(tmp_path, capsys):
    res = run(capsys, target_config=str(tmp_path / "none"), stages=["serving"], gpu_memory_mib=1)
    assert res["failed"] and res["msg"].startswith("Cannot read the target's config ")
    res = run(capsys, target_config=kimi_dir(tmp_path), stages=["training"])
    assert res["failed"] and res["msg"].startswith("No GPU memory to plan against on this host: ")


def test_the_data_stages_measured_rows_replace_the_estimate(tmp_path, capsys):
    summary = tmp_path / "rows.jsonl.summary.json"
    summary.write_text('{"rows": 50, "tokens": 5000, "empty": 0}')
    args = {"target_config": kimi_dir(tmp_path), "stages": ["hidden_states"], "prompts": 100,
            "hidden_path": str(tmp_path / "hs"), "rows_summary": str(summary)}
    hs = run(capsys, **args)["plan"]["stages"]["hidden_states"]
    assert hs["bytes"] == 5000 * (7168 * 4 * 2 + 8) + 50 * 512
    assert run(capsys, **{**args, "rows_summary": str(tmp_path / "none")})["plan"]["stages"]["hidden_states"][
        "bytes"] == 100 * (256 + 2048) * (7168 * 4 * 2 + 8) + 100 * 512
