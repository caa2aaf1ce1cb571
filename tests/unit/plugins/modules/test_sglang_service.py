"""sglang_service: the unit, the restart, the health wait and the gates in one call, rolled back on failure.

systemd is a stand-in here (a `systemctl` on PATH whose restart makes the unit's text the running one); the server is
a real HTTP server on loopback that serves what the running unit asks for: healthy or not, and an accept length.
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from tests.modules import run_module

SYSTEMCTL = r"""#!/bin/sh
# systemctl as sglang_service calls it; state in $FAKE_SYSTEMD, units in $FAKE_UNIT_DIR
echo "$*" >> "$FAKE_SYSTEMD/calls"
[ "$1" = "--quiet" ] && shift
case "$1" in
  daemon-reload) exit 0 ;;
  is-active) [ -f "$FAKE_SYSTEMD/running" ] ;;
  is-enabled) [ -f "$FAKE_SYSTEMD/enabled" ] ;;
  enable) touch "$FAKE_SYSTEMD/enabled" ;;
  disable) rm -f "$FAKE_SYSTEMD/enabled"; [ "$2" = "--now" ] && rm -f "$FAKE_SYSTEMD/running"; exit 0 ;;
  start|restart) unit="$2"; cp "$FAKE_UNIT_DIR/$unit" "$FAKE_SYSTEMD/running"
    rm -f "$FAKE_SYSTEMD/running.env"
    if [ -f "$FAKE_ENV_FILE" ]; then cp "$FAKE_ENV_FILE" "$FAKE_SYSTEMD/running.env"; fi ;;
  stop) rm -f "$FAKE_SYSTEMD/running" ;;
  *) echo "unknown: $*" >&2; exit 2 ;;
esac
"""


def unit(draft: str, accept: float | None = 2.5, healthy: bool = True, reply: int | None = None) -> str:
    """A unit whose fake server reports ``accept`` (none: no verify step ran) and answers ``reply`` tokens."""
    health = "ok" if healthy else "dead"
    most = "" if reply is None else f" reply={reply}"
    return (f"[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --speculative-draft-model-path {draft} "
            f"# accept={accept} health={health}{most}\n")  # fmt: skip


@pytest.fixture
def fake(tmp_path, monkeypatch):
    state, units, bin_dir = tmp_path / "systemd", tmp_path / "units", tmp_path / "bin"
    for d in (state, units, bin_dir):
        d.mkdir()
    (bin_dir / "systemctl").write_text(SYSTEMCTL)
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SYSTEMD", str(state))
    monkeypatch.setenv("FAKE_UNIT_DIR", str(units))
    env_file = tmp_path / "etc" / "eagle3-ops" / "sglang.env"
    monkeypatch.setenv("FAKE_ENV_FILE", str(env_file))

    class Handler(BaseHTTPRequestHandler):
        def running(self) -> str:
            path = state / "running"
            return path.read_text() if path.exists() else ""

        def refused(self) -> bool:
            """SGLang's check: with an API key in the running environment, all but /health need it as a bearer."""
            path = state / "running.env"
            found = re.search(r'EAGLE3_API_KEY="([^"]*)"', path.read_text()) if path.exists() else None
            if not found or self.path == "/health" or self.headers.get("Authorization") == f"Bearer {found.group(1)}":
                return False
            self.answer(401, {"error": "Unauthorized"})
            return True

        def answer(self, code: int, body: object) -> None:
            self.send_response(code)
            self.end_headers()
            self.wfile.write(json.dumps(body).encode())

        def do_GET(self) -> None:
            if self.refused():
                return
            text = self.running()
            if not text or "health=dead" in text:
                self.answer(503, {"error": "not ready"})
            elif self.path == "/health":
                self.send_response(200)
                self.end_headers()  # SGLang's /health: 200 and no body
            elif self.path == "/get_server_info":
                found = re.search(r"accept=([\d.]+)", text)
                accept = float(found.group(1)) if found else None
                self.answer(200, {"internal_states": [{"avg_spec_accept_length": accept}]})
            else:
                self.answer(404, {})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.refused():
                return
            found = re.search(r"reply=(\d+)", self.running())
            n = int(found.group(1)) if found else body["max_tokens"]
            message = {"role": "assistant", "content": "x" * n}
            self.answer(200, {"choices": [{"index": 0, "message": message}], "usage": {"completion_tokens": n}})

        def log_message(self, *_args: object) -> None:
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    log = tmp_path / "logs" / "sglang.log"
    base = {"name": "sglang", "unit_dir": str(units), "url": f"http://127.0.0.1:{srv.server_port}", "log": str(log),
            "health_timeout": 3, "health_interval": 0.05, "prompts": ["a"], "max_tokens": 3,
            "min_accept_length": 1.05, "accept_context": "with the draft /d/new",
            "accept_hint": "the draft's weights did not take effect."}  # fmt: skip
    yield {"state": state, "unit": units / "sglang.service", "log": log, "args": base, "env_file": env_file}
    srv.shutdown()


