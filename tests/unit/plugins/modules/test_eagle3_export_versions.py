"""eagle3_export with versions=true: each export an immutable directory named by its content hash under the draft
root, never a rewrite of one a server loads; the same checkpoint always the same version (an older source included,
whatever the files' times); check mode writing nothing; two processes exporting one checkpoint making one version."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from tests.unit.plugins.modules.test_eagle3_export import digest, export
from tests.unit.plugins.modules.test_safetensors_remap import drafter_tensors
from tests.unit.plugins.modules.test_safetensors_remap_races import Run


def versions(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def another_epoch(tmp_path: Path, scale: float) -> Path:
    """The same checkpoint's shape with other weights (another epoch of the run)."""
    d = tmp_path / "train" / f"e{scale}"
    d.mkdir(parents=True)
    tensors = {k: (v * scale).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in drafter_tensors().items()}
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text((tmp_path / "train" / "4" / "config.json").read_text())
    return d


def test_an_export_is_a_new_version_named_by_its_content_and_a_rerun_converges(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    res = export(capsys, src=str(epoch), dest=str(root), versions=True)
    assert res["changed"] and res["verified"]
    assert len(res["version"]) == 16 and res["dest"] == str(root / res["version"])
    assert versions(root) == [res["version"]]
    weights = load_file(str(root / res["version"] / "model.safetensors"))
    np.testing.assert_array_equal(weights["midlayer.mlp.down_proj.weight"],
                                  drafter_tensors()["layers.0.mlp.down_proj.weight"])
    again = export(capsys, src=str(epoch), dest=str(root), versions=True)
    assert again["changed"] is False and again["version"] == res["version"] and again["verified"]
    assert not [p for p in root.iterdir() if p.name.endswith(".partial")]


def test_another_checkpoint_is_another_version_and_the_first_is_never_rewritten(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    first = export(capsys, src=str(epoch), dest=str(root), versions=True)
    before = digest(root / first["version"])
    second = export(capsys, src=str(another_epoch(tmp_path, 0.5)), dest=str(root), versions=True)
    assert second["changed"] and second["version"] != first["version"]
    assert digest(root / first["version"]) == before
    assert versions(root) == sorted([first["version"], second["version"]])


def test_an_older_source_is_its_own_version_whatever_the_files_times(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    first = export(capsys, src=str(epoch), dest=str(root), versions=True)
    newer = another_epoch(tmp_path, 0.25)
    export(capsys, src=str(newer), dest=str(root), versions=True)
    os.utime(epoch / "model.safetensors", (1, 1))  # far older than every exported file
    back = export(capsys, src=str(epoch), dest=str(root), versions=True)
    assert back["version"] == first["version"] and back["changed"] is False and back["verified"]
    os.utime(newer / "model.safetensors", None)
    os.utime(epoch / "model.safetensors", (4e9, 4e9))  # far newer: still the same content, the same version
    assert export(capsys, src=str(epoch), dest=str(root), versions=True)["version"] == first["version"]


def test_export_parameters_are_part_of_the_content(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    legacy = export(capsys, src=str(epoch), dest=str(root), versions=True)
    modern = export(capsys, src=str(epoch), dest=str(root), versions=True, sglang_version="0.5.23")
    assert legacy["version"] != modern["version"]
    assert "layers.0.mlp.down_proj.weight" in load_file(str(root / modern["version"] / "model.safetensors"))


def test_check_mode_names_the_version_and_writes_nothing(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    res = export(capsys, check=True, diff=True, src=str(epoch), dest=str(root), versions=True)
    assert res["changed"] and len(res["version"]) == 16 and not root.exists()
    assert "serves version: " + res["version"] in res["diff"]["after"]
    real = export(capsys, src=str(epoch), dest=str(root), versions=True)
    assert real["version"] == res["version"]
    assert export(capsys, check=True, src=str(epoch), dest=str(root), versions=True)["changed"] is False


def test_a_missing_source_serves_the_current_version_or_names_both_paths(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    gone = tmp_path / "gone"
    res = export(capsys, src=str(gone), dest=str(root), versions=True, src_optional=True)
    assert res["failed"] and f"Neither a checkpoint at {gone} nor a current draft version under {root}" in res["msg"]
    made = export(capsys, src=str(epoch), dest=str(root), versions=True)
    (root / "versions.json").write_text(json.dumps({"current": made["version"], "servers": {}}))
    res = export(capsys, src=str(gone), dest=str(root), versions=True, src_optional=True)
    assert not res.get("failed") and res["source_found"] is False and res["version"] == made["version"]
    assert res["verified"] and res["changed"] is False


def test_a_draft_exported_before_versions_is_served_as_it_is_without_a_checkpoint(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    export(capsys, src=str(epoch), dest=str(root))  # the flat layout of an earlier release
    res = export(capsys, src=str(tmp_path / "gone"), dest=str(root), versions=True, src_optional=True)
    assert not res.get("failed") and res["dest"] == str(root) and res["verified"] and "version" not in res


def test_a_failed_export_leaves_no_version_and_no_staging(epoch, tmp_path, capsys):
    root = tmp_path / "drafts"
    conf = json.loads((epoch / "config.json").read_text())
    conf["transformer_layer_config"]["hidden_size"] = 7  # the weights are not this shape: refused before writing
    (epoch / "config.json").write_text(json.dumps(conf))
    res = export(capsys, src=str(epoch), dest=str(root), versions=True)
    assert res["failed"] and "hidden" in res["msg"], res["msg"]
    assert list(root.iterdir()) == []  # no version, no staging, no lock left


def test_versions_need_a_root_of_their_own(epoch, capsys):
    res = export(capsys, src=str(epoch), versions=True)
    assert res["failed"] and "versions=true needs dest, a draft root of its own" in res["msg"]


def test_two_processes_exporting_one_checkpoint_make_one_version(epoch, tmp_path):
    root = tmp_path / "drafts"
    args = {"src": str(epoch), "dest": str(root), "versions": True}
    first = Run("eagle3_export", args, tmp_path, hold="locked", tag="a")
    first.wait_reached()
    second = Run("eagle3_export", args, tmp_path, tag="b")  # waits for the first's locks
    first.release()
    a, b = first.result(), second.result()
    assert a["version"] == b["version"] and [a["changed"], b["changed"]].count(True) == 1
    assert versions(root) == [a["version"]]
    assert not [p for p in root.iterdir() if p.name.endswith(".partial")]
