"""stage_stamp: a stage is converged only when its stamp matches what it reads and writes and what it started
runs; a record is atomic; check mode writes nothing; a change names itself."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from tests.modules import run_module

CONTROLLER = {"var:draft_tokens": "d16", "collection": "c1"}


def serve(routes: dict[str, tuple[int, dict]]) -> HTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = routes.get(self.path, (404, {}))
            self.send_response(code)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def log_message(self, *_args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stage(tmp_path: Path) -> dict:
    draft = tmp_path / "draft"
    draft.mkdir(exist_ok=True)
    (draft / "model.safetensors").write_bytes(b"w" * 64)
    (draft / "config.json").write_text("{}")
    unit = tmp_path / "sglang.service"
    unit.write_text("[Service]\nExecStart=/bin/true --speculative-num-draft-tokens 16\n")
    return {"stage": "deploy", "dir": str(tmp_path / "stamps"), "controller": dict(CONTROLLER),
            "paths": [str(draft), str(tmp_path / "absent")], "contents": [str(unit)]}


def check(args: dict, capsys, **extra) -> dict:
    return run_module("stage_stamp", {**args, **extra, "state": "check"}, capsys=capsys)


def record(args: dict, capsys, **kw) -> dict:
    return run_module("stage_stamp", {**args, "state": "record"}, capsys=capsys, **kw)


def test_no_stamp_then_record_then_converged(tmp_path, capsys):
    args = stage(tmp_path)
    first = check(args, capsys)
    assert first["converged"] is False and first["changed"] is False
    assert "no stamp of a complete deploy run" in first["reason"]
    kept = record(args, capsys)
    assert kept["changed"] is True
    assert json.loads((tmp_path / "stamps" / "deploy.json").read_text())["keys"]["var:draft_tokens"] == "d16"
    again = check(args, capsys)
    assert again["converged"] is True and again["reason"] == "" and again["changed_keys"] == []
    assert again["fingerprint"] == kept["fingerprint"]
    assert record(args, capsys)["changed"] is False  # the same fingerprint again: nothing to keep
    assert [p.name for p in (tmp_path / "stamps").iterdir()] == ["deploy.json"]  # no temporary file left


def test_each_kind_of_change_is_named(tmp_path, capsys):
    args = stage(tmp_path)
    record(args, capsys)
    other = {**args, "controller": {**CONTROLLER, "var:draft_tokens": "d5"}}
    assert check(other, capsys)["reason"] == "changed: draft_tokens"
    weights = tmp_path / "draft" / "model.safetensors"
    st = weights.stat()
    weights.write_bytes(b"x" * 64)  # same size, rewritten in place
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert check(args, capsys)["changed_keys"] == [f"stat:{tmp_path / 'draft'}"]
    record(args, capsys)
    weights.unlink()
    weights.write_bytes(b"w" * 64)  # replaced: same bytes and size, new inode (and mtime)
    assert check(args, capsys)["changed_keys"] == [f"stat:{tmp_path / 'draft'}"]
    record(args, capsys)
    (tmp_path / "absent").write_text("now here")
    assert check(args, capsys)["changed_keys"] == [f"stat:{tmp_path / 'absent'}"]
    record(args, capsys)
    Path(args["contents"][0]).write_text("[Service]\nExecStart=/bin/true --speculative-num-draft-tokens 5\n")
    assert check(args, capsys)["reason"] == f"changed: content:{args['contents'][0]}"
    fewer = {**args, "controller": {"collection": "c1"}}
    assert check(fewer, capsys)["changed_keys"] == ["content:" + args["contents"][0], "var:draft_tokens"]


def test_a_stage_whose_server_is_down_or_out_of_the_router_is_not_converged(tmp_path, capsys):
    args = stage(tmp_path)
    worker = "http://10.0.0.5:30000"
    server = serve({"/health": (200, {}),
                    "/workers": (200, {"workers": [{"url": worker, "is_healthy": True}]})})  # fmt: skip
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        record(args, capsys)
        live = {"urls": [f"{base}/health"], "router": {"url": base, "worker": worker}}
        assert check(args, capsys, **live)["converged"] is True
        out = check(args, capsys, router={"url": base, "worker": "http://10.0.0.6:30000"})
        assert out["converged"] is False and "does not list http://10.0.0.6:30000 as healthy" in out["reason"]
        out = check(args, capsys, urls=[f"{base}/nothing"])
        assert out["converged"] is False and f"{base}/nothing does not answer" in out["reason"]
    finally:
        server.shutdown()
        server.server_close()
    out = check(args, capsys, urls=[f"{base}/health"])
    assert out["converged"] is False and "does not answer" in out["reason"]
    out = check(args, capsys, units=["eagle3-no-such-unit-for-tests"])
    assert out["converged"] is False and out["reason"].startswith("eagle3-no-such-unit-for-tests is ")


def test_check_mode_writes_nothing_and_shows_the_change(tmp_path, capsys):
    args = stage(tmp_path)
    out = record(args, capsys, check=True, diff=True)
    assert out["changed"] is True and out["diff"]["before"] == "absent\n"
    assert not (tmp_path / "stamps").exists()


def test_a_stamp_that_cannot_be_read_is_no_stamp_and_a_failed_write_leaves_nothing(tmp_path, capsys):
    args = stage(tmp_path)
    (tmp_path / "stamps").mkdir()
    (tmp_path / "stamps" / "deploy.json").write_text("{half a")
    assert "no stamp" in check(args, capsys)["reason"]
    (tmp_path / "stamps").chmod(0o500)
    try:
        out = record(args, capsys)
    finally:
        (tmp_path / "stamps").chmod(0o755)
    if os.geteuid() != 0:  # root writes through the mode bits
        assert out["failed"] is True and "Cannot write the deploy stamp" in out["msg"]
    assert [p.name for p in (tmp_path / "stamps").iterdir()] == ["deploy.json"]  # no temporary file left


def test_a_directory_too_large_to_list_is_refused_with_its_fix(tmp_path, capsys, monkeypatch):
    from tests.modules import module_utils

    stamp = module_utils("_stamp")
    store = tmp_path / "store"
    store.mkdir()
    for i in range(5):
        (store / f"row{i}").write_text("r")
    try:
        stamp.tree_digest(str(store), max_entries=3)
    except ValueError as exc:
        assert "fingerprint its manifest files" in str(exc)
    else:
        raise AssertionError("a store over the limit was fingerprinted")
    assert stamp.tree_digest(str(tmp_path / "none")) == "absent"
    # Another server's export takes the draft's lock and removes it: the directory's mtime moves, nothing else.
    before = stamp.tree_digest(str(store))
    (store / ".eagle3-checkpoint.lock").write_text("{}")
    assert stamp.tree_digest(str(store)) == before
    (store / ".eagle3-checkpoint.lock").unlink()
    assert stamp.tree_digest(str(store)) == before
    (store / "row9").write_text("r")
    assert stamp.tree_digest(str(store)) != before
    assert stamp.describe(["var:a", "var:b", "stat:/c", "var:d", "var:e"]) == "a, b, stat:/c, d and 1 more"


def test_a_linked_root_is_followed_where_a_file_is_rewritten_in_place(tmp_path):
    """checkpoint_best -> 14: the deploy's fingerprint sees a file of epoch 14 rewritten, the link moved to another
    epoch, and a link whose target is gone."""
    import os
    import time

    from tests.modules import module_utils

    stamp = module_utils("_stamp")
    for epoch in ("13", "14"):
        (tmp_path / epoch).mkdir()
        (tmp_path / epoch / "config.json").write_text("{}")
    best = tmp_path / "checkpoint_best"
    best.symlink_to("14")
    before = stamp.tree_digest(str(best))
    assert before == stamp.tree_digest(str(best))  # stable
    later = time.time() + 5
    os.utime(tmp_path / "14" / "config.json", (later, later))  # rewritten in place: its mtime moves
    touched = stamp.tree_digest(str(best))
    assert touched != before
    best.unlink()
    best.symlink_to("13")
    assert stamp.tree_digest(str(best)) not in (before, touched)
    best.unlink()
    best.symlink_to("gone")
    assert stamp.tree_digest(str(best)) not in ("absent", before, touched)


def test_the_collection_digest_follows_its_files_and_ignores_bytecode(tmp_path):
    import importlib

    from tests.modules import init_collection_loader

    init_collection_loader()
    action = importlib.import_module("ansible_collections.eagle3.ops.plugins.plugin_utils._collection")
    (tmp_path / "roles" / "r" / "tasks").mkdir(parents=True)
    task = tmp_path / "roles" / "r" / "tasks" / "main.yml"
    task.write_text("---\n")
    first = action.collection_digest(tmp_path)
    (tmp_path / "roles" / "r" / "__pycache__").mkdir()
    (tmp_path / "roles" / "r" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    assert action.collection_digest(tmp_path) == first
    task.write_text("---\n- name: more\n")
    assert action.collection_digest(tmp_path) != first


def test_the_action_plugin_digests_the_named_variables_and_never_a_secret(tmp_path):
    import importlib

    from tests.modules import init_collection_loader

    init_collection_loader()
    action = importlib.import_module("ansible_collections.eagle3.ops.plugins.action.stage_stamp")

    class Templar:
        def template(self, value):
            if value == "{{ later_fact }}":
                raise ValueError("undefined")
            return value

    plugin = action.ActionModule.__new__(action.ActionModule)
    plugin._templar = Templar()
    task_vars = {"draft_tokens": 16, "eagle3_x": "{{ later_fact }}", "eagle3_api_key": "s3cret",
                 "proxmox_ct_api_password": "p", "eagle3_force": True, "other": 1}  # fmt: skip
    # Exact names, never patterns: "eagle3_" names no variable, and a secret named is still left out.
    got = plugin._var_digests(task_vars, ["draft_tokens", "eagle3_x", "eagle3_api_key", "proxmox_ct_api_password",
                                          "eagle3_", "absent"])  # fmt: skip
    assert sorted(got) == ["var:draft_tokens", "var:eagle3_x"]
    assert got["var:eagle3_x"] == action.digest("{{ later_fact }}")  # kept as written until it can be templated


def test_a_stage_that_runs_takes_its_reads_in_the_same_call_and_a_converged_one_reads_nothing(tmp_path, capsys):
    """reads: what the plays after the check would each read in a round trip of their own, answered as raw answers
    (rc, stdout, stderr); a command that cannot start or is not a list answers with a reason, never a failed check."""
    args = stage(tmp_path)
    marker = tmp_path / "read"
    reads = {"release": ["sh", "-c", f"echo 0.5.23; touch {marker}"], "fails": ["sh", "-c", "echo no >&2; exit 3"],
             "absent": [str(tmp_path / "no-such-tool")], "bad": "nvidia-smi -L"}  # fmt: skip
    first = check(args, capsys, reads=reads)
    assert first["converged"] is False
    assert first["reads"]["release"] == {"rc": 0, "stdout": "0.5.23\n", "stderr": ""}
    assert first["reads"]["fails"] == {"rc": 3, "stdout": "", "stderr": "no\n"}
    assert first["reads"]["absent"]["rc"] == 127 and "no-such-tool" in first["reads"]["absent"]["stderr"]
    assert first["reads"]["bad"]["rc"] == 2 and "non-empty list of strings" in first["reads"]["bad"]["stderr"]
    record(args, capsys)
    marker.unlink()
    again = check(args, capsys, reads=reads)
    assert again["converged"] is True and "reads" not in again and not marker.exists()  # nothing follows: no read


def test_the_reads_run_at_once(tmp_path, capsys):
    """Each read waits for the other's mark: run one after the other, the first would give up (rc 1)."""
    wait = 'touch "$1"; i=0; while [ ! -e "$2" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; [ -e "$2" ]'
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    got = check(stage(tmp_path), capsys, reads={"first": ["sh", "-c", wait, "sh", a, b],
                                                "second": ["sh", "-c", wait, "sh", b, a]})  # fmt: skip
    assert got["reads"]["first"]["rc"] == 0 and got["reads"]["second"]["rc"] == 0, got["reads"]


