"""Read-only modules run on the host as one short script (plugin_utils/_probe.py): the same answer as the module, the
module itself when the script cannot run, the module's argument errors on the controller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from tests.modules import init_collection_loader, run_module
from tests.unit.plugins.modules.test_eagle3_status import fake_smi, serve_info
from tests.unit.plugins.modules.test_gpu_cleanup import alive, used, workload


def status_modules() -> list[str]:
    """The module_utils eagle3_status's action sends, in its order."""
    from ansible_collections.eagle3.ops.plugins.action.eagle3_status import ActionModule

    return list(ActionModule.MODULES)


def probe():
    from ansible_collections.eagle3.ops.plugins.plugin_utils import _probe

    return _probe


def adhoc(module: str, args: dict, *extra: str, python: str = sys.executable) -> tuple[str, dict]:
    """One ad-hoc call on localhost (local connection, pipelined): the verbose output and the result."""
    env = {"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_COLLECTIONS_PATH": str(init_collection_loader()),
           "ANSIBLE_CALLBACK_RESULT_FORMAT": "json", "ANSIBLE_NOCOLOR": "1", "PATH": "/usr/bin:/bin",
           "HOME": str(Path.home()), **{k: v for k, v in os.environ.items() if k.startswith("NVEMU_")}}  # fmt: skip
    interpreter = json.dumps({"ansible_python_interpreter": python})
    argv = [str(Path(sys.executable).parent / "ansible"), "localhost", "-c", "local", "-i", "localhost,", "-o", "-vvv",
            "-m", module, "-a", json.dumps(args), "-e", interpreter, *extra]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=ROOT, check=False)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("localhost |"))
    result = json.loads(line.split("=>", 1)[1])
    result.setdefault("failed", "FAILED" in line.split("=>", 1)[0])
    return proc.stdout, result


def test_the_script_answers_what_the_module_answers(tmp_path, capsys):
    server = serve_info({"speculative_draft_model_path": "/srv/d", "speculative_num_draft_tokens": 10})
    try:
        args = {"nvidia_smi": fake_smi(tmp_path), "server_url": f"http://127.0.0.1:{server.server_port}"}
        module = run_module("eagle3_status", args, capsys=capsys)
        params, error = probe().validated(__import__("ansible_collections.eagle3.ops.plugins.module_utils._status",
                                                     fromlist=["ARGUMENT_SPEC"]).ARGUMENT_SPEC, args)  # fmt: skip
        assert error == "" and params is not None
        program = probe().script(status_modules(), "_status", "read", params)
        # run by a bare interpreter, with nothing of ansible's importable
        out = subprocess.run([sys.executable, "-I", "-S", "-"], input=program, capture_output=True, text=True,
                             timeout=60, check=True).stdout  # fmt: skip
        answer = json.loads(out.strip().splitlines()[-1].removeprefix(probe().MARK))
        verbose, played = adhoc("eagle3.ops.eagle3_status", args)
    finally:
        server.shutdown()
    module.pop("invocation", None)
    assert answer == module and answer["serving"]["draft_tokens"] == 10 and answer["gpus_read"] is True
    assert f"{sys.executable} -I -S - && sleep 0" in verbose  # the script on the input, isolated
    assert {k: played[k] for k in module} == module


def test_the_module_runs_when_the_script_cannot(tmp_path):
    args = {"nvidia_smi": fake_smi(tmp_path)}
    missing = str(tmp_path / "no-python")
    verbose, played = adhoc("eagle3.ops.eagle3_status", args, python=missing)
    # the script found no interpreter (rc 127), so the module ran and failed as a module does there
    assert f"{missing} -I -S - && sleep 0" in verbose and f"{missing} && sleep 0" in verbose, verbose
    assert played["failed"] is True and f"The module interpreter '{missing}' was not found" in played["msg"]
    # a host whose Python is not known (discovery asked for, not run yet): python3 on its PATH
    _, found = adhoc("eagle3.ops.eagle3_status", args, python="auto_silent")
    assert found["gpus_read"] is True and found["gpus"][0]["name"] == "NVIDIA H200"


def test_bad_arguments_fail_on_the_controller_with_the_module_message(tmp_path):
    verbose, played = adhoc("eagle3.ops.eagle3_status", {"timeout": "soon"})
    assert played["failed"] is True
    assert played["msg"].startswith("eagle3_status: argument 'timeout' is of type") and "float" in played["msg"]
    assert " - && sleep 0" not in verbose  # nothing ran on the host


def test_path_options_reach_the_host_as_written_and_are_expanded_there(tmp_path):
    from ansible_collections.eagle3.ops.plugins.module_utils._status import ARGUMENT_SPEC

    params, _ = probe().validated(ARGUMENT_SPEC, {"train_state": "~/state", "python": "$HOME/py"})
    assert params is not None and params["train_state"] == "~/state" and params["python"] == "$HOME/py"
    assert probe().path_options(ARGUMENT_SPEC) == ["train_state", "python", "payload_dir"]
    # on the host, the script expands them with the host's environment (here: a variable only the host has)
    state = tmp_path / "state"
    state.mkdir()
    (state / "attempts.json").write_text(json.dumps([{"n": 3, "total_seq_len": 8192, "cause": "running"}]))
    args = {"nvidia_smi": fake_smi(tmp_path), "train_state": "$EAGLE3_HOST_STATE", "python": sys.executable,
            "payload_dir": str(ROOT / "eagle3_ops" / "payloads")}  # fmt: skip
    params, _ = probe().validated(ARGUMENT_SPEC, args)
    assert params is not None
    program = probe().script(status_modules(), "_status", "read", params, probe().path_options(ARGUMENT_SPEC))
    out = subprocess.run([sys.executable, "-I", "-S", "-"], input=program, capture_output=True, text=True, timeout=60,
                         check=True, env={"EAGLE3_HOST_STATE": str(state), "PATH": "/usr/bin:/bin"}).stdout  # fmt: skip
    answer = json.loads(out.strip().splitlines()[-1].removeprefix(probe().MARK))
    assert answer["training"]["attempt"] == 3 and answer["training"]["total_seq_len"] == 8192


