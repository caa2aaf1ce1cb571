"""safetensors_remap on real files written and read back by the safetensors library."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from tests.modules import (
    ROOT,
    load_module,
    module_utils,  # the codec's rooms by their collection name, as the modules import them
    run_module,
)

codec = module_utils("_safetensors")
remap_utils = module_utils("_remap")

H = 16  # hidden size of the tiny drafter


def drafter_tensors() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    t = {
        "layers.0.self_attn.q_proj.weight": rng.standard_normal((H, 2 * H), dtype=np.float32),
        "layers.0.self_attn.k_proj.weight": rng.standard_normal((H // 2, 2 * H), dtype=np.float32),
        "layers.0.self_attn.v_proj.weight": rng.standard_normal((H // 2, 2 * H), dtype=np.float32),
        "layers.0.self_attn.o_proj.weight": rng.standard_normal((H, H), dtype=np.float32),
        "layers.0.input_layernorm.weight": np.ones(H, dtype=np.float32),
        "layers.0.hidden_norm.weight": np.ones(H, dtype=np.float32),
        "layers.0.post_attention_layernorm.weight": np.ones(H, dtype=np.float32),
        "layers.0.mlp.gate_proj.weight": rng.standard_normal((32, H), dtype=np.float32),
        "layers.0.mlp.up_proj.weight": rng.standard_normal((32, H), dtype=np.float32),
        "layers.0.mlp.down_proj.weight": rng.standard_normal((H, 32), dtype=np.float32),
        "fc.weight": rng.standard_normal((H, 3 * H), dtype=np.float32),
        "norm.weight": np.ones(H, dtype=np.float32),
        "lm_head.weight": rng.standard_normal((24, H), dtype=np.float32),
        "d2t": np.arange(24, dtype=np.int64),
        "t2d": np.ones(64, dtype=np.bool_),
    }
    return t


@pytest.fixture
def ckpt(tmp_path) -> Path:
    path = tmp_path / "model.safetensors"
    save_file(drafter_tensors(), str(path), metadata={"format": "pt", "trained_by": "speculators"})
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def remap(capsys, check=False, diff=False, **args):
    return run_module("safetensors_remap", args, check=check, diff=diff, capsys=capsys)


def test_in_place_rename_loads_with_safetensors(ckpt, capsys):
    before = load_file(str(ckpt))
    size = ckpt.stat().st_size
    res = remap(capsys, path=str(ckpt))
    assert res["changed"] is True and res["files"][0]["method"] == "in_place"
    assert res["files"][0]["renamed"] == 10
    after = load_file(str(ckpt))
    assert sorted(after) == sorted(remap_utils.rename(k, [("layers.0.", "midlayer.")]) for k in before)
    for old, new in res["renames"]:
        np.testing.assert_array_equal(before[old], after[new])
    assert ckpt.stat().st_size == size
    with safe_open(str(ckpt), "np") as f:
        assert f.metadata() == {"format": "pt", "trained_by": "speculators"}
    assert not (ckpt.parent / f".{ckpt.name}.remap-journal").exists()


def test_second_run_changes_nothing(ckpt, capsys):
    remap(capsys, path=str(ckpt))
    digest = sha(ckpt)
    res = remap(capsys, path=str(ckpt))
    assert res["changed"] is False and res["renames"] == [] and res["files"][0]["method"] == "none"
    assert sha(ckpt) == digest


def test_check_and_diff_mode_change_nothing(ckpt, capsys):
    digest = sha(ckpt)
    res = remap(capsys, check=True, diff=True, path=str(ckpt))
    assert res["changed"] is True
    assert "layers.0.mlp.up_proj.weight" in res["diff"]["before"]
    assert "midlayer.mlp.up_proj.weight" in res["diff"]["after"]
    assert sha(ckpt) == digest


def test_drop_compacts_the_data_section(ckpt, capsys):
    before = load_file(str(ckpt))
    res = remap(capsys, path=str(ckpt), drop=["^t2d$"])
    assert res["dropped"] == ["t2d"] and res["files"][0]["method"] == "rewrite"
    after = load_file(str(ckpt))
    assert "t2d" not in after and "midlayer.mlp.up_proj.weight" in after
    np.testing.assert_array_equal(after["fc.weight"], before["fc.weight"])
    assert ckpt.stat().st_size < sum(a.nbytes for a in before.values()) + 2000


def test_longer_names_take_the_rewrite_path(ckpt, capsys):
    before = load_file(str(ckpt))
    res = remap(capsys, path=str(ckpt), rules=[{"from": "layers.0.", "to": "a_much_longer_prefix_for_the_layer." * 8}])
    assert res["files"][0]["method"] == "rewrite"
    after = load_file(str(ckpt))
    assert len(after) == len(before)
    assert not [p for p in ckpt.parent.iterdir() if ".tmp-" in p.name]


def test_require_reports_missing_names_before_writing(ckpt, capsys):
    digest = sha(ckpt)
    res = remap(capsys, path=str(ckpt), require=["midlayer.self_attn.q_proj.weight", "embed_tokens.weight"])
    assert res["failed"] and "lacks the required tensors embed_tokens.weight" in res["msg"]
    assert sha(ckpt) == digest


def test_sharded_checkpoint_and_index(tmp_path, capsys):
    tensors = drafter_tensors()
    names = sorted(tensors)
    shard_a = {k: tensors[k] for k in names[: len(names) // 2]}
    shard_b = {k: tensors[k] for k in names[len(names) // 2 :]}
    save_file(shard_a, str(tmp_path / "model-00001-of-00002.safetensors"))
    save_file(shard_b, str(tmp_path / "model-00002-of-00002.safetensors"))
    index = {"metadata": {"total_size": 1}, "weight_map": {k: "model-00001-of-00002.safetensors" for k in shard_a}}
    index["weight_map"].update({k: "model-00002-of-00002.safetensors" for k in shard_b})
    (tmp_path / codec.INDEX_NAME).write_text(json.dumps(index))
    res = remap(capsys, path=str(tmp_path))
    assert res["changed"] and res["index"].endswith(codec.INDEX_NAME)
    new_index = json.loads((tmp_path / codec.INDEX_NAME).read_text())
    assert new_index["metadata"] == {"total_size": 1}
    for name, shard in new_index["weight_map"].items():
        with safe_open(str(tmp_path / shard), "np") as f:
            assert name in f.keys()  # noqa: SIM118 -- safe_open is not a mapping
    assert "midlayer.mlp.up_proj.weight" in new_index["weight_map"]
    assert remap(capsys, path=str(tmp_path))["changed"] is False


def test_duplicate_names_after_renaming_are_refused(tmp_path, capsys):
    path = tmp_path / "dup.safetensors"
    save_file({"layers.0.x": np.zeros(2, np.float32), "midlayer.x": np.ones(2, np.float32)}, str(path))
    digest = sha(path)
    res = remap(capsys, path=str(path))
    assert res["failed"] and "would give two tensors the name 'midlayer.x'" in res["msg"]
    assert sha(path) == digest


# -- the bad-input corpus: each gives one clear sentence and leaves the file byte-identical ------


def _raw(header: object, data: bytes = b"", declared: int | None = None, pad: bool = True) -> bytes:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    if pad:
        body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body) if declared is None else declared) + body + data


def _good_bytes() -> bytes:
    return _raw({"layers.0.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8)


BAD = {
    "truncated": (_good_bytes()[:-3], "ends at byte 8 past the data section"),
    "header-past-eof": (_raw({}, declared=4096), "does not fit in the"),
    "malformed-json": (_raw(b'{"a": {"dtype": "F32",'), "is not valid JSON"),
    "overlap": (
        _raw(
            {
                "layers.0.a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "layers.0.b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
        ),
        "tensors 'layers.0.a' [0, 8] and 'layers.0.b' [4, 8] overlap",
    ),
    "gap": (
        _raw({"layers.0.a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
        "has a gap at bytes 0..4 that no tensor covers",
    ),
    # One tensor's offsets point into another: name it (not the intact tensor before it) and where it fits.
    "moved-into-a-neighbour": (
        _raw(
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
                "c": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 24,
        ),
        "tensor 'c' [4, 12] overlaps tensor 'a' [0, 8]; its 8 bytes fit the gap at 16..24",
    ),
    # The first tensor moved past its neighbour: the gap it left comes first, the fault is still its own.
    "moved-past-a-neighbour": (
        _raw(
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]},
                "c": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]},
            },
            b"\0" * 24,
        ),
        "tensor 'a' [12, 20] overlaps tensor 'b' [8, 16]; its 8 bytes fit the gap at 0..8",
    ),
    "empty-header": (struct.pack("<Q", 0) + b"\0" * 8, "its header is empty (declared length 0)"),
    "unknown-dtype": (
        _raw({"layers.0.a": {"dtype": "F12", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
        "unknown dtype 'F12'",
    ),
    "wrong-span": (
        _raw({"layers.0.a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8),
        "spans 8 bytes where F32 [3] needs 12",
    ),
    "duplicate-in-header": (
        _raw(
            b'{"layers.0.a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},'
            b'"layers.0.a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}',
            b"\0\0",
        ),
        "the name 'layers.0.a' appears twice",
    ),
    "not-safetensors": (b"PK\x03\x04 this is a zip file, not a checkpoint" * 3, "does not fit in the"),
    "header-longer-than-file": (struct.pack("<Q", 100_000_001) + b"{}" + b" " * 6, "does not fit in the 16-byte"),
    "tiny-file": (b"\x01\x02", "shorter than the 8-byte header length"),
    "not-an-object": (_raw(b"[1, 2, 3]"), "does not start with '{'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_inputs_fail_clearly_and_change_nothing(tmp_path, capsys, case):
    content, needle = BAD[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    res = remap(capsys, path=str(path))
    assert res.get("failed"), res
    assert needle in res["msg"], res["msg"]
    assert res["msg"].count(". ") == 0 and "\n" not in res["msg"]  # one sentence
    assert path.read_bytes() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.safetensors"]


@pytest.mark.parametrize("dtype", sorted(codec.DTYPE_BITS))
def test_every_dtype_of_the_format_is_accepted_with_its_element_size(tmp_path, capsys, dtype):
    # 8 elements: a whole number of bytes for every dtype, 4-bit and 6-bit ones included.
    size = 8 * codec.DTYPE_BITS[dtype] // 8
    path = tmp_path / "w.safetensors"
    path.write_bytes(_raw({"layers.0.w": {"dtype": dtype, "shape": [8], "data_offsets": [0, size]}}, b"\1" * size))
    res = remap(capsys, path=str(path))
    assert res["changed"] and res["renames"] == [["layers.0.w", "midlayer.w"]], res
    assert codec.read_header(str(path)).tensors[0].dtype == dtype


def test_the_fnuz_float8_dtypes_are_one_byte_each():
    assert codec.DTYPE_BITS["F8_E4M3FNUZ"] == codec.DTYPE_BITS["F8_E5M2FNUZ"] == 8
    assert len(codec.DTYPE_BITS) == 22  # every dtype safetensors 0.8 defines


def test_a_declared_header_over_100mb_is_refused_unread(tmp_path, capsys):
    # A sparse 120 MB file whose first 8 bytes declare a 110 MB header: refused before reading it.
    path = tmp_path / "big-header.safetensors"
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", 110_000_000) + b"{")
        fh.truncate(120_000_000)
    digest = sha(path)
    res = remap(capsys, path=str(path))
    assert res["failed"] and "its declared header length 110000000 exceeds the 100000000-byte limit" in res["msg"]
    assert sha(path) == digest


def _small_mount(tmp_path: Path, size: str) -> Path:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    return mnt


def test_read_only_directory(tmp_path, capsys, ckpt):
    mnt = _small_mount(tmp_path, "8m")
    try:
        target = mnt / "model.safetensors"
        target.write_bytes(ckpt.read_bytes())
        digest = sha(target)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        res = remap(capsys, path=str(target))
        assert res["failed"] and "read-only file system" in res["msg"] and "nothing was changed" in res["msg"]
        assert res["changed"] is False
        assert sha(target) == digest
        # A converged checkpoint on a read-only mount (a server's view of the share) needs no lock: nothing to do.
        subprocess.run(["mount", "-o", "remount,rw", str(mnt)], check=True)
        remap(capsys, path=str(target))
        digest = sha(target)
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        again = remap(capsys, path=str(target))
        assert not again.get("failed"), again.get("msg")
        assert again["changed"] is False and sha(target) == digest
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_during_the_rewrite_path(tmp_path, capsys):
    mnt = _small_mount(tmp_path, "1m")
    try:
        target = mnt / "model.safetensors"
        save_file({"layers.0.w": np.ones(150_000, np.float32)}, str(target))  # 600 kB: no room for a copy
        digest = sha(target)
        res = remap(capsys, path=str(target), drop=["^nothing$"], rules=[{"from": "layers.0.", "to": "x" * 40}])
        assert res["failed"] and "No space left on device" in res["msg"]
        assert sha(target) == digest
        assert [p.name for p in mnt.iterdir()] == ["model.safetensors"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


# -- crash safety: the module process is killed at injected points -----------------------------

CRASH_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from tests.modules import init_collection_loader, run_module
init_collection_loader()
run_module("safetensors_remap", {{"path": {path!r}}})
"""