def test_the_reads_argv_are_the_roles_own():
    """deploy.yml's check reads the GPUs and the release with the argv gpu_facts and sglang_runtime run themselves."""
    from ansible_collections.eagle3.ops.plugins.filter.gpu import GPU_FIELDS, nvidia_smi_csv, nvidia_smi_query
    from ansible_collections.eagle3.ops.plugins.filter.sglang import sglang_release_query

    assert nvidia_smi_query("/usr/bin/nvidia-smi") == [
        "/usr/bin/nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"]  # fmt: skip
    row = "0, GPU-1, NVIDIA H200, 10, 143771, 75.0, 700.0, 0"
    assert nvidia_smi_csv(row)[0]["memory_total"] == 143771 and nvidia_smi_csv(row) == nvidia_smi_csv(row, GPU_FIELDS)
    assert sglang_release_query("/opt/sglang/bin/python")[:2] == ["/opt/sglang/bin/python", "-c"]
    roles = Path(__file__).resolve().parents[4] / "roles"
    for role, text in (("gpu_facts", "nvidia_smi_query"), ("sglang_runtime", "sglang_release_query")):
        assert text in "".join(p.read_text() for p in (roles / role / "tasks").glob("*.yml")), role
    assert "nvidia_smi_query" in (roles / "sglang_serve" / "vars" / "main.yml").read_text()


