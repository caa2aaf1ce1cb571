"""deploy.yml, sglang_serve (validation, unit, idempotence, accept-length gate, rollback), the reference
engine's losslessness and bench.yml, in the lab (after test_pipeline trained the drafter)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SERVER_PYTHON, ansible_env, flat, payload, pct, recap, run_playbook, serving_keys

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab"), pytest.mark.pipeline]
UNIT = "/etc/systemd/system/sglang.service"
DRAFT = "/srv/eagle3/drafts/tiny-llama-eagle3"  # the draft root: an immutable version per export under it
CHECKPOINT = "/srv/eagle3/runs/tiny-llama/train/save/checkpoint_best"
SERVE = Path(__file__).parent / "playbooks" / "serve.yml"
REFERENCE_ENV = ("EAGLE3_REFERENCE_SGLANG_VERSION=0.5.23",)  # the reference engine plays that release's loader



def ct(*argv: str, check: bool = True) -> str:
    return pct("exec", "130", "--", *argv, check=check).stdout


def served_draft() -> str:
    """The draft version the server serves (the root's versions.json, which deploy.yml writes after the gates)."""
    return f"{DRAFT}/{json.loads(ct('cat', f'{DRAFT}/versions.json'))['servers']['ct130']}"


def server_info() -> dict:
    """The server's info, asked with the serving plane's API key (the key on the command line of a lab container)."""
    code = ("import urllib.request,sys;req=urllib.request.Request('http://127.0.0.1:30000/get_server_info',"
            "headers={'Authorization':'Bearer '+sys.argv[1]});"
            "sys.stdout.write(urllib.request.urlopen(req).read().decode())")
    return json.loads(ct("python3", "-c", code, serving_keys()["api"]))


@pytest.fixture(scope="module")
def deployed(trained):  # the session's training (conftest), whichever module asks first
    # Forced past the fingerprint: the tests read what every step of a deploy says.
    proc = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=16", "-e", "eagle3_force=true", timeout=900)
    assert recap(proc.stdout)["ct130"]["failed"] == 0
    return proc


def test_deploy_serves_the_draft_at_16_tokens(deployed):
    unit = ct("cat", UNIT)
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    served = served_draft()
    config = json.loads(ct("cat", f"{served}/config.json"))
    assert exec_start.split()[1:] == [
        "-m", "serving.server", "--model-path", "/srv/eagle3/models/tiny-llama", "--host", "127.0.0.1", "--port",
        "30000", "--tp-size", "1", "--mem-fraction-static", "0.85", "--device", "cpu", "--enable-metrics",
        "--speculative-draft-model-path", served, "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "15",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "16",
        "--api-key", "${EAGLE3_API_KEY}", "--admin-api-key", "${EAGLE3_ADMIN_API_KEY}",  # from the 0600 file below
    ]  # fmt: skip
    keys = serving_keys()
    assert "EnvironmentFile=/etc/eagle3-ops/sglang.env" in unit and keys["api"] not in unit
    assert ct("stat", "-c", "%a %U", "/etc/eagle3-ops/sglang.env").split() == ["600", "root"]
    # SGLang's check: without the key (or with the admin key) the API answers 401; /health stays open for probes
    ask = ("import urllib.request,urllib.error,sys\n"
           "for key in sys.argv[1:] + ['']:\n"
           "    auth = {'Authorization': 'Bearer ' + key} if key else {}\n"
           "    req = urllib.request.Request('http://127.0.0.1:30000/v1/models', headers=auth)\n"
           "    try: print(urllib.request.urlopen(req).status)\n"
           "    except urllib.error.HTTPError as exc: print(exc.code)\n"
           "print(urllib.request.urlopen('http://127.0.0.1:30000/health').status)")
    assert ct("python3", "-c", ask, keys["api"], keys["admin"]).split() == ["200", "401", "401", "200"]
    assert not any(k in deployed.stdout for k in keys.values())  # never printed
    # The container's SGLang (0.5.23) decided the export: speculators' names kept (nothing renamed), and the
    # reference engine plays that release's loader.
    assert "Environment=\"EAGLE3_REFERENCE_SGLANG_VERSION=0.5.23\"" in unit
    assert re.search(r"0 keys were renamed for SGLang 0\.5\.23 and newer", flat(deployed.stdout))
    info = server_info()
    assert info["speculative_algorithm"] == "EAGLE3" and info["speculative_num_draft_tokens"] == 16
    accept = info["internal_states"][0]["avg_spec_accept_length"]
    assert accept > 1.5 and info["internal_states"][0]["draft_dropped_keys"] == 0
    assert re.search(r"at 16 draft tokens \(chain\), accept length [\d.]+", flat(deployed.stdout))
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 2, 3]  # SGLang's numbering
    # An immutable version named by its content (16 hex digits), recorded as current
    record = json.loads(ct("cat", f"{DRAFT}/versions.json"))
    assert re.fullmatch(r"[0-9a-f]{16}", record["current"]) and served == f"{DRAFT}/{record['current']}"