def calls(fake) -> list[str]:
    path = fake["state"] / "calls"
    lines = path.read_text().splitlines() if path.exists() else []
    path.unlink(missing_ok=True)
    return lines


def test_a_first_install_writes_the_unit_restarts_waits_and_gates(fake, capsys):
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    assert not got.get("failed"), got.get("msg")
    assert got["changed"] and got["unit_changed"] and got["started"] and got["rolled_back"] is None
    assert fake["unit"].read_text() == unit("/d/new") and stat.S_IMODE(fake["unit"].stat().st_mode) == 0o644
    assert fake["log"].parent.is_dir()  # the unit appends to a log in a directory that must exist
    assert [c for c in calls(fake) if not c.startswith("is-")] == ["daemon-reload", "enable --quiet sglang.service",
                                                                  "restart sglang.service"]  # fmt: skip
    assert got["accept_length"] == 2.5 and [s["chars"] for s in got["smoke"]] == [3] and got["health_seconds"] >= 0
    assert not [p for p in fake["unit"].parent.iterdir() if p.name != "sglang.service"]  # no temporary file left


def test_the_same_unit_on_a_running_service_changes_nothing(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    calls(fake)
    before = fake["unit"].stat().st_mtime_ns
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    assert not got.get("failed") and not got["changed"] and not got["started"]
    assert fake["unit"].stat().st_mtime_ns == before
    assert calls(fake) == ["is-active --quiet sglang.service", "is-enabled --quiet sglang.service"]
    assert got["accept_length"] == 2.5  # the gates still answer for what is served


def test_an_unchanged_unit_whose_service_stopped_is_started_not_rewritten(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    (fake["state"] / "running").unlink()
    calls(fake)
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    assert not got.get("failed") and got["changed"] and got["started"] and not got["unit_changed"]
    assert "start sglang.service" in calls(fake)


def test_check_mode_reports_the_change_and_its_diff_and_touches_nothing(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    calls(fake)
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, check=True, diff=True,
                     capsys=capsys)  # fmt: skip
    assert not got.get("failed") and got["changed"] and got["started"]
    assert got["diff"]["before"] == unit("/d/old") and got["diff"]["after"] == unit("/d/new")
    assert fake["unit"].read_text() == unit("/d/old") and "/d/old" in (fake["state"] / "running").read_text()
    assert all(c.startswith("is-") for c in calls(fake))


def test_a_draft_under_the_gate_is_rolled_back_to_the_previous_unit(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    fake["log"].write_text("".join(f"line {i}\n" for i in range(20)))
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0)}, capsys=capsys)
    assert got["failed"]
    assert got["msg"].startswith("The server accepts 1.0 tokens per step with the draft /d/new (gate: above 1.05): "
                                 "the draft's weights did not take effect. Rolled back to the previous unit "
                                 "(previous service restored, healthy, draft /d/old).")  # fmt: skip
    assert got["msg"].endswith(f"Server log {fake['log']} ends with: " + " | ".join(f"line {i}" for i in range(12, 20)))
    assert fake["unit"].read_text() == unit("/d/old") and "/d/old" in (fake["state"] / "running").read_text()
    assert got["restored_healthy"] is True


def test_replies_of_one_token_fail_as_too_short_to_judge_not_as_the_drafts_fault(fake, capsys):
    # A chat model asked a bare text may answer its end token at once: no draft is verified, no accept length.
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=None, reply=1)},
                     capsys=capsys)  # fmt: skip
    assert got["failed"] and got["smoke"][0]["tokens"] == 1 and got["accept_length"] is None
    assert got["msg"].startswith("The 1 smoke request(s) through /v1/chat/completions got at most one token each, so "
                                 "no draft was verified and the accept length cannot be read (the draft is not to "
                                 "blame): send smoke prompts the target answers at length.")  # fmt: skip
    assert "did not take effect" not in got["msg"] and fake["unit"].read_text() == unit("/d/old")  # rolled back
    # Replies of two tokens or more ran a verify step: an accept length at the floor is the draft's.
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0, reply=2)},
                     capsys=capsys)  # fmt: skip
    assert got["failed"] and got["msg"].startswith("The server accepts 1.0 tokens per step with the draft /d/new")


