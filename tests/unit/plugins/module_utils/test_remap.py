"""module_utils/_remap.py: renaming and dropping tensors by rewriting the header - in place when the new header fits
(the file's data untouched), else a rewrite through a temporary; the file loads with safetensors either way. The
module's trials (tests/unit/plugins/modules/test_safetensors_remap*.py) run it under crashes, races and full disks."""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load_file, save_file

from tests.modules import module_utils

remap = module_utils("_remap")
codec = module_utils("_safetensors")


def test_renames_follow_the_first_prefix_rule_that_matches():
    rules = [("layers.0.", "midlayer."), ("layers.", "extra."), ("layers.0.mlp", "never.")]
    assert remap.rename("layers.0.mlp.weight", rules) == "midlayer.mlp.weight"
    assert remap.rename("layers.1.mlp.weight", rules) == "extra.1.mlp.weight"
    assert remap.rename("lm_head.weight", rules) == "lm_head.weight"


def _checkpoint(tmp_path):
    path = tmp_path / "model.safetensors"
    tensors = {"layers.0.mlp.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
               "lm_head.weight": np.ones((3, 2), dtype=np.float32)}  # fmt: skip
    save_file(tensors, str(path))
    return path, tensors


def test_a_shorter_name_is_written_in_place_and_the_data_stays(tmp_path):
    path, tensors = _checkpoint(tmp_path)
    data_before = path.read_bytes()[codec.read_header(str(path)).data_start :]
    pl = remap.plan(codec.read_header(str(path)), [("layers.0.", "mid.")], [])
    assert pl.changed and remap.method_for(pl) == "in_place"
    assert remap.apply(pl) == "in_place"
    loaded = load_file(str(path))
    assert sorted(loaded) == ["lm_head.weight", "mid.mlp.weight"]
    np.testing.assert_array_equal(loaded["mid.mlp.weight"], tensors["layers.0.mlp.weight"])
    assert path.read_bytes()[codec.read_header(str(path)).data_start :] == data_before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]  # no journal left


def test_a_dropped_tensor_takes_a_rewrite_and_nothing_is_left_beside_it(tmp_path):
    path, tensors = _checkpoint(tmp_path)
    pl = remap.plan(codec.read_header(str(path)), [], ["lm_head.weight"])
    assert remap.method_for(pl) == "rewrite"
    assert remap.apply(pl) == "rewrite"
    loaded = load_file(str(path))
    assert list(loaded) == ["layers.0.mlp.weight"]
    np.testing.assert_array_equal(loaded["layers.0.mlp.weight"], tensors["layers.0.mlp.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_no_rule_that_matches_is_no_change(tmp_path):
    path, _ = _checkpoint(tmp_path)
    before = path.read_bytes()
    pl = remap.plan(codec.read_header(str(path)), [("nothing.", "x.")], [])
    assert not pl.changed and remap.method_for(pl) == "none"
    assert path.read_bytes() == before