def test_a_probe_that_does_not_hold_keeps_the_stage_pending_and_names_itself(tmp_path, capsys):
    """probes: liveness that is neither a unit nor a URL (a daemon's pid file, a port, a container's state), run on
    a check whose fingerprint matches; each must exit 0 and, with stdout, print a line that matches."""
    args = stage(tmp_path)
    record(args, capsys)
    flag = tmp_path / "alive"
    flag.write_text("state: RUNNING\n")
    probes = [{"name": "the daemon runs", "argv": ["test", "-e", str(flag)]},
              {"name": "CT 129 runs", "argv": ["cat", str(flag)], "stdout": "^state: RUNNING$"}]  # fmt: skip
    assert check(args, capsys, probes=probes)["converged"] is True
    flag.write_text("state: STOPPED\n")
    out = check(args, capsys, probes=probes)
    assert out["converged"] is False and out["reason"] == "CT 129 runs does not hold (cat printed 'state: STOPPED')"
    flag.unlink()
    out = check(args, capsys, probes=probes)
    assert out["converged"] is False and out["reason"] == "the daemon runs does not hold (test exited 1)"
    out = check(args, capsys, probes=[{"name": "a tool", "argv": [str(tmp_path / "no-such-tool")]}])
    assert out["reason"].startswith("a tool does not hold (") and "exited 127" in out["reason"]
    # A fingerprint that changed says so; its probes are not what it waits for.
    other = {**args, "controller": {**CONTROLLER, "var:draft_tokens": "d5"}}
    assert check(other, capsys, probes=probes)["reason"] == "changed: draft_tokens"


def test_the_stamp_directory_is_handed_to_the_record(tmp_path, capsys):
    args = {**stage(tmp_path), "dir": str(tmp_path / "lab-root" / "stamps")}
    out = check(args, capsys)
    assert out["dir"] == args["dir"]
    record({**args, "dir": out["dir"]}, capsys)
    assert (tmp_path / "lab-root" / "stamps" / "deploy.json").is_file()
