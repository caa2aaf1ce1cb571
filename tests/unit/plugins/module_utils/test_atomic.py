"""module_utils/_atomic.py: a file written complete or not at all - the temporary removed on every error, the mode
of the file it replaces kept, and a killed run's temporary found as stale."""

from __future__ import annotations

import json
import os
import stat

import pytest

from tests.modules import module_utils

atomic = module_utils("_atomic")


def test_json_and_lines_are_written_whole_and_keep_the_replaced_file_s_mode(tmp_path):
    target = tmp_path / "state.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    atomic.write_json_atomic(str(target), {"epoch": 3})
    assert json.loads(target.read_text()) == {"epoch": 3}
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640
    rows = tmp_path / "rows.jsonl"
    assert atomic.write_lines_atomic(str(rows), (f"{i}\n" for i in range(3))) == 6
    assert rows.read_text() == "0\n1\n2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "state.json"]


def test_an_error_while_the_lines_are_produced_leaves_the_file_as_it_was_and_no_temporary(tmp_path):
    target = tmp_path / "rows.jsonl"
    target.write_text("kept\n")

    def lines():
        yield "new\n"
        raise RuntimeError("the producer failed")

    with pytest.raises(RuntimeError, match="the producer failed"):
        atomic.write_lines_atomic(str(target), lines())
    assert target.read_text() == "kept\n"
    assert [p.name for p in tmp_path.iterdir()] == ["rows.jsonl"]


def test_a_copy_is_whole_and_temporaries_are_named_by_host_and_pid(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))  # more than one chunk
    atomic.copy_file_atomic(str(src), str(tmp_path / "dest.bin"))
    assert (tmp_path / "dest.bin").read_bytes() == src.read_bytes()
    name = os.path.basename(atomic.temporary_path(str(tmp_path / "dest.bin")))
    assert name.startswith(".dest.bin.tmp-") and f"-{os.getpid()}-" in name


def test_a_killed_run_s_temporary_is_stale_and_a_live_one_is_not_without_the_lock(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"x")
    dead = tmp_path / ".model.safetensors.tmp-999999999"  # an earlier version's name, a PID that does not run
    live = tmp_path / f".model.safetensors.tmp-{atomic.host_tag()}-{os.getpid()}-0123abcd"
    dead.write_bytes(b"")
    live.write_bytes(b"")
    assert atomic.stale_temporaries([str(target)], locked=False) == [str(dead)]
    assert sorted(atomic.stale_temporaries([str(target)], locked=True)) == sorted([str(dead), str(live)])
