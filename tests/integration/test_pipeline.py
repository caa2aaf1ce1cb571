"""The training pipeline in the lab, for real: tiny target, regeneration, hidden states, speculators on CPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from tests.conftest import LAB_STATE, ROOT, ansible_env, flat, payload, pct, recap, run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab"), pytest.mark.pipeline]
RUN = "/srv/eagle3/runs/tiny-llama"



def ct(*argv: str, check: bool = True) -> str:
    return pct("exec", "129", "--", *argv, check=check).stdout


def read_json(path: str):
    return json.loads(ct("cat", path))


def test_the_pipeline_trains_a_drafter_that_beats_an_untrained_one(trained):
    result = json.loads((LAB_STATE / "reports" / "train-ct129.json").read_text())
    assert result == read_json(f"{RUN}/train/state/result.json")
    best = result["epochs"][str(result["best_epoch"])]
    # The untrained drafter's accuracy: speculators' first logged step, measured before any update.
    log = ct("cat", f"{RUN}/train/state/attempt-1.log")
    untrained = float(re.search(r"train/full_acc_0=([\d.e+-]+)", log).group(1))
    assert untrained < 0.05 and best["full_accuracy"][0] > max(0.3, 10 * untrained)
    assert result["tau"] == pytest.approx(1 + sum(best["full_accuracy"]))
    assert len(best["full_accuracy"]) == 3 and result["total_seq_len"] == 1024
    files = ct("ls", f"{RUN}/train/save/checkpoint_best/").split()
    assert {"model.safetensors", "config.json", "val_metrics.json"} <= set(files)
    config = read_json(f"{RUN}/train/save/checkpoint_best/config.json")
    assert (config["norm_before_fc"], config["norm_output"], config["norm_before_residual"]) == (False, False, False)
    # speculators' (vLLM's) numbering, as the data stage extracted them
    assert config["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    store = read_json(f"{RUN}/data/hidden_states/COMPLETE.json")
    assert store | {"samples": 160} == {"layers": [1, 3, 4], "numbering": "vllm", "store": "file", "extractor": "vllm",
                                        "target": "/srv/eagle3/models/tiny-llama", "samples": 160, "first": 0,
                                        "world": 1, "rank": 0}  # fmt: skip
    assert "Data generation complete!" in ct("cat", f"{RUN}/data/logs/hidden.log")
    assert "tau:" in trained.stdout and "best_epoch:" in trained.stdout
    # vLLM's own EAGLE-3 decoding measured the best epoch (vllm_judge): its accept length is one plus the acceptance
    # rate of each draft position, and well above one (an untrained draft accepts about nothing).
    judged = re.search(r"vLLM \d[\d.]* measured accept length ([\d.]+) for \S+/checkpoint_best at 3 draft tokens "
                       r"\(\d+ prompts, per position \[([\d., ]+)\]\), trainer estimate tau [\d.]+",
                       flat(trained.stdout))  # fmt: skip
    assert judged, flat(trained.stdout)[-3000:]
    accept, rates = float(judged.group(1)), [float(x) for x in judged.group(2).split(",")]
    assert accept > 1.5 and len(rates) == 3 and accept == pytest.approx(1 + sum(rates), abs=1e-3), judged.group(0)
    # The check follows the lab's SGLang (0.5.23): speculators' names stay.
    assert re.search(r"Export check of \S+checkpoint_best: 0 keys would be renamed for SGLang 0\.5\.23 and newer; "
                     r"nothing incompatible with SGLang", flat(trained.stdout))


COMPARE = """
import json, sys, torch
from safetensors.torch import load_file
a_dir, b_dir, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
same = other = 0.0
for i in range(n):
    a = load_file(f"{a_dir}/hs_{i}.safetensors"); b = load_file(f"{b_dir}/hs_{i}.safetensors")
    assert torch.equal(a["token_ids"], b["token_ids"]) and a["hidden_states"].shape == b["hidden_states"].shape
    x, y = a["hidden_states"].float(), b["hidden_states"].float()
    scale = y.abs().amax(dim=(0, 2))  # per slot
    same = max(same, ((x - y).abs().amax(dim=(0, 2)) / scale).max().item())
    # the neighbouring slot (another layer) is far off: the comparison can tell layers apart
    other = max(other, ((x[:, 1:] - y[:, :-1]).abs().amax(dim=(0, 2)) / scale[:-1]).min().item())