def test_the_labs_environments_link_one_unpacked_torch(deployed):
    # inventory/lab: every container's environments link their files from one uv cache on the build cache mount, so
    # torch unpacks once per machine - not once per container, as with a cache of each container's own.
    probe = "import os, sys; print(os.path.realpath(sys.argv[1]))"
    where = {}
    venvs = (("129", "/opt/eagle3-ops/venv"), ("129", "/opt/eagle3-ops/vllm"), ("130", "/opt/eagle3-ops/sglang"))
    for vmid, venv in venvs:
        init = f"{venv}/lib/python3.11/site-packages/torch/__init__.py"
        where[f"{vmid}:{venv}"] = pct("exec", vmid, "--", "python3", "-c", probe, init).stdout.strip()
    assert len(set(where.values())) == 1 and next(iter(where.values())).startswith("/srv/lab-cache/uv/"), where


def test_vllm_keeps_what_it_inspected_in_the_labs_shared_cache(deployed):
    # vLLM inspects each model class in a subprocess unless VLLM_CACHE_ROOT's modelinfos has it (registry.py): the
    # extraction server's two classes are kept on the build cache mount, for every container's first start, and
    # nothing is in the trainer's own default cache.
    kept = pct("exec", "129", "--", "ls", "/srv/lab-cache/vllm/modelinfos").stdout.split()
    assert {"vllm-model_executor-models-llama-LlamaForCausalLM.json",
            "vllm-model_executor-models-extract_hidden_states-ExtractHiddenStatesModel.json"} <= set(kept), kept
    own = pct("exec", "129", "--", "ls", "/root/.cache/vllm/modelinfos", check=False)
    assert own.returncode != 0 or not own.stdout.split(), own.stdout


def test_the_status_table_shows_what_is_served(deployed):
    proc = subprocess.run([sys.executable, "-m", "eagle3_ops.cli", "status", "-l", "ct130"], cwd=ROOT,
                          env=ansible_env(EAGLE3_OPS_RUNS=str(ROOT / "artifacts" / "test")), capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout
    row = next(line for line in proc.stdout.splitlines() if line.startswith("ct130"))
    # the average since the start, the live figure over SGLang's last log interval (when one completed) and the
    # gate's at deploy
    cell = r"tiny-llama-eagle3@[0-9a-f]{8} x16 accept \d\.\d\d( live \d\.\d\d)? gate \d\.\d\d( \d+ tok/s)?$"
    assert re.search(cell, row.rstrip()), row


def test_an_identical_redeploy_changes_nothing(deployed):
    # Forced past the fingerprint: every step finds its work done.
    again = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=16", "-e", "eagle3_force=true", timeout=600)
    assert recap(again.stdout)["ct130"]["changed"] == 0
    # Then the fingerprint alone: one module call; the plays that prepare and switch the server have no host - also
    # with settings only training reads, as when one -e goes to both playbooks.
    converged = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=16", "-e", "eagle3_train_epochs=7",
                             "-e", "eagle3_data_max_tokens=50", "-e", "eagle3_hidden_states=online", timeout=300)
    out = re.sub(r"\*+", "*", flat(converged.stdout))
    assert "deploy on ct130: nothing to do (as its last complete run left it" in out, out[-3000:]
    assert "PLAY [Switch the servers one batch at a time] * skipping: no hosts matched" in out
    assert recap(converged.stdout)["ct130"] == {**recap(converged.stdout)["ct130"], "changed": 0, "failed": 0}
    assert "Read the GPUs" not in converged.stdout
    # Liveness is part of it: with the server stopped the same setting runs the stage again, says why, and the
    # server is back (healthy, gated) afterwards.
    ct("systemctl", "stop", "sglang")
    proc = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=16", timeout=600)
    assert "deploy on ct130: runs (sglang is inactive)" in flat(proc.stdout)
    assert server_info()["speculative_num_draft_tokens"] == 16


