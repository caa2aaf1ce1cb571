"""safetensors_remap and eagle3_export on shared storage: real processes racing on one checkpoint (orderings forced
with the codec's hold points), short writes, full disks, reserved names, modes and permissions."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.modules import ROOT, init_collection_loader, module_utils, run_module
from tests.unit.plugins.modules.test_eagle3_export import speculators_config
from tests.unit.plugins.modules.test_safetensors_remap import _small_mount, codec, drafter_tensors, remap_utils, sha

RULES = [("layers.0.", "midlayer.")]
LONG = [{"from": "layers.0.", "to": "a_much_longer_prefix_than_before_so_the_header_grows."}]

atomic_utils = module_utils("_atomic")

# A module run in a process of its own, printing its result as ansible's module runner would.
MODULE_SCRIPT = """
import json, os, sys
sys.path.insert(0, {root!r})
from tests.modules import init_collection_loader, load_module
from ansible.module_utils.testing import patch_module_args
init_collection_loader()
mod = load_module({name!r})
if {user!r}:  # everything is imported: now drop to that user, as a service account would run it
    os.setgroups([]); os.setgid({user!r}); os.setuid({user!r})
with patch_module_args(json.loads({args!r})):
    try:
        mod.main()
    except SystemExit:
        pass
"""


class Run:
    """One module run in its own process; ``hold`` stops it at a codec point until release()."""

    def __init__(self, name: str, args: dict, gate_dir: Path, hold: str | None = None, tag: str = "a",
                 crash: str | None = None) -> None:  # fmt: skip
        init_collection_loader()  # exports EAGLE3_TEST_COLLECTIONS for the child
        self.gate = gate_dir / f"gate-{tag}"
        env = {k: v for k, v in os.environ.items() if k not in ("EAGLE3_HOLD_AT", "EAGLE3_CRASH_AT")}
        if hold:
            env["EAGLE3_HOLD_AT"] = f"{hold}:{self.gate}"
        if crash:
            env["EAGLE3_CRASH_AT"] = crash
        script = MODULE_SCRIPT.format(root=str(ROOT), name=name, args=json.dumps(args), user=0)
        self.proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)  # fmt: skip

    def wait_reached(self, seconds: float = 30) -> None:
        deadline = time.monotonic() + seconds
        while not Path(f"{self.gate}.reached").exists():
            if self.proc.poll() is not None:
                raise AssertionError(f"the run ended before its hold point: {self.proc.stderr.read()}")
            assert time.monotonic() < deadline, "the run never reached its hold point"
            time.sleep(0.02)

    def release(self) -> None:
        self.gate.touch()

    def result(self, seconds: float = 60) -> dict:
        out, err = self.proc.communicate(timeout=seconds)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, f"no result (rc {self.proc.returncode}): {err}"
        return json.loads(lines[-1])


def data_section(path: Path) -> bytes:
    header = codec.read_header(str(path))
    return path.read_bytes()[header.data_start :]


def tensors_by_renamed(before: dict[str, np.ndarray], rules: list[tuple[str, str]]) -> dict[str, np.ndarray]:
    return {remap_utils.rename(k, rules): v for k, v in before.items()}


def assert_same_tensors(path: Path, expected: dict[str, np.ndarray]) -> None:
    after = load_file(str(path))
    assert sorted(after) == sorted(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(after[name], value)


@pytest.fixture
def ckpt(tmp_path: Path) -> Path:
    d = tmp_path / "share" / "draft"
    d.mkdir(parents=True)
    path = d / "model.safetensors"
    save_file(drafter_tensors(), str(path), metadata={"format": "pt"})
    return path


# -- two runs on one checkpoint -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("point", "args"),
    [
        ("journal-written", {}),  # the in-place path, first run between its journal and the header write
        ("header-half-written", {}),  # ... with half a new header on disk
        ("rewrite-data-copied", {"rules": LONG}),  # the rewrite path, its temporary complete but not renamed
        ("locked", {"drop": ["^t2d$"]}),  # the first run holds the lock and has read nothing yet
    ],
)
def test_a_second_run_waits_for_the_first_and_then_finds_nothing_to_do(ckpt, tmp_path, point, args):
    before = load_file(str(ckpt))
    rules = [(r["from"], r["to"]) for r in args.get("rules", [])] or RULES
    expected = {k: v for k, v in tensors_by_renamed(before, rules).items() if k != "t2d" or "drop" not in args}
    first = Run("safetensors_remap", {"path": str(ckpt), **args}, tmp_path, hold=point, tag="first")
    first.wait_reached()
    second = Run("safetensors_remap", {"path": str(ckpt), **args}, tmp_path, tag="second")
    time.sleep(1.0)
    assert second.proc.poll() is None, "the second run did not wait for the lock"
    first.release()
    one, two = first.result(), second.result()
    assert not one.get("failed") and not two.get("failed"), (one.get("msg"), two.get("msg"))
    assert one["changed"] is True
    assert two["changed"] is False and two["renames"] == [] and two["dropped"] == []
    assert_same_tensors(ckpt, expected)
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["model.safetensors"]  # no lock, journal, temporary


def test_a_run_that_cannot_get_the_lock_names_the_holder_and_changes_nothing(ckpt, tmp_path):
    digest = sha(ckpt)
    first = Run("safetensors_remap", {"path": str(ckpt)}, tmp_path, hold="locked", tag="first")
    first.wait_reached()
    second = Run("safetensors_remap", {"path": str(ckpt), "lock_timeout": 0.5}, tmp_path, tag="second")
    res = second.result()
    assert res["failed"] and res["changed"] is False
    assert f"by pid {first.proc.pid} on host " in res["msg"] and "holds the lock since " in res["msg"]
    assert "raise the lock timeout" in res["msg"]
    assert sha(ckpt) == digest
    first.release()
    assert first.result()["changed"] is True


def test_a_holder_killed_mid_write_hands_the_lock_over_and_the_next_run_recovers(ckpt, tmp_path):
    before = load_file(str(ckpt))
    first = Run("safetensors_remap", {"path": str(ckpt)}, tmp_path, tag="first", crash="header-half-written",
                hold="journal-written")  # fmt: skip
    first.wait_reached()
    second = Run("safetensors_remap", {"path": str(ckpt)}, tmp_path, tag="second")
    time.sleep(0.5)
    assert second.proc.poll() is None
    first.release()  # it goes on, writes half a header and is killed: the kernel drops its lock
    first.proc.wait(timeout=30)
    assert first.proc.returncode == -9
    res = second.result()
    assert not res.get("failed"), res.get("msg")
    assert res["files"][0]["recovered"] is True and res["changed"] is True
    assert_same_tensors(ckpt, tensors_by_renamed(before, RULES))
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["model.safetensors"]


def test_two_exports_into_one_shared_draft_are_serialised(tmp_path):
    epoch = tmp_path / "share" / "train" / "checkpoint_best"
    epoch.mkdir(parents=True)
    save_file(drafter_tensors(), str(epoch / "model.safetensors"), metadata={"format": "pt"})
    (epoch / "config.json").write_text(json.dumps(speculators_config()))
    dest = tmp_path / "share" / "draft"
    args = {"src": str(epoch), "dest": str(dest), "sglang_version": "0.5.23"}
    first = Run("eagle3_export", args, tmp_path, hold="rewrite-data-copied", tag="first")
    first.wait_reached()
    second = Run("eagle3_export", args, tmp_path, tag="second")
    time.sleep(1.0)
    assert second.proc.poll() is None, "the second export did not wait"
    first.release()
    one, two = first.result(), second.result()
    assert not one.get("failed") and not two.get("failed"), (one.get("msg"), two.get("msg"))
    assert one["changed"] is True and two["changed"] is False
    expected = {k: v for k, v in load_file(str(epoch / "model.safetensors")).items() if k != "t2d"}
    assert_same_tensors(dest / "model.safetensors", expected)
    assert sorted(p.name for p in dest.iterdir()) == ["config.json", "model.safetensors"]
    assert sorted(p.name for p in epoch.iterdir()) == ["config.json", "model.safetensors"]


def test_temporary_names_differ_for_one_pid_and_other_hosts_leftovers_are_stale(ckpt, monkeypatch):
    monkeypatch.setattr(os, "getpid", lambda: 4242)  # two containers on one share, the same PID at once
    names = {atomic_utils.temporary_path(str(ckpt)) for _ in range(50)}
    assert len(names) == 50 and all("-4242-" in n for n in names)
    monkeypatch.undo()
    other_host = ckpt.parent / f".{ckpt.name}.tmp-trainer2-{os.getpid()}-0123abcd"  # a killed run on another host
    other_host.write_bytes(b"\0" * 64)
    assert atomic_utils.stale_temporaries([str(ckpt)]) == [str(other_host)]


# -- short writes and full disks ----------------------------------------------------------------


def test_short_writes_are_continued_until_every_byte_is_written(ckpt, monkeypatch, capsys):
    before = load_file(str(ckpt))
    real = os.pwrite
    calls = []

    def short(fd: int, data, offset: int) -> int:
        calls.append(len(data))
        return real(fd, bytes(data[:7]), offset)  # a file system that writes 7 bytes a call

    monkeypatch.setattr(os, "pwrite", short)
    res = run_module("safetensors_remap", {"path": str(ckpt)}, capsys=capsys)
    monkeypatch.undo()
    assert not res.get("failed"), res.get("msg")
    assert len(calls) > 10
    assert_same_tensors(ckpt, tensors_by_renamed(before, RULES))


def test_a_write_that_makes_no_progress_fails_before_the_original_is_touched(ckpt, monkeypatch, capsys):
    digest = sha(ckpt)
    monkeypatch.setattr(os, "pwrite", lambda fd, data, offset: 0)
    res = run_module("safetensors_remap", {"path": str(ckpt)}, capsys=capsys)
    monkeypatch.undo()
    assert res["failed"] and "No space left on device" in res["msg"] and "the original is unchanged" in res["msg"]
    assert res["changed"] is False and sha(ckpt) == digest
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["model.safetensors"]


def _fill(mnt: Path, leave_pages: int) -> None:
    """Fill a tmpfs until only ``leave_pages`` pages are free."""
    filler = mnt / ".filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while os.write(fd, b"\0" * 4096) == 4096:
            pass
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    finally:
        os.close(fd)
    os.truncate(filler, max(0, filler.stat().st_size // 4096 * 4096 - 4096 * leave_pages))


def _wide_checkpoint(path: Path, tensors: int = 150, name_len: int = 60, tag: str = "") -> dict[str, np.ndarray]:
    """A checkpoint whose header is larger than a page (many long names), so its journal needs several."""
    t = {f"layers.0.{tag}{'w' * name_len}.{i}": np.full(2, i, np.float32) for i in range(tensors)}
    save_file(t, str(path))
    return t


def test_a_full_disk_while_the_journal_is_written_leaves_the_file_and_no_journal(tmp_path, capsys):
    mnt = _small_mount(tmp_path, "256k")
    try:
        target = mnt / "model.safetensors"
        _wide_checkpoint(target)
        assert codec.read_header(str(target)).header_len > 3 * 4096
        digest = sha(target)
        _fill(mnt, leave_pages=2)  # the lock's page and the journal's first page fit, the rest does not
        res = run_module("safetensors_remap", {"path": str(target)}, capsys=capsys)
        assert res["failed"] and "No space left on device" in res["msg"], res.get("msg")
        assert "the original is unchanged" in res["msg"] and res["changed"] is False
        assert sha(target) == digest
        assert sorted(p.name for p in mnt.iterdir()) == [".filler", "model.safetensors"]
        os.unlink(mnt / ".filler")
        again = run_module("safetensors_remap", {"path": str(target)}, capsys=capsys)
        assert again["changed"] is True and again["files"][0]["recovered"] is False
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_while_the_index_is_written_reports_the_shards_and_leaves_no_temporary(tmp_path, capsys):
    mnt = _small_mount(tmp_path, "256k")
    try:
        long = "model-" + "x" * 180  # long shard names make the index larger than either shard's header
        index = {"metadata": {}, "weight_map": {}}
        for n in (1, 2):
            shard = mnt / f"{long}-{n:05d}-of-00002.safetensors"
            names = _wide_checkpoint(shard, tensors=20, name_len=20, tag=f"s{n}")
            index["weight_map"].update({k: shard.name for k in names})
        (mnt / codec.INDEX_NAME).write_text(json.dumps(index))
        assert len(json.dumps(index, indent=2)) > 2 * 4096
        _fill(mnt, leave_pages=2)  # the lock and one shard's journal at a time fit, the index does not
        res = run_module("safetensors_remap", {"path": str(mnt)}, capsys=capsys)
        assert res["failed"] and "already rewritten" in res["msg"] and "still lists the old names" in res["msg"]
        assert res["changed"] is True  # the shards were rewritten, whatever the index did
        assert sorted(p.name for p in mnt.iterdir() if ".tmp-" in p.name or "journal" in p.name) == []
        os.unlink(mnt / ".filler")
        again = run_module("safetensors_remap", {"path": str(mnt)}, capsys=capsys)
        assert again["changed"] is True and not again["renames"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- reserved names, modes, permissions: one rule on both write paths ----------------------------


@pytest.mark.parametrize("args", [{}, {"drop": ["^t2d$"]}], ids=["in_place", "rewrite"])
def test_a_rename_onto_the_reserved_metadata_name_is_refused_on_both_paths(ckpt, capsys, args):
    digest = sha(ckpt)
    res = run_module("safetensors_remap", {"path": str(ckpt), "rules": [{"from": "norm.weight", "to": "__metadata__"}],
                                           **args}, capsys=capsys)  # fmt: skip
    assert res["failed"] and "reserved name '__metadata__'" in res["msg"] and res["changed"] is False
    assert sha(ckpt) == digest


def test_a_header_the_reader_would_refuse_is_never_written_on_either_path(ckpt):
    header = codec.read_header(str(ckpt))
    pl = remap_utils.plan(header, RULES, [])
    obj, _unused = remap_utils.build_header(pl, compact=False)
    obj["midlayer.mlp.up_proj.weight"]["data_offsets"][1] += 4  # a span that no longer matches its shape
    for new in (codec.encode_header(obj, pad_to=header.header_len), codec.encode_header(obj)):
        with pytest.raises(codec.SafetensorsError, match="would not load"):
            if len(new) == len(header.raw):
                remap_utils.write_in_place(header, new)
            else:
                remap_utils.write_rewrite(header, new, None)
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["model.safetensors"]


def test_written_files_get_the_mode_an_ordinary_write_gives(tmp_path, capsys):
    epoch = tmp_path / "checkpoint_best"
    epoch.mkdir()
    save_file(drafter_tensors(), str(epoch / "model.safetensors"))  # safetensors 0.8 writes 0600
    (epoch / "config.json").write_text(json.dumps(speculators_config()))
    assert (epoch / "model.safetensors").stat().st_mode & 0o777 == 0o600
    old = os.umask(0o022)
    try:
        dest = tmp_path / "draft"
        res = run_module("eagle3_export", {"src": str(epoch), "dest": str(dest), "sglang_version": "0.5.23"},
                         capsys=capsys)  # fmt: skip
        assert res["changed"], res.get("msg")
        assert {p.name: p.stat().st_mode & 0o777 for p in dest.iterdir()} == {
            "model.safetensors": 0o644, "config.json": 0o644}  # fmt: skip
        # A replaced file keeps the mode its owner gave it, on the rewrite path and for the index.
        own = tmp_path / "own.safetensors"
        save_file(drafter_tensors(), str(own))
        own.chmod(0o640)
        run_module("safetensors_remap", {"path": str(own), "drop": ["^t2d$"]}, capsys=capsys)
        assert own.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a module as another user")
@pytest.mark.parametrize("args", [{}, {"drop": ["^t2d$"]}], ids=["in_place", "rewrite"])
def test_a_file_the_user_cannot_write_is_refused_on_both_paths(args):
    shared = Path(tempfile.mkdtemp(prefix="eagle3-perm-"))
    home = Path(tempfile.mkdtemp(prefix="eagle3-home-"))
    try:
        shared.chmod(0o777)  # a directory the user may write, holding a file it may only read
        target = shared / "model.safetensors"
        save_file(drafter_tensors(), str(target))
        target.chmod(0o644)
        digest = sha(target)
        init_collection_loader()
        script = MODULE_SCRIPT.format(root=str(ROOT), name="safetensors_remap",
                                      args=json.dumps({"path": str(target), **args}), user=65534)  # fmt: skip
        home.chmod(0o777)
        env = {**os.environ, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1"}
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60,
                              cwd=str(shared))  # fmt: skip
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        assert lines, proc.stderr
        res = json.loads(lines[-1])
        assert res["failed"] and "is not writable by this user (mode 0644, owner uid 0)" in res["msg"], res["msg"]
        assert res["changed"] is False
        assert sha(target) == digest and target.stat().st_uid == 0
        assert sorted(p.name for p in shared.iterdir()) == ["model.safetensors"]
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


def test_a_failed_export_says_what_reached_the_disk(tmp_path, capsys, monkeypatch):
    epoch = tmp_path / "checkpoint_best"
    epoch.mkdir()
    save_file(drafter_tensors(), str(epoch / "model.safetensors"))
    (epoch / "config.json").write_text(json.dumps(speculators_config()))
    args = {"src": str(epoch), "dest": str(tmp_path / "draft"), "sglang_version": "0.5.23"}
    run_module("eagle3_export", {**args, "dest": str(tmp_path / "warm")}, capsys=capsys)  # loads the module
    # Every room that writes (whole files, header rewrites) fills the disk alike.
    writers = [sys.modules[f"ansible_collections.eagle3.ops.plugins.module_utils.{m}"]
               for m in ("_atomic", "_journal", "_remap")]  # fmt: skip
    real = writers[0].write_all

    def full_after(limit: int):
        calls = []

        def write_all(fd: int, data: bytes, offset: int) -> None:
            calls.append(len(data))
            if len(calls) > limit:
                raise OSError(errno.ENOSPC, "No space left on device")
            real(fd, data, offset)

        return write_all

    # Full before the weights: nothing reached the disk, and no directory is left behind.
    full = full_after(2)  # the two locks' notes fit, the weights do not
    for mod in writers:
        monkeypatch.setattr(mod, "write_all", full)
    res = run_module("eagle3_export", args, capsys=capsys)
    assert res["failed"] and res["changed"] is False and "nothing was changed" in res["msg"], res["msg"]
    assert not (tmp_path / "draft").exists()
    # Full after the weights: the weights changed on disk, so the run says so; a rerun converges.
    full = full_after(3)  # ... and the weights' header, not the config
    for mod in writers:
        monkeypatch.setattr(mod, "write_all", full)
    res = run_module("eagle3_export", args, capsys=capsys)
    assert res["failed"] and res["changed"] is True and "part of the draft was written" in res["msg"], res["msg"]
    assert sorted(p.name for p in (tmp_path / "draft").iterdir()) == ["model.safetensors"]
    monkeypatch.undo()
    again = run_module("eagle3_export", args, capsys=capsys)
    assert again["changed"] is True and not again.get("failed")
    assert sorted(p.name for p in (tmp_path / "draft").iterdir()) == ["config.json", "model.safetensors"]