@pytest.mark.parametrize("point", ["journal-written", "header-half-written", "header-written"])
def test_killed_in_place_rewrite_recovers(ckpt, capsys, point):
    original = ckpt.read_bytes()
    before = load_file(str(ckpt))
    env = {**os.environ, "EAGLE3_CRASH_AT": point}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT.format(root=str(ROOT), path=str(ckpt))], env=env, capture_output=True
    )
    assert proc.returncode == -9, proc.stderr
    journal = ckpt.parent / f".{ckpt.name}.remap-journal"
    assert journal.exists()
    # Whatever state the kill left, the next run restores from the journal and completes.
    res = remap(capsys, path=str(ckpt))
    assert res["changed"] and res["files"][0]["recovered"] is True
    assert not journal.exists()
    after = load_file(str(ckpt))
    assert sorted(after) == sorted(remap_utils.rename(k, [("layers.0.", "midlayer.")]) for k in before)
    assert len(ckpt.read_bytes()) == len(original)


def test_killed_rewrite_leaves_the_original(ckpt, capsys):
    digest = sha(ckpt)
    env = {**os.environ, "EAGLE3_CRASH_AT": "rewrite-data-copied"}
    script = CRASH_SCRIPT.replace('{{"path": {path!r}}}', '{{"path": {path!r}, "drop": ["^t2d$"]}}')
    proc = subprocess.run(
        [sys.executable, "-c", script.format(root=str(ROOT), path=str(ckpt))], env=env, capture_output=True
    )
    assert proc.returncode == -9
    assert sha(ckpt) == digest
    load_file(str(ckpt))