def test_a_setting_switch_goes_from_the_gpus_to_the_judge_and_the_service(deployed):
    # Only draft_tokens differs from the last complete deploy: the runtimes, the export and the payload are as that
    # deploy left them (its fingerprint covers their files), so none of their steps runs.
    proc = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=10", "-v", timeout=600)
    out = flat(proc.stdout)
    assert "deploy on ct130: runs (changed: draft_tokens" in out, out[-3000:]
    assert "a setting switch: the runtimes, the export and the payload stay as that run left them" in out
    starred = re.sub(r"\*+", "*", out)
    for step in ("Read the installed payload's stamp", "Compare the fingerprint with the last complete run's: runtime"):
        assert f"{step}] *" not in starred or f"{step}] * skipping" in starred, step
    # The draft's version is found by its content (the unit names it): nothing is written.
    draft = served_draft()
    assert re.search(rf"Exported {CHECKPOINT} to {draft} \(up to date, verified\)", out), out[-3000:]
    # The GPUs, the release and the configs came with the fingerprint check's call: none of their own reads ran.
    for step in ("Query nvidia-smi", "Ask the environment for its SGLang release",
                 "Read the draft's config"):
        assert f"{step}] * skipping" in starred, (step, starred[-3000:])
    assert server_info()["speculative_num_draft_tokens"] == 10
    # The report names the engine's own part of the switch (benchmarks/bench_rerun.py reads it): the restart to the
    # first healthy answer, as the service's call measured it on the server.
    healthy = re.search(r"at 10 draft tokens \(chain\), accept length [\d.]+; restarted and healthy in ([\d.]+) s", out)
    assert healthy and 0 < float(healthy.group(1)) < 600, out[-3000:]
    # Without a router the service's own call kept the fingerprint: the same setting again finds nothing to do.
    assert "Keep the fingerprint of this complete run: deploy" not in out
    again = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=10", timeout=300)
    assert "deploy on ct130: nothing to do" in flat(again.stdout), again.stdout[-3000:]
    # An input that is not a setting (the checkpoint the draft is exported from) sends the run down the whole path.
    ct("touch", f"{CHECKPOINT}/config.json")
    proc = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=16", timeout=600)
    out = flat(proc.stdout)
    assert "a setting switch" not in out and f"stat:{CHECKPOINT}" in out, out[-3000:]
    assert "Export the speculators checkpoint for SGLang and verify the draft" in out
    assert server_info()["speculative_num_draft_tokens"] == 16


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "draft_tokens is 0"), ("-3", "draft_tokens is -3"), ("1.5", "must be an integer, got '1.5'"),
     ("abc", "must be an integer, got 'abc'"), ("500", "draft_tokens is 500; it must be between 2 and 64")],
)  # fmt: skip
def test_bad_draft_tokens_are_refused_before_anything_changes(deployed, value, message):
    before = ct("sha256sum", UNIT)
    proc = run_playbook(ROOT / "deploy.yml", "-e", f"draft_tokens={value}", check=False, timeout=300)
    assert recap(proc.stdout)["ct130"]["failed"] == 1 and message in flat(proc.stdout)
    assert recap(proc.stdout)["ct130"]["changed"] == 0 and ct("sha256sum", UNIT) == before


def test_tree_drafting_is_refused_by_the_reference_engine_up_front(deployed):
    before = ct("sha256sum", UNIT)
    proc = run_playbook(ROOT / "deploy.yml", "-e", "draft_tokens=8", "-e", "speculative_topk=4",
                        "-e", "speculative_steps=3", check=False, timeout=300)  # fmt: skip
    assert recap(proc.stdout)["ct130"]["failed"] == 1
    assert "tree drafting, which the lab's reference engine does not implement" in flat(proc.stdout)
    # Only the fingerprint and validation ran: nothing of the GPUs, the runtime, the export or the server.
    assert ct("sha256sum", UNIT) == before
    assert "Read the GPUs" not in proc.stdout and "Query nvidia-smi" not in proc.stdout
    assert "fingerprint with the last complete run's: runtime" not in proc.stdout


