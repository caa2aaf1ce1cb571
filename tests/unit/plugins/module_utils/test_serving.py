"""module_utils/_serving.py: what a server reports of its accept length, the judge's verdict line, and a model that
cannot be served named before anything restarts."""

from __future__ import annotations

import json

from tests.modules import module_utils

serving = module_utils("_serving")


def test_the_reported_accept_length():
    assert serving.reported_accept_length({"internal_states": [{"avg_spec_accept_length": 3.2}]}) == 3.2
    assert serving.reported_accept_length({"internal_states": []}) is None
    assert serving.reported_accept_length({}) is None


def test_the_judge_s_verdict_is_its_last_line():
    assert serving.judge_verdict('log line\n{"ok": true}\n') == {"ok": True}
    assert serving.judge_verdict('{"ok": true}\ntrailing words') == {}
    assert serving.judge_verdict("{not json") == {} and serving.judge_verdict("") == {}


def test_a_missing_target_or_a_foreign_draft_is_refused(tmp_path):
    target, draft = tmp_path / "target", tmp_path / "draft"
    target.mkdir()
    draft.mkdir()
    assert "target" in serving.model_refusal("ct130", str(target), None) and "config.json" in \
        serving.model_refusal("ct130", str(target), None)  # fmt: skip
    (target / "config.json").write_text("{}")
    assert serving.model_refusal("ct130", str(target), None) is None
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    refusal = serving.model_refusal("ct130", str(target), str(draft))
    assert refusal and "ct130" in refusal
    (draft / "config.json").write_text(json.dumps({"architectures": [serving.EAGLE3_ARCHITECTURE]}))
    assert serving.model_refusal("ct130", str(target), str(draft)) is None