def test_a_new_service_that_never_answers_is_stopped_and_removed(fake, capsys):
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", healthy=False), "health_timeout": 1},
                     capsys=capsys)  # fmt: skip
    assert got["failed"] and "/health within 1 s" in got["msg"]
    assert "Rolled back to the previous unit (no previous service: the new one was stopped and removed)." in got["msg"]
    assert not fake["unit"].exists() and not (fake["state"] / "running").exists()
    assert not (fake["state"] / "enabled").exists()


def test_a_failure_without_a_unit_change_is_not_rolled_back(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0), "min_accept_length": 0.5},
               capsys=capsys)  # fmt: skip
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0)}, capsys=capsys)
    assert got["failed"] and "No rollback: the unit did not change." in got["msg"]
    assert fake["unit"].read_text() == unit("/d/new", accept=1.0)


def test_without_rollback_the_new_unit_stays(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0), "rollback": False},
                     capsys=capsys)  # fmt: skip
    assert got["failed"] and "Not rolled back (rollback is false)" in got["msg"]
    assert fake["unit"].read_text() == unit("/d/new", accept=1.0)


def test_a_served_setting_keeps_the_stage_stamp_a_check_then_finds_converged(fake, tmp_path, capsys):
    """The stamp option records in the same call what stage_stamp's record would: a check of the same inputs after it
    finds the stage converged, and the unit the stamp saw is the one that passed the gates."""
    from ansible_collections.eagle3.ops.plugins.module_utils._stamp import StageStamp

    stamps, draft = tmp_path / "stamps", tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text("{}")
    stamp = {"stage": "deploy", "dir": str(stamps), "controller": {"var:draft_tokens": "d16"},
             "paths": [str(draft)], "contents": [str(fake["unit"])]}  # fmt: skip
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "stamp": stamp}, capsys=capsys)
    assert not got.get("failed"), got.get("msg")
    assert got["stamp"]["changed"] and (stamps / "deploy.json").is_file()
    check = StageStamp({**stamp, "units": [], "urls": [], "router": None}).check()
    assert check["converged"] and check["changed_keys"] == [], check
    assert not [p for p in stamps.iterdir() if p.name != "deploy.json"]  # written whole: no temporary left


def test_a_setting_that_fails_its_gates_keeps_no_stamp(fake, tmp_path, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    stamps = tmp_path / "stamps"
    stamp = {"stage": "deploy", "dir": str(stamps), "contents": [str(fake["unit"])]}
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new", accept=1.0), "stamp": stamp},
                     capsys=capsys)  # fmt: skip
    assert got["failed"] and "stamp" not in got and not stamps.exists()


def test_a_stamp_that_cannot_be_written_is_a_warning_not_a_failure_of_what_is_served(fake, tmp_path, capsys,
                                                                                        monkeypatch):  # fmt: skip
    from ansible.module_utils.basic import AnsibleModule

    warned: list[str] = []  # in a controller process AnsibleModule.warn goes to the display, not to the result
    monkeypatch.setattr(AnsibleModule, "warn", lambda self, warning, **_kw: warned.append(warning))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    stamp = {"stage": "deploy", "dir": str(blocked / "stamps")}
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "stamp": stamp}, capsys=capsys)
    assert not got.get("failed") and "stamp" not in got and got["accept_length"] == 2.5
    assert len(warned) == 1 and "Cannot write the deploy stamp" in warned[0] and "runs again" in warned[0], warned


def test_the_module_documents_every_option(capsys):
    import yaml
    from ansible_collections.eagle3.ops.plugins.doc_fragments.gate import ModuleDocFragment

    from tests.modules import load_module

    mod = load_module("sglang_service")
    documented = set(yaml.safe_load(mod.DOCUMENTATION)["options"]) | set(
        yaml.safe_load(ModuleDocFragment.DOCUMENTATION)["options"])
    assert documented == set(mod.ARGUMENT_SPEC), documented ^ set(mod.ARGUMENT_SPEC)
    assert Path(mod.__file__).name == "sglang_service.py"


