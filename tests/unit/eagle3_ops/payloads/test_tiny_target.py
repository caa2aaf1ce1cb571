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


@pytest.fixture
def cache(tmp_path) -> Path:
    """The machine's build cache (the directory the lab mounts in every container)."""
    path = tmp_path / "cache"
    path.mkdir()
    return path


def entry_of_a_first_build(tmp_path: Path, cache: Path) -> Path:
    """Build once with --cache and return the entry that build kept."""
    assert run(tmp_path / "a" / "tiny-llama", "--steps", "7", "--cache", str(cache)) == 0
    [key] = entries(cache)
    return cache / tiny_target.CACHE_KIND / key


def entries(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / tiny_target.CACHE_KIND).iterdir() if not p.name.startswith("."))


def test_a_build_is_kept_in_the_cache_and_another_lab_copies_it(tmp_path, cache, builds, capsys):
    first, second = tmp_path / "lab1" / "tiny-llama", tmp_path / "lab2" / "tiny-llama"
    assert run(first, "--steps", "7", "--cache", str(cache)) == 0
    assert len(builds) == 1 and "built " in capsys.readouterr().out
    [key] = entries(cache)
    assert len(key) == 32 and (cache / tiny_target.CACHE_KIND / key / "model.safetensors").read_text() == "steps=7"
    # Another lab's storage, same inputs: copied, not trained; its own marker; nothing left over anywhere.
    assert run(second, "--steps", "7", "--cache", str(cache)) == 0
    assert len(builds) == 1 and "copied " in capsys.readouterr().out
    assert (second / "model.safetensors").read_text() == "steps=7"
    assert json.loads((second / tiny_target.MARKER).read_text()) == json.loads((first / tiny_target.MARKER).read_text())
    assert sorted(p.name for p in second.parent.iterdir()) == [".tiny-llama.lock", "tiny-llama"]
    assert entries(cache) == [key]
    # The cache is not part of what the target is: the same build without it is "unchanged".
    assert run(second, "--steps", "7") == 0 and "unchanged" in capsys.readouterr().out
    # Other inputs are another entry, built.
    assert run(second, "--steps", "8", "--cache", str(cache)) == 0
    assert len(builds) == 2 and len(entries(cache)) == 2


def test_the_cache_keeps_the_newest_entries(tmp_path, cache, builds):
    for steps in range(1, tiny_target.CACHE_KEEP + 3):
        assert run(tmp_path / "tiny-llama", "--steps", str(steps), "--cache", str(cache)) == 0
    assert len(entries(cache)) == tiny_target.CACHE_KEEP
    kept = {(cache / tiny_target.CACHE_KIND / e / "model.safetensors").read_text() for e in entries(cache)}
    assert kept == {f"steps={s}" for s in range(3, tiny_target.CACHE_KEEP + 3)}  # the two oldest went


def test_a_cache_that_is_missing_or_cannot_be_written_only_costs_the_build(tmp_path, builds, capsys):
    assert run(tmp_path / "a" / "tiny-llama", "--steps", "7", "--cache", str(tmp_path / "nowhere")) == 0
    assert not (tmp_path / "nowhere").exists() and "no build cache at" in capsys.readouterr().err
    blocked = tmp_path / "blocked"
    blocked.mkdir()
    (blocked / tiny_target.CACHE_KIND).write_text("not a directory")  # where the entries would go
    assert run(tmp_path / "b" / "tiny-llama", "--steps", "7", "--cache", str(blocked)) == 0
    assert "was not kept in the cache" in capsys.readouterr().err
    assert (tmp_path / "b" / "tiny-llama" / "model.safetensors").read_text() == "steps=7"
    assert len(builds) == 2


def test_a_failed_build_keeps_nothing_in_the_cache(tmp_path, cache, builds):
    with pytest.raises(RuntimeError, match="diverged"):
        run(tmp_path / "tiny-llama", "--steps", "-1", "--cache", str(cache))
    assert not (cache / tiny_target.CACHE_KIND).exists() or entries(cache) == []
    assert not (tmp_path / "tiny-llama").exists()


def test_two_labs_building_at_once_build_once(tmp_path, cache, builds, capsys):
    codes: list[int] = []
    outs = [tmp_path / f"lab{i}" / "tiny-llama" for i in range(2)]
    threads = [threading.Thread(target=lambda o=o: codes.append(run(o, "--steps", "7", "--cache", str(cache))))
               for o in outs]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    # Two labs' storage (two locks there), one machine: the second waited on the cache entry's lock and copied.
    assert codes == [0, 0] and len(builds) == 1
    printed = capsys.readouterr().out
    assert printed.count("built ") == 1 and printed.count("copied ") == 1
    assert all((o / "model.safetensors").read_text() == "steps=7" for o in outs)
    [key] = entries(cache)
    assert sorted(p.name for p in (cache / tiny_target.CACHE_KIND).iterdir()) == [f".{key}.lock", key]


def test_an_entry_another_builder_put_there_first_stays(tmp_path, cache, builds, monkeypatch):
    entry = entry_of_a_first_build(tmp_path, cache)
    (entry / "model.safetensors").write_text("theirs")
    monkeypatch.setattr(tiny_target, "from_cache", lambda entry, tmp: False)  # as if it appeared during our build
    assert run(tmp_path / "b" / "tiny-llama", "--steps", "7", "--cache", str(cache)) == 0
    assert (entry / "model.safetensors").read_text() == "theirs" and entries(cache) == [entry.name]
    assert [p.name for p in (cache / tiny_target.CACHE_KIND).iterdir() if p.name.startswith(".part")] == []


def test_an_incomplete_entry_is_rebuilt_and_replaced(tmp_path, cache, builds, capsys):
    entry = entry_of_a_first_build(tmp_path, cache)
    (entry / tiny_target.MARKER).unlink()  # as if someone removed part of it by hand
    assert run(tmp_path / "b" / "tiny-llama", "--steps", "7", "--cache", str(cache)) == 0
    assert len(builds) == 2 and (entry / tiny_target.MARKER).is_file() and entries(cache) == [entry.name]
    assert "not kept" not in capsys.readouterr().err