print(json.dumps({"rows": n, "max_rel_diff": same, "neighbour_min_rel_diff": other}))
"""


def test_vllm_and_the_transformers_extractor_write_the_same_layers(trained):
    # The transformers path (for targets vLLM cannot serve) on the same rows, into a scratch store.
    out = "/srv/eagle3/runs/tiny-llama/data/hidden_states-transformers"
    payload(129, "-m", "training.hidden_states", "--target", "/srv/eagle3/models/tiny-llama", "--data",
            f"{RUN}/data/dataset", "--out", out, "--dtype", "float32", "--max-samples", "48", "--layers", "1", "3", "4",
            timeout=600)  # fmt: skip
    try:
        got = json.loads(payload(129, "-c", COMPARE, f"{RUN}/data/hidden_states", out, "48", timeout=300))
    finally:
        pct("exec", "129", "--", "rm", "-rf", out)
    # same ids -> same layers: equal within the precision of vLLM's CPU kernels; a layer apart, clearly not
    assert got["max_rel_diff"] < 1e-2 and got["neighbour_min_rel_diff"] > 0.1, got


def test_a_finished_run_on_other_layers_is_refused_not_reused(trained):
    proc = run_playbook(ROOT / "train.yml", "--tags", "train", "-e", '{"eagle3_train_target_layer_ids": [1, 2, 3]}',
                        check=False, timeout=600)  # fmt: skip
    assert recap(proc.stdout)["ct129"]["failed"] == 1
    assert (f"{RUN}/train holds a run (finished, or interrupted and resumable) trained on the hidden states of layers "
            "[1, 3, 4], but the data now holds layers [1, 2, 3]") in flat(proc.stdout)


def test_a_second_run_skips_every_stage(trained):
    # Forced past the fingerprint: every stage looks at its outputs and skips itself.
    again = run_playbook(ROOT / "train.yml", "-e", "eagle3_force=true", timeout=900)
    assert recap(again.stdout)["ct129"] == {**recap(again.stdout)["ct129"], "changed": 0, "failed": 0}
    assert "train on ct129: runs (eagle3_force is set)" in flat(again.stdout)
    # Then the fingerprint alone: one module call, and the play that trains has no host - also with the settings
    # only serving reads (the served setting, the router's port), as when one -e goes to both playbooks.
    converged = run_playbook(ROOT / "train.yml", "-e", "draft_tokens=10", "-e", "eagle3_router_port=30099",
                             timeout=300)  # fmt: skip
    out = flat(converged.stdout)
    assert "train on ct129: nothing to do (as its last complete run left it" in out, out[-3000:]
    assert "PLAY [Train an EAGLE-3 drafter] * skipping: no hosts matched" in re.sub(r"\*+", "*", out)
    assert recap(converged.stdout)["ct129"] == {**recap(converged.stdout)["ct129"], "changed": 0, "failed": 0}
    assert "Read the GPUs" not in converged.stdout and "Install" not in converged.stdout
    # A variable no role declares as an input (here one nothing reads) changes nothing: the stage stays converged.
    unread = run_playbook(ROOT / "train.yml", "-e", "eagle3_note=another", timeout=300)
    assert "train on ct129: nothing to do (as its last" in flat(unread.stdout), unread.stdout[-3000:]
    # A setting the training reads and the runtimes do not: the stages run, the runtimes' own fingerprint (kept by the
    # forced run above) matches, so neither environment is checked, rebuilt or imported again.
    other = run_playbook(ROOT / "train.yml", "-e", "eagle3_train_poll=4", timeout=600)
    out = flat(other.stdout)
    assert "train on ct129: runs (" in out and "train_runtime on ct129: nothing to do" in out, out[-3000:]
    assert "Import the runtime and report versions" not in out and "Install torch" not in out
    assert "Ask the environment for its vLLM release" in out  # the release the data stage follows, still read
    assert recap(other.stdout)["ct129"] == {**recap(other.stdout)["ct129"], "changed": 0, "failed": 0}


def test_the_data_stage_resumes_without_duplicates(trained):
    path = f"{RUN}/data/responses.jsonl"
    full = ct("cat", path).splitlines(keepends=True)
    kept = "".join(full[:100])
    # An interrupted run: 100 complete lines and a torn one.
    pct("exec", "129", "--", "sh", "-c", 'head -n 100 "$1" > "$1.cut" && printf %s "{\\"id\\": \\"p01" >> "$1.cut" '
        '&& mv "$1.cut" "$1"', "sh", path)  # fmt: skip
    # regeneration only: rebuilding the rows would make the next stages redo their work for no new coverage
    proc = run_playbook(ROOT / "train.yml", "--tags", "eagle3_data_preflight,eagle3_data_regen", timeout=900)
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-2000:]
    now = ct("cat", path)
    ids = [json.loads(line)["id"] for line in now.splitlines()]
    assert len(ids) == 160 and len(set(ids)) == 160 and now.startswith(kept)
    assert "60 to go" in ct("cat", f"{RUN}/data/logs/regen.log")


def test_the_disk_preflight_refuses_with_the_numbers(trained):
    before = ct("sha256sum", f"{RUN}/data/responses.jsonl")
    proc = run_playbook(ROOT / "train.yml", "--tags", "data", "-e", '{"eagle3_data_mean_tokens": 100000000000}',
                        "-e", "eagle3_data_dir=/srv/eagle3/runs/disk-test/data", check=False, timeout=600)  # fmt: skip
    assert recap(proc.stdout)["ct129"]["failed"] == 1
    assert re.search(r"Hidden states need [\d.]+ TB \(\+5% margin\) at /srv/eagle3/runs/disk-test/data/hidden_states "
                     r"but [\d.]+ [GT]B are free", flat(proc.stdout))  # fmt: skip
    assert ct("sha256sum", f"{RUN}/data/responses.jsonl") == before
    pct("exec", "129", "--", "rm", "-rf", "/srv/eagle3/runs/disk-test")


def _train(name: str, *extra: str, timeout: int = 900):
    return run_playbook(ROOT / "train.yml", "--tags", "train", "-e", f"eagle3_train_dir=/srv/eagle3/runs/{name}",
                        "-e", f"eagle3_train_unit=eagle3-train-{name}", *extra, timeout=timeout)  # fmt: skip


@pytest.fixture
def scratch():
    names: list[str] = []
    yield names.append
    for name in names:
        pct("exec", "129", "--", "systemctl", "disable", "--now", f"eagle3-train-{name}", check=False)
        pct("exec", "129", "--", "rm", "-rf", f"/srv/eagle3/runs/{name}",
            f"/etc/systemd/system/eagle3-train-{name}.service", check=False)  # fmt: skip


def test_an_injected_out_of_memory_backs_off_the_real_trainer(trained, scratch):
    # Through the eagle3-ops command, which shows the epochs of the surviving attempt as a progress line.
    scratch("oom-test")
    proc = subprocess.run(
        [sys.executable, "-m", "eagle3_ops.cli", "train", "--tags", "train", "-e", "eagle3_train_epochs=2",
         "-e", "eagle3_train_dir=/srv/eagle3/runs/oom-test", "-e", "eagle3_train_unit=eagle3-train-oom-test",
         "-e", '{"eagle3_train_environment": {"EAGLE3_LAB_OOM_ABOVE": "512"}}'],
        cwd=ROOT, env=ansible_env(EAGLE3_OPS_RUNS=str(ROOT / "artifacts" / "test")), capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert re.search(r"\[[#.]+\] +\d+% epoch [12]/2 .*total_seq_len 512", proc.stdout), proc.stdout[-3000:]
    attempts = read_json("/srv/eagle3/runs/oom-test/state/attempts.json")
    assert [(a["total_seq_len"], a["cause"]) for a in attempts] == [(1024, "out_of_memory"), (512, "completed")]
    assert "CUDA out of memory" in ct("cat", "/srv/eagle3/runs/oom-test/state/attempt-1.log")


def test_a_killed_real_trainer_resumes_from_the_last_complete_epoch(trained, scratch):
    scratch("resume-test")
    save = "/srv/eagle3/runs/resume-test/save"
    start = _train("resume-test", "-e", "eagle3_train_epochs=4", "-e", "eagle3_train_wait=false")
    assert recap(start.stdout)["ct129"]["failed"] == 0
    deadline = time.monotonic() + 300
    while pct("exec", "129", "--", "test", "-f", f"{save}/1/training_state.json", check=False).returncode:
        assert time.monotonic() < deadline, "epoch 1 never completed"
        time.sleep(2)
    pct("exec", "129", "--", "systemctl", "kill", "-s", "KILL", "eagle3-train-resume-test")
    done = _train("resume-test", "-e", "eagle3_train_epochs=4")
    assert recap(done.stdout)["ct129"]["failed"] == 0, done.stdout[-2000:]
    attempts = read_json("/srv/eagle3/runs/resume-test/state/attempts.json")
    assert attempts[0]["cause"] == "interrupted" and attempts[-1]["cause"] == "completed"
    assert attempts[-1]["resume_from_epoch"] is not None and attempts[-1]["resume_from_epoch"] >= 1
    log = ct("cat", f"/srv/eagle3/runs/resume-test/state/attempt-{attempts[-1]['n']}.log")
    assert "Training epoch 1/4 started" not in log and "Training epoch 4/4 started" in log
    result = read_json("/srv/eagle3/runs/resume-test/state/result.json")
    # Every epoch has a checkpoint; metrics exist for the epochs speculators scored (it writes them only for
    # an epoch that lowered the validation loss, and never for one killed between checkpoint and validation).
    assert result["checkpoints"] == [0, 1, 2, 3]
    assert sorted(int(e) for e in result["epochs"]) == sorted(set(result["checkpoints"]) - set(result["unscored"]))
    assert "0" in result["epochs"] and result["best_epoch"] is not None


def test_online_training_asks_vllm_and_keeps_no_store(trained, scratch):
    scratch("online")
    served_before = ct("grep", "-c", "POST /v1/completions", f"{RUN}/data/logs/vllm-server.log").strip()
    proc = run_playbook(ROOT / "train.yml", "--tags", "data,train", "-e", "eagle3_hidden_states=online",
                        "-e", "eagle3_train_dir=/srv/eagle3/runs/online", "-e", "eagle3_train_unit=eagle3-train-online",
                        "-e", "eagle3_train_epochs=1", timeout=900)  # fmt: skip
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-3000:]
    result = read_json("/srv/eagle3/runs/online/state/result.json")
    assert result["checkpoints"] == [0] and result["tau"] > 1
    # every training and validation row came from the server (the trainer deleted what it wrote), none is kept
    served = int(ct("grep", "-c", "POST /v1/completions", f"{RUN}/data/logs/vllm-server.log")) - int(served_before)
    assert served >= 160, served
    assert ct("ls", "-A", "/srv/eagle3/runs/online/online-cache", f"{RUN}/data/hidden_states.incoming").split() == [
        "/srv/eagle3/runs/online/online-cache:", f"{RUN}/data/hidden_states.incoming:"]
    # the server went with the run
    assert ct("systemctl", "is-active", "eagle3-data-vllm", check=False).strip() in ("inactive", "failed", "unknown")


def test_the_plan_agrees_with_what_the_stages_wrote(trained, tmp_path):
    """plan.yml after the pipeline: the hidden-state bytes it states (from the data stage's measured rows) within 10 %
    of the files on disk, and the budget the job started at."""
    proc = run_playbook(ROOT / "plan.yml", "-e", f"eagle3_reports_dir={tmp_path}", timeout=600)
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-3000:]
    plan = json.loads((tmp_path / "plan" / "ct129.json").read_text())
    sizes = ct("find", f"{RUN}/data/hidden_states", "-name", "hs_*.safetensors", "-printf", "%s\n").split()
    written = sum(int(size) for size in sizes)
    stated = plan["stages"]["hidden_states"]["bytes"]
    assert abs(stated / written - 1) < 0.10, (stated, written)
    attempts = read_json(f"{RUN}/train/state/attempts.json")
    assert plan["stages"]["training"]["start"] == attempts[0]["total_seq_len"]
    logged = "tokens_per_s=" in ct("cat", f"{RUN}/train/state/attempt-{attempts[-1]['n']}.log")
    assert plan["stages"]["training"]["throughput_source"] == ("measured" if logged else "declared")
    assert any(line.startswith("hidden_states") for line in plan["table"])


def test_a_run_copied_to_another_path_resumes_from_its_newest_complete_epoch(trained, scratch):
    """The seeds' VM crash and disk migration: the run directory copied to another path, the job cut after its
    seventh epoch; pointed at the new path, the job resumes there from epoch 6 and leaves the old copy alone."""
    scratch("migrated")
    new = "/srv/eagle3/runs/migrated"
    before = ct("sha256sum", f"{RUN}/train/state/result.json")
    ct("cp", "-a", RUN, new)
    # the crash: no result, epochs 7.. gone, the best-epoch link dangling
    ct("sh", "-c", 'cd "$1/train" && rm -f state/result.json save/checkpoint_best && for d in save/*/; do '
       'e=$(basename "$d"); [ "$e" -ge 7 ] 2>/dev/null && rm -rf "$d"; done; true', "sh", new)  # fmt: skip
    proc = run_playbook(ROOT / "train.yml", "--tags", "train", "-e", f"eagle3_run_dir={new}",
                        "-e", "eagle3_train_unit=eagle3-train-migrated", timeout=900)  # fmt: skip
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-3000:]
    attempts = read_json(f"{new}/train/state/attempts.json")
    assert attempts[-1]["cause"] == "completed" and attempts[-1]["resume_from_epoch"] == 6, attempts[-1]
    log = ct("cat", f"{new}/train/state/attempt-{attempts[-1]['n']}.log")
    assert "Training epoch 7/15 started" not in log and "Training epoch 15/15 started" in log
    result = read_json(f"{new}/train/state/result.json")
    assert result["checkpoints"] == list(range(15)) and result["best_epoch"] is not None
    assert ct("sha256sum", f"{RUN}/train/state/result.json") == before  # the old copy untouched
