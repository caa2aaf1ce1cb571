"""eagle3_export: speculators checkpoint -> SGLang draft, checked against SGLang's loader layout."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.modules import run_module
from tests.unit.plugins.modules.test_safetensors_remap import H, drafter_tensors

PLAIN = {"norm_before_fc": False, "norm_output": False, "norm_before_residual": False}


def speculators_config(**overrides) -> dict:
    conf = {
        "architectures": ["Eagle3DraftModel"],
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": H,
            "intermediate_size": 32,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 4,
            "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0,
            "max_position_embeddings": 2048,
            "vocab_size": 64,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
        },
        "draft_vocab_size": 24,
        "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
        "speculators_config": {"algorithm": "eagle3", "verifier": {"name_or_path": "/models/tiny-target"}},
        **PLAIN,
    }
    conf.update(overrides)
    return conf


def digest(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def export(capsys, check=False, diff=False, **args):
    return run_module("eagle3_export", args, check=check, diff=diff, capsys=capsys)


def test_export_into_a_new_directory(epoch, tmp_path, capsys):
    before = digest(epoch)
    dest = tmp_path / "draft"
    res = export(capsys, src=str(epoch), dest=str(dest))
    assert res["changed"] and res["dropped"] == ["t2d"]
    conf = json.loads((dest / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    # trained on the inputs of layers 1, 2, 3 (speculators' numbering) = the outputs of layers 0, 1, 2 (SGLang's)
    assert conf["eagle_config"] == {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}
    assert conf["eagle3_ops_trained_layer_ids"] == [1, 2, 3]
    assert res["aux_layer_ids"] == {"trained": [1, 2, 3], "sglang": [0, 1, 2], "target_layers": None}
    assert "eagle_aux_hidden_state_layer_ids" not in conf  # a top-level key would be ignored by SGLang
    assert (conf["hidden_size"], conf["num_hidden_layers"], conf["draft_vocab_size"], conf["vocab_size"]) == (
        H,
        1,
        24,
        64,
    )
    weights = load_file(str(dest / "model.safetensors"))
    assert "midlayer.self_attn.q_proj.weight" in weights and "t2d" not in weights
    assert not [k for k in weights if k.startswith("layers.")]
    original = drafter_tensors()
    np.testing.assert_array_equal(weights["midlayer.mlp.down_proj.weight"], original["layers.0.mlp.down_proj.weight"])
    np.testing.assert_array_equal(weights["d2t"], original["d2t"])
    assert digest(epoch) == before  # the speculators original is untouched
    again = export(capsys, src=str(epoch), dest=str(dest))
    assert again["changed"] is False


def test_export_in_place_keeps_the_original_loadable(epoch, capsys):
    original = load_file(str(epoch / "model.safetensors"))
    res = export(capsys, src=str(epoch))
    assert res["changed"]
    kept = load_file(str(epoch / "speculators" / "model.safetensors"))
    assert sorted(kept) == sorted(original)
    assert json.loads((epoch / "speculators" / "config.json").read_text())["speculators_model_type"] == "eagle3"
    exported = load_file(str(epoch / "model.safetensors"))
    assert "midlayer.hidden_norm.weight" in exported
    assert export(capsys, src=str(epoch))["changed"] is False


def test_check_mode_and_diff_write_nothing(epoch, tmp_path, capsys):
    before = digest(epoch)
    res = export(capsys, check=True, diff=True, src=str(epoch), dest=str(tmp_path / "draft"))
    assert res["changed"] and "LlamaForCausalLMEagle3" in res["diff"]["after"]
    assert not (tmp_path / "draft").exists() and digest(epoch) == before


def test_speculators_defaults_are_refused_with_the_retraining_flags(epoch, tmp_path, capsys):
    conf = speculators_config(norm_before_fc=True, norm_output=True, norm_before_residual=True)
    conf["transformer_layer_config"]["layer_types"] = ["sliding_attention"]
    conf["transformer_layer_config"]["sliding_window"] = 2048
    (epoch / "config.json").write_text(json.dumps(conf))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"))
    assert res["failed"]
    for flag in ("--no-norm-before-fc", "--no-norm-output", "--no-norm-before-residual", "--full-attention-indices 0"):
        assert flag in res["msg"]
    assert "allow_incompatible: [norm_before_fc, norm_output, norm_before_residual, sliding_window]" in res["msg"]
    assert not (tmp_path / "draft").exists()


def test_an_accepted_difference_is_exported_and_reported(epoch, tmp_path, capsys):
    (epoch / "config.json").write_text(json.dumps(speculators_config(norm_before_residual=True)))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), allow_incompatible=["norm_before_residual"])
    assert res["changed"] and [i["key"] for i in res["incompatibilities"]] == ["norm_before_residual"]


def test_a_tensor_sglang_would_drop_is_refused(epoch, tmp_path, capsys):
    tensors = drafter_tensors()
    tensors["layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(2, np.float32)
    save_file(tensors, str(epoch / "model.safetensors"))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"))
    assert res["failed"]
    assert "SGLang before 0.5.23 would silently drop midlayer.self_attn.rotary_emb.inv_freq" in res["msg"]


def test_missing_and_misshapen_tensors_are_named(epoch, tmp_path, capsys):
    tensors = drafter_tensors()
    del tensors["fc.weight"]
    tensors["lm_head.weight"] = np.zeros((25, H), np.float32)
    save_file(tensors, str(epoch / "model.safetensors"))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"))
    assert res["failed"]
    assert "fc.weight is missing" in res["msg"]
    assert "lm_head.weight has shape [25, 16] where SGLang expects [24, 16]" in res["msg"]


def test_not_a_speculators_checkpoint(tmp_path, capsys):
    res = export(capsys, src=str(tmp_path), dest=str(tmp_path / "d"))
    assert res["failed"] and "config.json does not exist" in res["msg"]


def test_every_real_run_reads_the_draft_back(epoch, tmp_path, capsys):
    dest = tmp_path / "draft"
    assert export(capsys, src=str(epoch), dest=str(dest))["verified"] is True  # written
    assert export(capsys, check=True, src=str(epoch), dest=str(dest))["verified"] is False  # check mode reads nothing
    up_to_date = export(capsys, src=str(epoch), dest=str(dest))
    assert up_to_date["changed"] is False and up_to_date["verified"] is True
    # A draft whose config SGLang would misread is refused even though its weights are current.
    conf = json.loads((dest / "config.json").read_text())
    conf["eagle_aux_hidden_state_layer_ids"] = conf["eagle_config"].pop("eagle_aux_hidden_state_layer_ids")
    (dest / "config.json").write_text(json.dumps(conf))
    rewritten = export(capsys, src=str(epoch), dest=str(dest))  # the config differs: written again, then verified
    assert rewritten["changed"] and rewritten["verified"], rewritten.get("msg")


def test_a_missing_source_serves_the_draft_already_exported_when_allowed(epoch, tmp_path, capsys):
    dest = tmp_path / "draft"
    export(capsys, src=str(epoch), dest=str(dest))
    before = digest(dest)
    gone = tmp_path / "train" / "gone"
    res = export(capsys, src=str(gone), dest=str(dest), src_optional=True)
    assert not res.get("failed"), res.get("msg")
    assert (res["changed"], res["source_found"], res["verified"]) == (False, False, True)
    assert res["config"]["architectures"] == ["LlamaForCausalLMEagle3"] and digest(dest) == before
    # Without src_optional the missing checkpoint is an error naming it; with neither, both paths are named.
    res = export(capsys, src=str(gone), dest=str(dest))
    assert res["failed"] and f"{gone}/config.json does not exist" in res["msg"]
    res = export(capsys, src=str(gone), dest=str(tmp_path / "nothing"), src_optional=True)
    assert res["failed"] and res["msg"].startswith(f"Neither a checkpoint at {gone} nor an exported draft at")
    assert not (tmp_path / "nothing").exists()
    # A draft kept that SGLang would not load is refused, naming the problem and the fix.
    tensors = drafter_tensors()
    save_file({k: v for k, v in tensors.items() if k not in ("fc.weight", "t2d")}, str(dest / "model.safetensors"))
    res = export(capsys, src=str(gone), dest=str(dest), src_optional=True)
    assert res["failed"] and f"The draft at {dest} is not one" in res["msg"] and "fc.weight is missing" in res["msg"]
    assert "export it again" in res["msg"]


def test_an_empty_source_is_refused(tmp_path, capsys):
    res = export(capsys, src="", dest=str(tmp_path / "d"))
    assert res["failed"] and res["msg"].startswith("src is empty")


@pytest.mark.parametrize("name", ["eagle3_export", "safetensors_remap"])
def test_module_documents_parse_with_ansible_doc(name):
    import subprocess
    import sys

    from tests.conftest import ROOT, ansible_env

    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-doc"), "-M", str(ROOT / "plugins" / "modules"), "--json", name],
        capture_output=True,
        text=True,
        env=ansible_env(),
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)[name]
    assert doc["doc"]["module"] == name and doc["examples"] and doc["return"]


def speculators_defaults(epoch: Path) -> None:
    """speculators 0.9's default drafter: norm before fc (an input_norm over the concatenated features) and a
    normed output; norm_before_residual off (no SGLang line computes it)."""
    (epoch / "config.json").write_text(json.dumps(speculators_config(norm_before_fc=True, norm_output=True)))
    tensors = drafter_tensors()
    tensors["input_norm.weight"] = np.full(3 * H, 0.5, np.float32)
    save_file(tensors, str(epoch / "model.safetensors"))


def test_sglang_0523_serves_speculators_defaults_with_their_own_names(epoch, tmp_path, capsys):
    speculators_defaults(epoch)
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), sglang_version="0.5.23")
    assert not res.get("failed"), res["msg"]
    assert res["sglang_line"] == "0.5.23" and res["renames"] == [] and res["incompatibilities"] == []
    conf = json.loads((tmp_path / "draft" / "config.json").read_text())
    assert conf["eagle_config"]["norm_before_fc"] is True and conf["norm_output"] is True
    names = set(load_file(str(tmp_path / "draft" / "model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in names and "input_norm.weight" in names and "t2d" not in names
    # A later release reads the same row; the legacy line (the default) refuses the same checkpoint.
    assert export(capsys, src=str(epoch), dest=str(tmp_path / "d2"), sglang_version="0.5.30.post1")["sglang_line"] \
        == "0.5.23"
    legacy = export(capsys, src=str(epoch), dest=str(tmp_path / "d3"))
    assert legacy["failed"] and "SGLang before 0.5.23" in legacy["msg"] and "--no-norm-before-fc" in legacy["msg"]


def test_no_sglang_line_computes_norm_before_residual(epoch, tmp_path, capsys):
    (epoch / "config.json").write_text(json.dumps(speculators_config(norm_before_residual=True)))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), sglang_version="0.5.23")
    assert res["failed"] and "--no-norm-before-residual" in res["msg"] and "SGLang 0.5.23 and newer" in res["msg"]


def test_a_draft_window_becomes_a_server_argument_on_0523(epoch, tmp_path, capsys):
    conf = speculators_config()
    conf["transformer_layer_config"].update(layer_types=["sliding_attention"], sliding_window=2048)
    (epoch / "config.json").write_text(json.dumps(conf))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), sglang_version="0.5.23")
    assert not res.get("failed") and res["server_args"] == ["--speculative-draft-window-size", "2048"]
    # The draft carries its window for sglang_serve; the legacy line refuses such a drafter.
    assert json.loads((tmp_path / "draft" / "config.json").read_text())["eagle3_ops_draft_window"] == 2048
    legacy = export(capsys, src=str(epoch), dest=str(tmp_path / "d2"))
    assert legacy["failed"] and "--full-attention-indices 0" in legacy["msg"]


@pytest.mark.parametrize("version", ["0.5.23x", "latest", ""])
def test_sglang_version_parsing(version, epoch, tmp_path, capsys):
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), sglang_version=version)
    if version == "latest":
        assert res["failed"] and "is not a version number" in res["msg"]
    else:
        assert res["sglang_line"] == ("0.5.23" if version else "legacy")


def write_verifier(tmp_path: Path, layers: int) -> str:
    verifier = tmp_path / "verifier"
    verifier.mkdir(exist_ok=True)
    (verifier / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": layers}))
    return str(verifier)


def test_the_seeds_ids_become_sglangs_ids_for_the_same_layers(epoch, tmp_path, capsys):
    # FACTS/issue 17: Kimi-K2.5 (61 layers), speculators ids [2, 30, 58] are served by SGLang as [1, 29, 57].
    verifier = write_verifier(tmp_path, 61)
    (epoch / "config.json").write_text(json.dumps(speculators_config(
        eagle_aux_hidden_state_layer_ids=[2, 30, 58],
        speculators_config={"algorithm": "eagle3", "verifier": {"name_or_path": verifier}})))  # fmt: skip
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"), sglang_version="0.5.23")
    assert res["aux_layer_ids"] == {"trained": [2, 30, 58], "sglang": [1, 29, 57], "target_layers": 61}
    assert res["config"]["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 29, 57]


@pytest.mark.parametrize(("ids", "words"), [
    ([0, 1, 2], "[0]"),            # the embeddings: SGLang has no id for them
    ([1, 2, 4], "[4]"),            # the last layer's output (4 layers): always captured, never an aux layer
    ([1, 1, 2], "repeat"),
])  # fmt: skip
def test_ids_sglang_cannot_capture_are_refused_before_writing(epoch, tmp_path, capsys, ids, words):
    verifier = write_verifier(tmp_path, 4)
    (epoch / "config.json").write_text(json.dumps(speculators_config(
        eagle_aux_hidden_state_layer_ids=ids,
        speculators_config={"algorithm": "eagle3", "verifier": {"name_or_path": verifier}})))  # fmt: skip
    dest = tmp_path / "draft"
    res = export(capsys, src=str(epoch), dest=str(dest), sglang_version="0.5.23")
    assert res["failed"] and words in res["msg"] and "--target-layer-ids" in res["msg"]
    assert not dest.exists()


def test_the_legacy_line_takes_exactly_three_aux_layers(epoch, tmp_path, capsys):
    (epoch / "config.json").write_text(json.dumps(speculators_config(eagle_aux_hidden_state_layer_ids=[1, 2])))
    res = export(capsys, src=str(epoch), dest=str(tmp_path / "draft"))
    assert res["failed"] and "exactly 3 aux layers" in res["msg"]


def test_an_older_checkpoint_exported_again_is_written_again_whatever_the_times(epoch, tmp_path, capsys):
    """The export decides by content: the draft from another epoch is replaced by the older checkpoint's weights."""
    dest = tmp_path / "draft"
    export(capsys, src=str(epoch), dest=str(dest))
    first = digest(dest)
    other = tmp_path / "train" / "5"
    other.mkdir()
    scaled = {k: (v * 0.5).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in drafter_tensors().items()}
    save_file(scaled, str(other / "model.safetensors"), metadata={"format": "pt"})
    (other / "config.json").write_text((epoch / "config.json").read_text())
    assert export(capsys, src=str(other), dest=str(dest))["changed"]
    assert digest(dest) != first
    os.utime(epoch / "model.safetensors", (1, 1))  # older than the draft now on disk
    back = export(capsys, src=str(epoch), dest=str(dest))
    assert back["changed"] and digest(dest) == first
    assert export(capsys, src=str(epoch), dest=str(dest))["changed"] is False