JUDGE = r"""#!/bin/sh
# sglang_check.judge as sglang_service runs it: records where and how, answers as $FAKE_SYSTEMD/verdict says
printf '%s\n' "$PWD" "$@" > "$FAKE_SYSTEMD/judged"
cat "$FAKE_SYSTEMD/verdict"
[ -f "$FAKE_SYSTEMD/verdict.err" ] && cat "$FAKE_SYSTEMD/verdict.err" >&2
exit "$(cat "$FAKE_SYSTEMD/verdict.rc")"
"""


def models(tmp_path, architectures: list[str] | None = None) -> dict:
    """A target and a draft (an EAGLE-3 one in SGLang's layout unless ``architectures`` says otherwise), and the host's
    name, as sglang_service's options name them."""
    target, draft = tmp_path / "target", tmp_path / "draft"
    for path, config in ((target, {"architectures": ["LlamaForCausalLM"]}),
                         (draft, {"architectures": architectures or ["LlamaForCausalLMEagle3"]})):
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps(config))
    return {"host": "ct130", "target": str(target), "draft": str(draft)}


def judge(fake, tmp_path, rc: int, verdict: dict, stderr: str = "") -> dict:
    """A judge that answers ``verdict`` with exit ``rc``, as sglang_service's option ``judge`` names it."""
    script = tmp_path / "judge"
    script.write_text(JUDGE)
    script.chmod(0o755)
    (fake["state"] / "verdict").write_text(json.dumps(verdict) + "\n")
    (fake["state"] / "verdict.rc").write_text(str(rc))
    if stderr:
        (fake["state"] / "verdict.err").write_text(stderr)
    return {"argv": [str(script), "serve", "--", "--speculative-num-draft-tokens", "16"], "chdir": str(tmp_path),
            "python": "/opt/sglang/bin/python", "release": "0.5.23"}


def test_the_judge_is_asked_first_and_a_verdict_that_passes_serves(fake, tmp_path, capsys):
    spec = judge(fake, tmp_path, 0, {"ok": True, "sglang": "0.5.23", "args": {"ok": True}})
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "judge": spec,
                                         **models(tmp_path)}, capsys=capsys)
    assert not got.get("failed"), got.get("msg")
    assert got["verdict"] == {"ok": True, "sglang": "0.5.23", "args": {"ok": True}} and got["started"]
    where, *argv = (fake["state"] / "judged").read_text().splitlines()
    assert where == str(tmp_path) and argv == ["serve", "--", "--speculative-num-draft-tokens", "16"]


@pytest.mark.parametrize(("rc", "verdict", "stderr", "message"), [
    (1, {"failed": "args", "sglang": "0.5.22", "args": {"stage": "compare", "error": "speculative-num-draft-tokens 32 "
                                                         "would run as 16"}}, "",
     "SGLang 0.5.22 on ct130 would run this command line differently: speculative-num-draft-tokens 32 would run as "
     "16; fix draft_tokens, speculative_topk or speculative_steps (or sglang_serve_extra_args) so that SGLang runs "
     "what was asked."),
    (1, {"failed": "args", "args": {"stage": "check", "error": "tree drafting needs topk > 1"}}, "",
     "SGLang 0.5.23 on ct130 would not run this command line: tree drafting needs topk > 1; fix draft_tokens"),
    (1, {"failed": "load", "sglang": "0.5.23", "load": {"problems": ["SGLang refused lm_head.weight [256, 64]",
                                                                     "nothing wrote fc.weight"]}}, "",
     "SGLang 0.5.23 on ct130 loads {draft} incompletely: SGLang refused lm_head.weight [256, 64]; nothing wrote "
     "fc.weight; export the speculators checkpoint for this SGLang release (eagle3_export with sglang_version "
     "0.5.23)."),
    (2, {"failed": "load", "load": {"error": "the load check could not run (exit 1): no torch"}}, "",
     "SGLang on ct130 could not judge the load: the load check could not run (exit 1): no torch; check the SGLang "
     "environment (/opt/sglang/bin/python) or set sglang_serve_check_args and sglang_serve_check_draft_load to false "
     "to serve without the judge."),
    (1, {}, "Traceback (most recent call last):\nModuleNotFoundError: No module named 'sglang_check'\n",
     "SGLang on ct130 could not judge the command line and draft: ModuleNotFoundError: No module named "
     "'sglang_check'; check the SGLang environment"),
])  # fmt: skip
def test_a_refusal_names_what_sglang_refused_and_changes_nothing(fake, tmp_path, capsys, rc, verdict, stderr,
                                                                 message):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    calls(fake)
    spec = judge(fake, tmp_path, rc, verdict, stderr)
    for check in (False, True):  # asked in check mode too (its argv then keeps no verdict)
        got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "judge": spec,
                                         **models(tmp_path)}, check=check,
                         capsys=capsys)  # fmt: skip
        assert got.get("failed") and got["msg"].startswith(message.format(draft=tmp_path / "draft")), got["msg"]
        assert "\\" not in got["msg"] and not got["changed"] and got["rolled_back"] is None
        assert fake["unit"].read_text() == unit("/d/old") and calls(fake) == []  # not even a systemctl read


