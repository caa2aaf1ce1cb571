"""The lab's reference engine asks for the server's API key exactly where SGLang 0.5.23 does: its auth_status against
SGLang's own decide_request_auth (sglang/srt/utils/auth.py), run in .venv-sglang, over every method, path, header and
key setting the project sends - so a key the lab accepts is one SGLang accepts, and a request the lab refuses SGLang
refuses with the same status."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.modules import ROOT

SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PAYLOADS = ROOT / "eagle3_ops" / "payloads"

SCRIPT = r"""
import importlib.util, itertools, json, os, sys
# SGLang's auth module by its file: it imports the standard library only, and the sglang package's own __init__
# patches transformers and torchvision, which a CPU install does not need for this.
root = importlib.util.find_spec("sglang").submodule_search_locations[0]
spec = importlib.util.spec_from_file_location("sglang_auth", os.path.join(root, "srt", "utils", "auth.py"))
auth = importlib.util.module_from_spec(spec)
sys.modules["sglang_auth"] = auth  # its dataclasses look their module up
spec.loader.exec_module(auth)
AuthLevel, decide_request_auth = auth.AuthLevel, auth.decide_request_auth
from serving.server import auth_status

methods = ["GET", "POST", "OPTIONS"]
paths = ["/health", "/health_generate", "/ready", "/metrics", "/generate", "/v1/chat/completions", "/v1/completions",
         "/get_server_info", "/server_info", "/v1/loads", "/v1/models", "/healthz"]
headers = [None, "Bearer K", "bearer K", "BEARER K", "Bearer k", "Bearer K2", "Bearer ", "Basic K", "K", "Bearer  K"]
differ, cases = [], 0
# The servers run with an admin key as well (eagle3-ops passes --admin-api-key): on these endpoints SGLang asks for the
# API key alone, the admin key is no way in.
for method, path, header, key, admin in itertools.product(methods, paths, headers, [None, "K"], [None, "K2"]):
    sg = decide_request_auth(method=method, path=path, authorization_header=header, api_key=key, admin_api_key=admin,
                             auth_level=AuthLevel.NORMAL)
    want = None if sg.allowed else sg.error_status_code
    got = auth_status(method, path, header, key)
    cases += 1
    if got != want:
        differ.append([method, path, header, key, admin, want, got])
print(json.dumps({"cases": cases, "differ": differ}))
"""


def test_the_reference_engine_decides_a_key_as_sglang_does():
    if not SGLANG_PYTHON.exists():
        pytest.fail(f"{SGLANG_PYTHON} is missing: run scripts/bootstrap.sh (it installs the pinned SGLang)")
    proc = subprocess.run([str(SGLANG_PYTHON), "-c", SCRIPT], cwd=PAYLOADS, capture_output=True, text=True,
                          timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["cases"] == 3 * 12 * 10 * 2 * 2 and out["differ"] == [], out["differ"][:10]
