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
