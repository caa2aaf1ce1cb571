"""The prompts the regeneration reads: on a fleet every shard host normalises them into the one shared data
directory at the same time, so each write must be a whole file of its own renamed into place."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle3_ops.payloads.training import prompts
from tests.modules import ROOT

PAYLOADS = ROOT / "eagle3_ops" / "payloads"


def source(path: Path, rows: int) -> Path:
    path.write_text("".join(json.dumps({"id": f"p{n:05d}", "prompt": f"question {n} " + "x" * 200}) + "\n"
                            for n in range(rows)))  # fmt: skip
    return path


def test_writers_on_several_hosts_leave_one_whole_file(tmp_path):
    src = source(tmp_path / "source.jsonl", 20000)
    out = tmp_path / "shared" / "prompts.jsonl"
    out.parent.mkdir()
    # Processes, as the shard hosts are: each normalises the same source into the same shared file at once.
    procs = [subprocess.Popen([sys.executable, "-m", "training.prompts", "--source", str(src), "--out", str(out)],
                              cwd=PAYLOADS, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(4)]  # fmt: skip
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0, 0], results
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert ids == [f"p{n:05d}" for n in range(20000)]  # one writer's whole output, nothing interleaved
    assert [p.name for p in out.parent.iterdir()] == ["prompts.jsonl"]  # no temporary left


def test_a_failed_normalisation_keeps_the_file_it_would_replace(tmp_path):
    out = tmp_path / "prompts.jsonl"
    assert prompts.main(["--source", str(source(tmp_path / "good.jsonl", 3)), "--out", str(out)]) == 0
    before = out.read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "prompt": "one"}\n{"id": "a", "prompt": "two"}\n')
    with pytest.raises(SystemExit, match="repeats id 'a'"):
        prompts.main(["--source", str(bad), "--out", str(out)])
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "a", "other": 1}\n')
    with pytest.raises(SystemExit, match="has no usable prompts"):
        prompts.main(["--source", str(empty), "--out", str(out)])
    assert out.read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "empty.jsonl", "good.jsonl", "prompts.jsonl"]
