"""draft_versions: a server's served version recorded (current/previous), versions nobody serves collected down to
the newest kept, check mode and diff changing nothing, bad input named in one sentence."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.modules import run_module


def run(capsys, check=False, diff=False, **args):
    return run_module("draft_versions", args, check=check, diff=diff, capsys=capsys)


def make(root: Path, name: str, age: float) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text("{}")
    os.utime(root / name, (time.time() - age, time.time() - age))


def test_served_then_collected(tmp_path, capsys):
    names = [c * 16 for c in "abcde"]
    for age, name in enumerate(reversed(names)):
        make(tmp_path, name, 100 * age + 10)
    root = str(tmp_path)
    res = run(capsys, check=True, diff=True, root=root, host="s1", version=names[4])
    assert res["changed"] and '"current": "' + names[4] in res["diff"]["after"]
    assert not (tmp_path / "versions.json").exists()
    assert run(capsys, root=root, host="s1", version=names[4])["changed"]
    assert run(capsys, root=root, host="s2", version=names[4])["changed"]
    assert not run(capsys, root=root, host="s2", version=names[4])["changed"]
    record = json.loads((tmp_path / "versions.json").read_text())
    assert record["servers"] == {"s1": names[4], "s2": names[4]} and record["current"] == names[4]
    would = run(capsys, check=True, root=root, state="collected", keep=2)
    assert would["changed"] and would["removed"] == names[:3] and (tmp_path / names[0]).exists()
    done = run(capsys, root=root, state="collected", keep=2)
    assert done["removed"] == names[:3]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == names[3:]
    assert run(capsys, root=root, state="collected", keep=2)["changed"] is False


def test_a_version_that_is_not_there_is_refused(tmp_path, capsys):
    res = run(capsys, root=str(tmp_path), host="s1", version="f" * 16)
    assert res["failed"] and res["msg"].startswith(f"'{'f' * 16}' is not a draft version under {tmp_path}")
    res = run(capsys, root=str(tmp_path / "nope"), state="collected")
    assert res["failed"] and "does not exist: export a draft first" in res["msg"]


def test_check_mode_before_the_first_export_says_a_version_would_be_recorded(tmp_path, capsys):
    root = str(tmp_path / "drafts")
    assert run(capsys, check=True, root=root, host="s1", version="a" * 16)["changed"] is True
    assert run(capsys, check=True, root=root, state="collected")["changed"] is False
    assert not (tmp_path / "drafts").exists()