def test_an_unrenamed_draft_is_caught_by_the_gate_and_rolled_back(deployed):
    broken = "/srv/eagle3/drafts/broken-layers0"
    # SGLang's layout and config, but the weights still say layers.0.*, served by an SGLang before 0.5.23 (the
    # seeds' line): it drops them silently. serve.yml runs sglang_serve alone, without SGLang's own checks.
    pct("exec", "130", "--", "sh", "-c", 'rm -rf "$1" && mkdir -p "$1" && cp "$2/config.json" "$1/" && '
        'cp "$3/model.safetensors" "$1/"', "sh", broken, served_draft(), CHECKPOINT)  # fmt: skip
    before = ct("cat", UNIT)
    accept_before = server_info()["internal_states"][0]["avg_spec_accept_length"]
    proc = run_playbook(SERVE, "-e", f"serve_draft={broken}", "-e", "sglang_serve_sglang_version=0.5.8",
                        check=False, timeout=600)  # fmt: skip
    assert recap(proc.stdout)["ct130"]["failed"] == 1
    out = flat(proc.stdout)
    assert re.search(r"accepts 1\.0\d* tokens per step", out) and "layers.0.*" in out
    assert f"Rolled back to the previous unit (previous service restored, healthy, draft {served_draft()})" in out
    assert ct("cat", UNIT) == before
    info = server_info()
    assert info["speculative_draft_model_path"] == served_draft() and info["internal_states"][0]["requests"] == 0
    assert accept_before > 1.5
    pct("exec", "130", "--", "rm", "-rf", broken)


def test_sglang_refuses_a_command_line_it_would_rewrite(deployed):
    before = ct("sha256sum", UNIT)
    # A stray flag after the derived ones: SGLang's argparse keeps the last value and its resolution then
    # rewrites it (topk 1, 15 steps) to 16 - silently, in a log. Its own ServerArgs says so here, up front.
    proc = run_playbook(SERVE, "-e", f"serve_draft={served_draft()}", "-e", "sglang_serve_sglang_version=0.5.23",
                        "-e", "sglang_serve_check_python=/opt/eagle3-ops/sglang/bin/python",
                        "-e", '{"sglang_serve_extra_args": ["--speculative-num-draft-tokens", "32"]}', check=False,
                        timeout=600)  # fmt: skip
    out = flat(proc.stdout)
    assert recap(proc.stdout)["ct130"]["failed"] == 1
    assert "SGLang 0.5.23 on ct130 would run this command line differently: speculative-num-draft-tokens 32 would " \
        "run as 16" in out  # fmt: skip
    assert ct("sha256sum", UNIT) == before


def test_sglang_refuses_a_draft_its_loader_would_load_incompletely(deployed):
    broken = "/srv/eagle3/drafts/broken-config"
    # The exported draft with a config.json whose draft vocabulary disagrees with its lm_head: SGLang's loader
    # refuses the tensor (and would leave the head unloaded).
    pct("exec", "130", "--", "sh", "-c", 'rm -rf "$1" && cp -r "$2" "$1"', "sh", broken, served_draft())
    pct("exec", "130", "--", "python3", "-c", "import json, sys; p = sys.argv[1] + '/config.json'; "
        "c = json.load(open(p)); c['draft_vocab_size'] //= 2; json.dump(c, open(p, 'w'))", broken)  # fmt: skip
    before = ct("sha256sum", UNIT)
    proc = run_playbook(SERVE, "-e", f"serve_draft={broken}", "-e", "sglang_serve_sglang_version=0.5.23",
                        "-e", "sglang_serve_check_python=/opt/eagle3-ops/sglang/bin/python",
                        "-e", "sglang_serve_check_draft_load=true", check=False, timeout=600)  # fmt: skip
    out = flat(proc.stdout)
    assert recap(proc.stdout)["ct130"]["failed"] == 1
    assert f"SGLang 0.5.23 on ct130 loads {broken} incompletely: SGLang refused lm_head.weight [256, 64]" in out
    assert ct("sha256sum", UNIT) == before
    pct("exec", "130", "--", "rm", "-rf", broken)


