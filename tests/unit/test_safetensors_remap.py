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

from tests.modules import ROOT, load_module, run_module

sys.path.insert(0, str(ROOT / "plugins" / "module_utils"))
import _safetensors as codec

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
    assert sorted(after) == sorted(codec.rename(k, [("layers.0.", "midlayer.")]) for k in before)
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
        "overlaps the tensor before it",
    ),
    "gap": (
        _raw({"layers.0.a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
        "has a gap before tensor",
    ),
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
        assert res["failed"] and "Read-only file system" in res["msg"] and "the original is unchanged" in res["msg"]
        assert sha(target) == digest
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
from tests.modules import run_module
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
    assert sorted(after) == sorted(codec.rename(k, [("layers.0.", "midlayer.")]) for k in before)
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