def test_a_judge_that_cannot_start_is_named_with_its_environment(fake, tmp_path, capsys):
    spec = {"argv": [str(tmp_path / "no-python"), "-m", "sglang_check.judge"], "chdir": str(tmp_path),
            "python": str(tmp_path / "no-python")}
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "judge": spec,
                                         **models(tmp_path)}, capsys=capsys)
    assert got.get("failed") and not fake["unit"].exists()
    assert got["msg"].startswith("SGLang on ct130 could not judge the command line and draft: No such file or "
                                 f"directory: {tmp_path / 'no-python'}; check the SGLang environment"), got["msg"]


def test_an_enabled_service_is_not_enabled_again_on_a_switch(fake, capsys):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    calls(fake)
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new")}, capsys=capsys)
    assert not got.get("failed") and got["started"]
    assert [c for c in calls(fake) if not c.startswith("is-")] == ["daemon-reload", "restart sglang.service"]


@pytest.mark.parametrize(("change", "says"), [
    ("target", "The target {tmp}/target/config.json is missing on ct130: export the speculators checkpoint with "
               "eagle3_export (deploy.yml does) or fix the path."),
    ("draft", "The draft {tmp}/draft/config.json is missing on ct130: export"),
    ("layout", "The draft {tmp}/draft is not in SGLang layout (architectures ['LlamaEagle3Speculator']) on ct130: "
               "export the speculators checkpoint"),
])  # fmt: skip
def test_a_missing_target_or_a_draft_sglang_cannot_load_is_refused_before_the_judge(fake, tmp_path, capsys, change,
                                                                                     says):
    run_module("sglang_service", {**fake["args"], "content": unit("/d/old")}, capsys=capsys)
    calls(fake)
    named = models(tmp_path, ["LlamaEagle3Speculator"] if change == "layout" else None)
    if change != "layout":
        (Path(named[change]) / "config.json").unlink()
    spec = judge(fake, tmp_path, 0, {"ok": True})
    got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), "judge": spec, **named},
                     capsys=capsys)  # fmt: skip
    assert got.get("failed") and got["msg"].startswith(says.format(tmp=tmp_path)), got["msg"]
    assert not (fake["state"] / "judged").exists() and calls(fake) == []
    assert fake["unit"].read_text() == unit("/d/old")
    named.pop("draft")  # a server without speculation: the target alone is checked
    if change != "target":
        got = run_module("sglang_service", {**fake["args"], "content": unit("/d/new"), **named}, capsys=capsys)
        assert not got.get("failed"), got["msg"]


KEYED = {"EAGLE3_API_KEY": "k" * 40, "EAGLE3_ADMIN_API_KEY": "a" * 40}


def keyed(fake, key: str = "k" * 40, **env: str) -> dict:
    """The call for a server that runs with an API key (its environment file) and gates with ``key``."""
    return {**fake["args"], "env": {**KEYED, **env}, "env_file": str(fake["env_file"]), "api_key": key}


def test_a_keyed_server_gets_its_keys_in_a_0600_environment_file_never_in_the_unit_or_the_result(fake, capsys):
    got = run_module("sglang_service", {**keyed(fake), "content": unit("/d/new")}, capsys=capsys)
    assert not got.get("failed"), got.get("msg")
    assert got["changed"] and got["env_changed"] and got["accept_length"] == 2.5  # the gates passed with the key
    assert stat.S_IMODE(fake["env_file"].stat().st_mode) == 0o600
    assert fake["env_file"].read_text() == f'EAGLE3_ADMIN_API_KEY="{"a" * 40}"\nEAGLE3_API_KEY="{"k" * 40}"\n'
    assert "k" * 40 not in fake["unit"].read_text() and "k" * 40 not in json.dumps(got)
    assert not [p for p in fake["env_file"].parent.iterdir() if p.name != "sglang.env"]  # no temporary left
    again = run_module("sglang_service", {**keyed(fake), "content": unit("/d/new")}, capsys=capsys)
    assert not again.get("failed") and not again["changed"] and not again["env_changed"]