def test_a_cleanup_dry_run_is_the_script_and_a_real_run_is_the_module(gpus, capsys):
    workload(gpus, "--gpus", "0", "--mib", "700", "--dataloader-workers", "1")
    args = {"nvidia_smi": gpus["smi"], "device_dir": gpus["dev"], "grace": 2, "timeout": 10}
    module = run_module("gpu_cleanup", args, check=True, capsys=capsys)
    verbose, dry = adhoc("eagle3.ops.gpu_cleanup", args, "--check")
    assert f"{sys.executable} -I -S - && sleep 0" in verbose
    assert dry["changed"] is True and dry["signalled"] == module["signalled"] and len(dry["signalled"]) == 3
    assert [h["pid"] for h in dry["holders"]] == [h["pid"] for h in module["holders"]]
    assert dry["targets"] == module["targets"] and dry["units"] == module["units"]
    assert all(alive(pid) for pid in dry["signalled"]) and used()[0] == 703  # a dry run stops nothing
    # a refusal is the module's sentence, from the script too
    guard = {**args, "require_paths": [str(Path(gpus["dev"]).parent / "missing" / "model.safetensors")]}
    _, refused = adhoc("eagle3.ops.gpu_cleanup", guard, "--check")
    assert refused["failed"] is True and refused["msg"].startswith("Refusing to stop 2 GPU holders"), refused
    verbose, real = adhoc("eagle3.ops.gpu_cleanup", args)
    assert " - && sleep 0" not in verbose and f"{sys.executable} && sleep 0" in verbose  # the module itself
    assert real["changed"] is True and not any(alive(pid) for pid in dry["signalled"])


def test_an_interpreter_with_arguments_runs_the_script(tmp_path):
    args = {"nvidia_smi": fake_smi(tmp_path)}
    verbose, played = adhoc("eagle3.ops.eagle3_status", args, python="/usr/bin/env python3")
    assert "/usr/bin/env python3 -I -S - && sleep 0" in verbose and played["gpus_read"] is True


def test_a_stage_check_is_the_script_and_a_record_is_the_module(tmp_path, capsys):
    from tests.unit.plugins.modules.test_stage_stamp import serve, stage

    server = serve({"/health": (200, {})})
    try:
        args = {**stage(tmp_path), "units": [], "urls": [f"http://127.0.0.1:{server.server_port}/health"]}
        verbose, first = adhoc("eagle3.ops.stage_stamp", {**args, "state": "check"})
        assert f"{sys.executable} -I -S - && sleep 0" in verbose and first["converged"] is False
        assert first["reason"].startswith("no stamp of a complete deploy run")
        verbose, kept = adhoc("eagle3.ops.stage_stamp", {**args, "state": "record"})
        assert " - && sleep 0" not in verbose and kept["changed"] is True  # the record writes: the module itself
        _, converged = adhoc("eagle3.ops.stage_stamp", {**args, "state": "check"})
        module = run_module("stage_stamp", {**args, "state": "check"}, capsys=capsys)
        module.pop("invocation", None)
        assert converged["converged"] is True and {k: converged[k] for k in module} == module
        # what the host reads - a path rewritten, the server gone - the script says as the module does
        (tmp_path / "draft" / "model.safetensors").write_bytes(b"x" * 65)
        _, moved = adhoc("eagle3.ops.stage_stamp", {**args, "state": "check"})
        assert moved["converged"] is False and moved["changed_keys"] == [f"stat:{tmp_path / 'draft'}"]
    finally:
        server.shutdown()
    record_again = run_module("stage_stamp", {**args, "state": "record"}, capsys=capsys)
    assert record_again["changed"] is True
    _, down = adhoc("eagle3.ops.stage_stamp", {**args, "state": "check"})
    assert down["converged"] is False and down["reason"].startswith(f"{args['urls'][0]} does not answer")


def test_a_dry_run_ships_the_checkpoint_reader_only_to_guard_paths():
    from ansible_collections.eagle3.ops.plugins.action.gpu_cleanup import ActionModule

    action = ActionModule.__new__(ActionModule)
    assert action.probe_modules({"require_paths": []}) == ("_smi", "_gpu", "_cleanup")
    guarded = action.probe_modules({"require_paths": ["/srv/run/model.safetensors"]})
    assert guarded == ("_smi", "_gpu", "_safetensors", "_cleanup")


def test_the_status_script_ships_the_nvidia_smi_reader_not_the_cleanup_logic():
    """eagle3_status runs on every container of a fleet-wide status: its script carries _smi (nvidia-smi's query),
    not _gpu (the cleanup's process scan, four times the source), and runs without it."""
    assert "_smi" in status_modules() and "_gpu" not in status_modules()