def test_the_reference_engine_is_lossless(deployed):
    pct("push", "130", str(ROOT / "tests" / "data" / "lossless_check.py"), "/opt/eagle3-ops/lossless_check.py")
    out = payload(130, "/opt/eagle3-ops/lossless_check.py", "/srv/eagle3/models/tiny-llama", served_draft(),
                  "/srv/eagle3/prompts/lab-prompts.jsonl", "5", "64", env=REFERENCE_ENV,
                  python=SERVER_PYTHON)  # fmt: skip
    report = json.loads(out.strip().splitlines()[-1])
    assert report["prompts"] == 160 and report["mismatches"] == []
    assert report["identical"] + len(report["ties"]) == 160 and report["accept_length"] > 1.5


def test_the_served_draft_sees_the_layers_it_was_trained_on(deployed):
    # Trained on vLLM's ids [1, 3, 4] (inputs of layers 1, 3, 4), exported as SGLang's [0, 2, 3]; the reference
    # engine captures as SGLang does. Written unchanged, the ids would make SGLang capture one layer deeper.
    pct("push", "130", str(ROOT / "tests" / "data" / "aux_ids_check.py"), "/opt/eagle3-ops/aux_ids_check.py")
    out = payload(130, "/opt/eagle3-ops/aux_ids_check.py", "/srv/eagle3/models/tiny-llama", served_draft(),
                  "/srv/eagle3/runs/tiny-llama/data/dataset", "/srv/eagle3/runs/tiny-llama/data/hidden_states",
                  "/srv/eagle3/prompts/lab-prompts.jsonl", "8", "20", env=REFERENCE_ENV,
                  python=SERVER_PYTHON)  # fmt: skip
    report = json.loads(out.strip().splitlines()[-1])
    assert report["trained_ids"] == [1, 3, 4] and report["sglang_ids"] == [0, 2, 3]
    assert report["feature_max_rel_diff"] < 1e-2 < 0.1 < report["off_by_one_feature_max_rel_diff"], report
    assert report["accept_length"] > report["off_by_one_accept_length"] + 0.3, report


def test_bench_sweeps_and_writes_the_report(deployed):
    # Two draft settings of the default three: the sweep, its order (largest last) and the report are the same for any
    # number of them (given largest first, they still run largest last), and each setting is a restart and a
    # measurement (about 80 s here). Six prompts per point (the lab's twelve in a user's run): the points, their
    # engines and the report are the same for any number.
    proc = run_playbook(ROOT / "bench.yml", "-e", '{"bench_draft_tokens": [16, 5]}', "-e", "spec_bench_num_prompts=6",
                        timeout=1800)  # fmt: skip
    assert recap(proc.stdout)["ct130"]["failed"] == 0
    report_dir = Path(re.search(r"Report: (\S+)", proc.stdout).group(1).rstrip("'\","))
    data = json.loads((report_dir / "bench.json").read_text())
    labels = {(p["label"], p["max_concurrency"]) for p in data["points"]}
    assert labels == {(label, c) for label in ("baseline", "5", "16") for c in (1, 4)}
    for p in data["points"]:
        assert p["completed"] == 6 and p["output_throughput"] > 0
        if p["draft_tokens"]:
            assert p["accept_length"] > 1.5 and p["speedup"] is not None
    # Which engine produced each row: SGLang itself for the baseline (it runs on this CPU), the reference
    # engine where EAGLE-3 decoding needs what this CPU lacks.
    # (speedups compare each point with the baseline of its own engine).
    assert {p["engine"] for p in data["points"] if p["label"] == "baseline"} == {"sglang", "reference"}
    assert {p["engine"] for p in data["points"] if p["label"] != "baseline"} == {"reference"}
    assert "| 16 | reference | 1 |" in (report_dir / "bench.md").read_text()
    assert "| baseline | sglang | 1 |" in (report_dir / "bench.md").read_text()
    assert len(data["points"]) == 2 * 4
    assert (report_dir / "bench.png").read_bytes()[:4] == b"\x89PNG"
    # the sweep ends where deploy.yml's default leaves the service
    assert server_info()["speculative_num_draft_tokens"] == 16
