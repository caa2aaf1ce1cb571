# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""speculators EAGLE-3 checkpoint -> SGLang ``LlamaForCausalLMEagle3`` draft: config and weight checks.

Pure functions, no Ansible imports. The facts encoded here (from SGLang's ``models/llama_eagle3.py``
and speculators 0.9's ``Eagle3`` config) are:

* SGLang loads ``midlayer.*`` (and ``additional_layers.{i}.*`` for extra layers where the version
  supports them), ``fc.weight``, ``norm.weight``, ``lm_head.weight``, ``d2t`` and an optional
  ``embed_tokens.weight``; every other key is dropped silently.
* q/k/v take 2 x hidden (embeddings || hidden state); ``fc`` maps 3 x target hidden -> hidden.
* The layer is plain EAGLE-3: no norm before ``fc``, no norm on the output, the residual taken before
  ``hidden_norm``, full attention. A drafter trained otherwise computes another function.
* The aux layer ids must sit under ``eagle_config`` or SGLang falls back to [2, N//2, N-3].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Each incompatibility: (key, what SGLang does instead, the speculators training flag that avoids it).
RETRAIN_FLAGS = {
    "norm_before_fc": "--no-norm-before-fc",
    "norm_output": "--no-norm-output",
    "norm_before_residual": "--no-norm-before-residual",
    "sliding_window": "--full-attention-indices 0",
    "layer_count": "--num-layers 1",
}

LLAMA_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
    "attention_bias",
    "mlp_bias",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


class ExportError(Exception):
    """The checkpoint cannot be exported as asked."""


@dataclass
class Incompatibility:
    key: str
    reason: str

    @property
    def flag(self) -> str:
        return RETRAIN_FLAGS[self.key]


def _layer_config(conf: dict[str, Any]) -> dict[str, Any]:
    layer = conf.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise ExportError("config.json has no transformer_layer_config: it is not a speculators EAGLE-3 checkpoint")
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"):
        if not isinstance(layer.get(key), int):
            raise ExportError(f"transformer_layer_config lacks the integer {key}")
    return layer


def check_speculators_config(conf: dict[str, Any], max_layers: int = 1) -> list[Incompatibility]:
    """What in a speculators EAGLE-3 config SGLang's llama EAGLE-3 would not compute the same way."""
    if conf.get("speculators_model_type") != "eagle3":
        raise ExportError(
            f"config.json has speculators_model_type {conf.get('speculators_model_type')!r}, not 'eagle3'"
        )
    layer = _layer_config(conf)
    found: list[Incompatibility] = []
    if conf.get("norm_before_fc"):
        found.append(Incompatibility("norm_before_fc", "it normalises the concatenated hidden states before fc"))
    if conf.get("norm_output"):
        found.append(Incompatibility("norm_output", "it normalises the layer output passed to the next step"))
    if conf.get("norm_before_residual"):
        found.append(
            Incompatibility("norm_before_residual", "its residual is taken after hidden_norm, SGLang's before it")
        )
    layer_types = layer.get("layer_types") or []
    full_attention = conf.get("full_attention_indices")
    sliding = bool(
        (layer_types and layer_types[0] not in ("full_attention", None))
        or (layer.get("use_sliding_window") and layer.get("sliding_window"))
        or (conf.get("sliding_window") and not (isinstance(full_attention, list) and 0 in full_attention))
    )
    if sliding:
        window = layer.get("sliding_window") or conf.get("sliding_window")
        found.append(Incompatibility("sliding_window", f"its layer uses sliding-window attention ({window})"))
    layers = int(layer.get("num_hidden_layers", 1) or 1)
    if layers > max_layers:
        found.append(
            Incompatibility("layer_count", f"it has {layers} draft layers and the SGLang version loads {max_layers}")
        )
    return found


def sglang_config(conf: dict[str, Any]) -> dict[str, Any]:
    """The draft config.json SGLang's LlamaForCausalLMEagle3 reads, from a speculators config."""
    layer = _layer_config(conf)
    out: dict[str, Any] = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}
    for key in LLAMA_FIELDS:
        if layer.get(key) is not None:
            out[key] = layer[key]
    out.setdefault("num_key_value_heads", out["num_attention_heads"])
    # transformers 5 keeps rope settings under rope_parameters; SGLang's llama reads rope_theta/rope_scaling.
    rope = layer.get("rope_parameters") or {}
    if "rope_theta" not in out and rope.get("rope_theta") is not None:
        out["rope_theta"] = rope["rope_theta"]
    if "rope_scaling" not in out and rope.get("rope_type") not in (None, "default"):
        out["rope_scaling"] = {k: v for k, v in rope.items() if k != "rope_theta"}
    out["vocab_size"] = layer["vocab_size"]  # the target's vocabulary (embeddings, d2t targets)
    out["num_hidden_layers"] = int(layer.get("num_hidden_layers", 1) or 1)
    out["draft_vocab_size"] = int(conf.get("draft_vocab_size") or layer["vocab_size"])
    out["tie_word_embeddings"] = False
    if conf.get("target_hidden_size"):
        out["target_hidden_size"] = conf["target_hidden_size"]
    dtype = layer.get("torch_dtype") or layer.get("dtype") or conf.get("torch_dtype") or conf.get("dtype")
    if dtype:
        out["torch_dtype"] = dtype
    aux = conf.get("eagle_aux_hidden_state_layer_ids")
    eagle: dict[str, Any] = {"use_aux_hidden_state": True}
    if aux is not None:
        if not (isinstance(aux, list) and all(isinstance(i, int) and i >= 0 for i in aux) and len(aux) == 3):
            raise ExportError(f"eagle_aux_hidden_state_layer_ids must be three layer indices, not {aux!r}")
        eagle["eagle_aux_hidden_state_layer_ids"] = aux
    out["eagle_config"] = eagle
    verifier = (conf.get("speculators_config") or {}).get("verifier") or {}
    if verifier.get("name_or_path"):
        out["eagle3_ops_verifier"] = verifier["name_or_path"]
    return out


def expected_shapes(sg: dict[str, Any]) -> dict[str, tuple[int, ...] | None]:
    """Tensor name -> shape SGLang expects (None: optional). Only for the layers SGLang loads."""
    h = sg["hidden_size"]
    heads = sg["num_attention_heads"]
    kv = sg.get("num_key_value_heads", heads)
    head_dim = sg.get("head_dim") or h // heads
    inter = sg["intermediate_size"]
    target_h = sg.get("target_hidden_size") or h
    shapes: dict[str, tuple[int, ...] | None] = {}
    layer_prefixes = ["midlayer."] + [f"additional_layers.{i}." for i in range(sg.get("num_hidden_layers", 1) - 1)]
    for i, prefix in enumerate(layer_prefixes):
        qkv_in = 2 * h if i == 0 else h
        shapes.update(
            {
                f"{prefix}self_attn.q_proj.weight": (heads * head_dim, qkv_in),
                f"{prefix}self_attn.k_proj.weight": (kv * head_dim, qkv_in),
                f"{prefix}self_attn.v_proj.weight": (kv * head_dim, qkv_in),
                f"{prefix}self_attn.o_proj.weight": (h, heads * head_dim),
                f"{prefix}input_layernorm.weight": (h,),
                f"{prefix}post_attention_layernorm.weight": (h,),
                f"{prefix}mlp.gate_proj.weight": (inter, h),
                f"{prefix}mlp.up_proj.weight": (inter, h),
                f"{prefix}mlp.down_proj.weight": (h, inter),
            }
        )
        if i == 0:
            shapes[f"{prefix}hidden_norm.weight"] = (h,)
    shapes.update(
        {
            "fc.weight": (h, 3 * target_h),
            "norm.weight": (h,),
            "lm_head.weight": (sg["draft_vocab_size"], h),
            "d2t": (sg["draft_vocab_size"],),
        }
    )
    return shapes


OPTIONAL = {"embed_tokens.weight"}


def check_tensors(sg: dict[str, Any], tensors: dict[str, list[int]]) -> list[str]:
    """Problems with the exported tensors (name -> shape): missing, misshapen, or silently dropped."""
    problems = []
    expected = expected_shapes(sg)
    for name, shape in expected.items():
        if name not in tensors:
            problems.append(f"{name} is missing")
        elif shape is not None and tuple(tensors[name]) != shape:
            problems.append(f"{name} has shape {list(tensors[name])} where SGLang expects {list(shape)}")
    if "embed_tokens.weight" in tensors:
        shape = tuple(tensors["embed_tokens.weight"])
        if shape != (sg["vocab_size"], sg["hidden_size"]):
            want = [sg["vocab_size"], sg["hidden_size"]]
            problems.append(f"embed_tokens.weight has shape {list(shape)} where SGLang expects {want}")
    unknown = sorted(set(tensors) - set(expected) - OPTIONAL)
    if unknown:
        problems.append(f"SGLang would silently drop {', '.join(unknown)}")
    return problems
