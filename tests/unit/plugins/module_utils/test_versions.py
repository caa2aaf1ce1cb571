"""module_utils/_versions.py: content digests, whole-or-absent publishing, the served record and what may be
collected."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.modules import module_utils

versions = module_utils("_versions")


def make(root: Path, name: str, age: float = 0) -> Path:
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    if age:
        then = time.time() - age
        os.utime(d, (then, then))
    return d


def test_the_digest_covers_parameters_names_and_bytes(tmp_path):
    a = tmp_path / "a.bin"
    a.write_bytes(b"x" * 10)
    base = versions.content_digest([str(a)], {"line": "legacy"})
    assert base == versions.content_digest([str(a)], {"line": "legacy"})
    assert base != versions.content_digest([str(a)], {"line": "0.5.23"})
    a.write_bytes(b"x" * 9 + b"y")
    assert base != versions.content_digest([str(a)], {"line": "legacy"})
    assert versions.is_version(versions.version_name(base)) and not versions.is_version("current")


def test_publishing_twice_keeps_the_first_and_removes_the_second_copy(tmp_path):
    one = versions.staging_dir(str(tmp_path), "0" * 16)
    two = versions.staging_dir(str(tmp_path), "0" * 16)
    Path(one, "config.json").write_text("first")
    Path(two, "config.json").write_text("second")
    final = str(tmp_path / ("0" * 16))
    assert versions.publish(one, final) is True
    assert versions.publish(two, final) is False
    assert Path(final, "config.json").read_text() == "first" and not Path(two).exists()


def test_served_moves_current_to_previous_only_for_a_new_version():
    record = {"servers": {}, "current": None, "previous": None, "history": []}
    assert versions.record_served(record, "s1", "a" * 16)
    assert (record["current"], record["previous"]) == ("a" * 16, None)
    assert versions.record_served(record, "s2", "a" * 16)  # another server, same version
    assert not versions.record_served(record, "s2", "a" * 16)  # nothing new
    assert versions.record_served(record, "s1", "b" * 16)
    assert (record["current"], record["previous"]) == ("b" * 16, "a" * 16)
    assert versions.record_served(record, "s1", "a" * 16)  # an older source served again: current again
    assert (record["current"], record["previous"]) == ("a" * 16, "b" * 16)
    assert record["history"] == ["b" * 16, "a" * 16]


def test_collection_keeps_what_is_served_current_previous_and_the_newest(tmp_path):
    names = [c * 16 for c in "abcdef"]
    for age, name in enumerate(reversed(names)):
        make(tmp_path, name, age=100 * age + 10)  # a oldest ... f newest
    record = {"servers": {"s1": names[0]}, "current": names[1], "previous": names[2], "history": names[:3]}
    # newest three by history-then-disk order: history's a, b, c come last (served most recently)
    assert versions.collectable(str(tmp_path), record, keep=3) == names[3:]
    record["history"] = []
    assert versions.collectable(str(tmp_path), record, keep=2) == [names[3]]
    with pytest.raises(versions.VersionError, match="keep must be 1 or more"):
        versions.collectable(str(tmp_path), record, keep=0)


def test_only_old_staging_is_stale(tmp_path):
    old = Path(versions.staging_dir(str(tmp_path), "1" * 16))
    new = Path(versions.staging_dir(str(tmp_path), "2" * 16))
    os.utime(old, (1, 1))
    assert versions.stale_staging(str(tmp_path)) == [str(old)] and new.exists()


def test_a_broken_record_is_named(tmp_path):
    (tmp_path / "versions.json").write_text("{")
    with pytest.raises(versions.VersionError, match=r"versions\.json is not valid JSON"):
        versions.read_record(str(tmp_path))