def test_a_rotated_key_restarts_the_server_with_an_unchanged_unit_and_its_diff_hides_the_key(fake, capsys):
    run_module("sglang_service", {**keyed(fake), "content": unit("/d/new")}, capsys=capsys)
    calls(fake)
    new = "n" * 40
    plan = run_module("sglang_service", {**keyed(fake, new, EAGLE3_API_KEY=new), "content": unit("/d/new")},
                      check=True, diff=True, capsys=capsys)  # fmt: skip
    assert plan["changed"] and plan["started"] and plan["env_changed"]
    assert "its values changed (not shown)" in plan["diff"]["after"] and new not in json.dumps(plan)
    assert "k" * 40 in fake["env_file"].read_text()  # check mode touched nothing
    got = run_module("sglang_service", {**keyed(fake, new, EAGLE3_API_KEY=new), "content": unit("/d/new")},
                     capsys=capsys)  # fmt: skip
    assert not got.get("failed"), got.get("msg")
    assert got["started"] and "restart sglang.service" in calls(fake)
    assert new in (fake["state"] / "running.env").read_text()


def test_a_key_the_server_refuses_fails_naming_the_key_and_rolls_the_environment_back(fake, capsys):
    run_module("sglang_service", {**keyed(fake), "content": unit("/d/old")}, capsys=capsys)
    new = "n" * 40
    got = run_module("sglang_service", {**keyed(fake, "w" * 40, EAGLE3_API_KEY=new), "content": unit("/d/new")},
                     capsys=capsys)  # fmt: skip
    assert got["failed"]
    assert "refused the serving plane's API key (HTTP 401)" in got["msg"]
    assert "Rolled back to the previous unit (previous service restored, healthy" in got["msg"]
    assert "k" * 40 in fake["env_file"].read_text() and unit("/d/old") == fake["unit"].read_text()
    assert new not in json.dumps(got)


def test_a_keyed_server_asked_without_a_key_says_so(fake, capsys):
    run_module("sglang_service", {**keyed(fake), "content": unit("/d/old")}, capsys=capsys)
    args = {k: v for k, v in keyed(fake).items() if k != "api_key"}
    got = run_module("sglang_service", {**args, "content": unit("/d/new")}, capsys=capsys)
    assert got["failed"] and "asks for a key (HTTP 401) and none was sent" in got["msg"]


@pytest.mark.parametrize(("env", "message"), [
    ({"EAGLE3 KEY": "x"}, "env name 'EAGLE3 KEY' is not a variable name"),
    ({"EAGLE3_API_KEY": "a\nb"}, "env EAGLE3_API_KEY's value holds a line break"),
])
def test_an_environment_systemd_cannot_read_is_refused_before_anything(fake, capsys, env, message):
    got = run_module("sglang_service", {**fake["args"], "env": env, "env_file": str(fake["env_file"]),
                                        "content": unit("/d/new")}, capsys=capsys)  # fmt: skip
    assert got["failed"] and message in got["msg"] and not fake["unit"].exists() and not fake["env_file"].exists()


def test_the_gates_figure_of_a_restart_is_recorded_and_a_later_unchanged_call_keeps_it(fake, tmp_path, capsys):
    record = tmp_path / "served" / "sglang.json"
    args = {**fake["args"], "record": str(record), "draft": None}
    got = run_module("sglang_service", {**args, "content": unit("/d/new", accept=2.5)}, capsys=capsys)
    assert not got.get("failed"), got.get("msg")
    kept = json.loads(record.read_text())
    assert kept["accept_length"] == 2.5 and kept["unit"] == "sglang.service" and kept["time"].endswith("Z")
    (fake["state"] / "running").write_text(unit("/d/new", accept=1.9))  # served since: the average moved
    again = run_module("sglang_service", {**args, "content": unit("/d/new", accept=2.5)}, capsys=capsys)
    assert not again.get("failed") and not again["started"]
    assert json.loads(record.read_text())["accept_length"] == 2.5  # the deploy's figure, not today's
    switched = run_module("sglang_service", {**args, "content": unit("/d/next", accept=2.8)}, capsys=capsys)
    assert switched["started"] and json.loads(record.read_text())["accept_length"] == 2.8
    failed = run_module("sglang_service", {**args, "content": unit("/d/bad", accept=1.0)}, capsys=capsys)
    assert failed["failed"] and json.loads(record.read_text())["accept_length"] == 2.8  # a rolled-back draft: none
