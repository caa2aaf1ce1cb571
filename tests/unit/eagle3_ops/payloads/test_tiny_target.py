"""The lab target's builder: builders of one (shared) directory wait for each other, and a rebuild replaces the
target only once the new one is complete. The model's training itself is replaced by a stand-in that writes a file
and takes a second (the unit suite has no torch); the locking and the swap are the code under test."""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import pytest

from eagle3_ops.payloads.lab_target import tiny_target

CORPUS = str(Path(tiny_target.__file__).with_name("corpus.jsonl"))


@pytest.fixture
def builds(monkeypatch):
    """Each stand-in build: (start, end) monotonic times and the steps it was asked for."""
    done: list[tuple[float, float, int]] = []

    def make_target(tmp: str, args: argparse.Namespace) -> tuple[int, float]:
        start = time.monotonic()
        time.sleep(1.0)
        Path(tmp, "model.safetensors").write_text(f"steps={args.steps}")
        if args.steps < 0:
            raise RuntimeError("training diverged")
        done.append((start, time.monotonic(), args.steps))
        return 512, 0.5

    monkeypatch.setattr(tiny_target, "make_target", make_target)
    return done


def run(out: Path, *extra: str) -> int:
    return tiny_target.main(["--corpus", CORPUS, "--out", str(out), *extra])


def test_two_builders_of_one_directory_build_it_once(tmp_path, builds, capsys):
    out = tmp_path / "models" / "tiny-llama"
    codes: list[int] = []
    threads = [threading.Thread(target=lambda: codes.append(run(out, "--steps", "7"))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert codes == [0, 0]
    assert len(builds) == 1  # the second waited for the first and found its build
    printed = capsys.readouterr().out
    assert printed.count("built ") == 1 and printed.count("unchanged") == 1
    assert json.loads((out / tiny_target.MARKER).read_text())["steps"] == 7
    assert sorted(p.name for p in out.parent.iterdir()) == [".tiny-llama.lock", "tiny-llama"]  # nothing left over


def test_a_rebuild_replaces_the_target_only_when_complete(tmp_path, builds):
    out = tmp_path / "tiny-llama"
    assert run(out, "--steps", "7") == 0
    assert run(out, "--steps", "7") == 0 and len(builds) == 1  # same arguments: nothing to do
    with pytest.raises(RuntimeError, match="diverged"):
        run(out, "--steps", "-1")
    assert (out / "model.safetensors").read_text() == "steps=7"  # a failed rebuild left the target as it was
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-llama.lock", "tiny-llama"]
    assert run(out, "--steps", "9") == 0
    assert (out / "model.safetensors").read_text() == "steps=9"
    assert json.loads((out / tiny_target.MARKER).read_text())["steps"] == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == [".tiny-llama.lock", "tiny-llama"]