def test_module_documentation_parses():
    import yaml

    mod = load_module("safetensors_remap")
    doc = yaml.safe_load(mod.DOCUMENTATION)
    assert doc["module"] == "safetensors_remap"
    yaml.safe_load(mod.EXAMPLES)
    yaml.safe_load(mod.RETURN)


# -- adversarial trials: interrupted runs, leftovers, links -------------------------------------


def _sharded(tmp_path: Path) -> tuple[Path, Path]:
    tensors = drafter_tensors()
    names = sorted(tensors)
    shard_a = tmp_path / "model-00001-of-00002.safetensors"
    shard_b = tmp_path / "model-00002-of-00002.safetensors"
    save_file({k: tensors[k] for k in names[: len(names) // 2]}, str(shard_a))
    save_file({k: tensors[k] for k in names[len(names) // 2 :]}, str(shard_b))
    index = {"metadata": {"total_size": 1}, "weight_map": {}}
    for shard in (shard_a, shard_b):
        with safe_open(str(shard), "np") as f:
            index["weight_map"].update({k: shard.name for k in f.keys()})  # noqa: SIM118
    (tmp_path / codec.INDEX_NAME).write_text(json.dumps(index))
    return shard_a, shard_b


def _index_matches_shards(directory: Path) -> None:
    weight_map = json.loads((directory / codec.INDEX_NAME).read_text())["weight_map"]
    held = {}
    for shard in sorted(directory.glob("*.safetensors")):
        with safe_open(str(shard), "np") as f:
            held.update({k: shard.name for k in f.keys()})  # noqa: SIM118
    assert weight_map == held


def test_an_index_left_behind_by_an_earlier_run_converges(tmp_path, capsys):
    shard_a, _ = _sharded(tmp_path)
    # An earlier run renamed one shard on its own (or died before writing the index).
    assert remap(capsys, path=str(shard_a))["changed"]
    res = remap(capsys, path=str(tmp_path))
    assert res["changed"] and res["index_changes"]["renamed"] == 10
    _index_matches_shards(tmp_path)
    assert remap(capsys, path=str(tmp_path))["changed"] is False


def test_an_index_listing_names_no_shard_holds_is_repaired(tmp_path, capsys):
    _sharded(tmp_path)
    index = json.loads((tmp_path / codec.INDEX_NAME).read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    del index["weight_map"]["fc.weight"]
    (tmp_path / codec.INDEX_NAME).write_text(json.dumps(index))
    res = remap(capsys, path=str(tmp_path))
    assert res["index_changes"]["removed"] == ["ghost.weight"] and res["index_changes"]["added"] == ["fc.weight"]
    _index_matches_shards(tmp_path)


def test_check_mode_predicts_the_index_repair(tmp_path, capsys):
    shard_a, _ = _sharded(tmp_path)
    remap(capsys, path=str(shard_a))
    before = (tmp_path / codec.INDEX_NAME).read_bytes()
    res = remap(capsys, check=True, path=str(tmp_path))
    assert res["changed"] is True and res["index_changes"]["renamed"] == 10
    assert (tmp_path / codec.INDEX_NAME).read_bytes() == before


def test_a_failed_index_write_says_which_shards_were_rewritten(tmp_path, capsys, monkeypatch):
    import errno

    shard_a, shard_b = _sharded(tmp_path)
    load_module("safetensors_remap")  # registers the writers under their ansible.module_utils names
    atomic_mod = sys.modules["ansible_collections.eagle3.ops.plugins.module_utils._atomic"]

    def no_space(path, obj):
        raise OSError(errno.ENOSPC, "No space left on device", path)

    monkeypatch.setattr(atomic_mod, "write_json_atomic", no_space)
    res = remap(capsys, path=str(tmp_path))
    assert res["failed"] and "the original is unchanged" not in res["msg"]
    assert f"already rewritten: {shard_a}, {shard_b}" in res["msg"]
    assert "still lists the old names" in res["msg"]
    monkeypatch.undo()
    again = remap(capsys, path=str(tmp_path))
    assert again["changed"] and not again["renames"]  # only the index was left to converge
    _index_matches_shards(tmp_path)


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_stale_temporaries_of_killed_runs_are_removed_and_reported(ckpt, capsys):
    dead = ckpt.parent / f".{ckpt.name}.tmp-{_dead_pid()}"
    dead.write_bytes(b"\0" * 4096)
    live = ckpt.parent / f".{ckpt.name}.tmp-{os.getppid()}"  # a writer that still runs: not ours to remove
    live.write_bytes(b"\0")
    other = ckpt.parent / f".unrelated.safetensors.tmp-{_dead_pid()}"
    other.write_bytes(b"\0")
    checked = remap(capsys, check=True, path=str(ckpt))
    assert checked["removed_temporaries"] == [str(dead)] and dead.exists()
    res = remap(capsys, path=str(ckpt))
    assert res["removed_temporaries"] == [str(dead)]
    assert not dead.exists() and live.exists() and other.exists()


def test_a_rewrite_killed_mid_copy_is_cleaned_up_by_the_next_run(ckpt, capsys):
    env = {**os.environ, "EAGLE3_CRASH_AT": "rewrite-data-copied"}
    script = CRASH_SCRIPT.replace('{{"path": {path!r}}}', '{{"path": {path!r}, "drop": ["^t2d$"]}}')
    proc = subprocess.run(
        [sys.executable, "-c", script.format(root=str(ROOT), path=str(ckpt))], env=env, capture_output=True
    )
    assert proc.returncode == -9
    leftovers = list(ckpt.parent.glob(f".{ckpt.name}.tmp-*"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0
    res = remap(capsys, path=str(ckpt), drop=["^t2d$"])
    assert res["removed_temporaries"] == [str(leftovers[0])] and res["dropped"] == ["t2d"]
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [ckpt.name]


def test_a_failed_in_place_write_leaves_no_journal(ckpt, capsys):
    digest = sha(ckpt)
    if subprocess.run(["chattr", "+i", str(ckpt)], capture_output=True).returncode != 0:
        pytest.skip("this filesystem has no immutable attribute")
    try:
        res = remap(capsys, path=str(ckpt))
        assert res["failed"] and "is not writable by this user" in res["msg"] and "nothing was changed" in res["msg"]
    finally:
        subprocess.run(["chattr", "-i", str(ckpt)], check=True)
    assert sha(ckpt) == digest
    assert sorted(p.name for p in ckpt.parent.iterdir()) == [ckpt.name]
    res = remap(capsys, path=str(ckpt))
    assert res["changed"] and res["files"][0]["recovered"] is False


@pytest.mark.parametrize("point", ["journal-written", "header-half-written", "header-written"])
def test_check_mode_predicts_what_the_recovery_will_do(ckpt, capsys, point):
    env = {**os.environ, "EAGLE3_CRASH_AT": point}
    proc = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT.format(root=str(ROOT), path=str(ckpt))], env=env, capture_output=True
    )
    assert proc.returncode == -9
    state = {p.name: p.read_bytes() for p in ckpt.parent.iterdir()}
    predicted = remap(capsys, check=True, path=str(ckpt))
    assert not predicted.get("failed"), predicted
    assert {p.name: p.read_bytes() for p in ckpt.parent.iterdir()} == state  # check mode wrote nothing
    real = remap(capsys, path=str(ckpt))
    for key in ("changed", "renames", "dropped"):
        assert predicted[key] == real[key], key
    assert predicted["files"][0]["recovered"] == real["files"][0]["recovered"] is True
    assert predicted["files"][0]["method"] == real["files"][0]["method"]


@pytest.mark.parametrize("drop", [[], ["^t2d$"]], ids=["header-fits", "rewrite"])
def test_a_symlinked_checkpoint_is_replaced_by_a_file_and_the_blob_left_alone(tmp_path, capsys, drop):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    blob = blobs / "3f2a9c"
    save_file(drafter_tensors(), str(blob))
    digest = sha(blob)
    snapshot = tmp_path / "snapshots" / "main"
    snapshot.mkdir(parents=True)
    link = snapshot / "model.safetensors"
    link.symlink_to(blob)
    res = remap(capsys, path=str(link), drop=drop)
    assert res["changed"] and res["files"][0]["method"] == "rewrite"
    assert sha(blob) == digest  # the content-addressed blob is untouched
    assert not link.is_symlink() and link.is_file()
    assert "midlayer.mlp.up_proj.weight" in load_file(str(link))
    assert sorted(p.name for p in snapshot.iterdir()) == ["model.safetensors"]
