"""module_utils/_stamp.py: the digests a fingerprint is made of, and how a change is named."""

from __future__ import annotations

import os

from tests.modules import module_utils

stamp = module_utils("_stamp")


def test_a_value_s_digest_ignores_key_order():
    assert stamp.digest({"a": 1, "b": [2, 3]}) == stamp.digest({"b": [2, 3], "a": 1})
    assert stamp.digest({"a": 1}) != stamp.digest({"a": 2})


def test_file_and_tree_digests(tmp_path):
    assert stamp.file_digest(str(tmp_path / "none")) == "absent"
    assert stamp.tree_digest(str(tmp_path / "none")) == "absent"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "w.bin").write_bytes(b"1")
    first = stamp.tree_digest(str(tmp_path / "d"))
    (tmp_path / "d" / ".eagle3-checkpoint.lock").write_text("")  # a lock file that comes and goes is no change
    assert stamp.tree_digest(str(tmp_path / "d")) == first
    os.unlink(tmp_path / "d" / ".eagle3-checkpoint.lock")
    (tmp_path / "d" / "w.bin").write_bytes(b"22")  # rewritten: size and mtime move
    assert stamp.tree_digest(str(tmp_path / "d")) != first


def test_changed_keys_and_their_description():
    keys = stamp.changed_keys({"var:a": "1", "var:b": "2", "stat:/x": "3"}, {"var:a": "1", "var:b": "9", "var:c": "4"})
    assert keys == ["stat:/x", "var:b", "var:c"]
    assert stamp.describe(keys) == "stat:/x, b, c"
    assert stamp.describe(["var:a", "var:b", "var:c", "var:d", "var:e", "var:f"]) == "a, b, c, d and 2 more"


def test_a_record_after_the_gates_keeps_the_fingerprint_and_says_what_changed(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "draft" / "w").write_text("1")
    params = {"stage": "deploy", "dir": str(tmp_path / "stamps"), "controller": {"var:draft_tokens": "16"},
              "paths": [str(tmp_path / "draft")], "contents": []}  # fmt: skip
    first = stamp.record_after(params)
    assert first["changed"] is True and len(first["fingerprint"]) > 12
    assert stamp.record_after(params) == {**first, "changed": False, "changed_keys": []}
    params["controller"] = {"var:draft_tokens": "5"}
    assert stamp.record_after(params)["changed_keys"] == ["var:draft_tokens"]
    assert set(stamp.RECORD_SPEC) == {"stage", "dir", "controller", "paths", "contents"}
