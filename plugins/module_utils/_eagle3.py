# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""speculators EAGLE-3 checkpoint -> SGLang ``LlamaForCausalLMEagle3`` draft: config and weight checks.

Pure functions, no Ansible imports. What SGLang's ``models/llama_eagle3.py`` loads and computes depends
on its version; ``SGLANG_LINES`` holds one row per supported line, and every rule below reads its row:

* legacy (the line in the seeds, and every release before 0.5.23 here): loads ``midlayer.*`` (further
  layers as ``additional_layers.{i}.*`` where supported), ``fc``, ``norm``, ``lm_head``, ``d2t`` and an
  optional ``embed_tokens``; every other key is dropped silently. Plain EAGLE-3 only: no norm before
  ``fc``, no norm on the output, one full-attention layer.
* 0.5.23 (read and run here): keeps ``layers.{i}.*`` (``midlayer`` is mapped to ``layers.0``), implements
  ``norm_before_fc`` (``input_norm``), per-aux ``fc_norm``, ``norm_output``, several layers and a draft
  sliding window (``--speculative-draft-window-size``). 0.5.23 still loads a legacy export.
* In every line q/k/v of the first layer take 2 x hidden (embeddings || hidden state), ``fc`` maps
  n_aux x target hidden -> hidden, the input layer's residual is the hidden state *before* ``hidden_norm``
  (speculators' ``norm_before_residual`` computes another function), and the aux layer ids must sit
  under ``eagle_config`` or SGLang falls back to [2, N//2, N-3].
* Aux layer ids count differently (``sglang_aux_layer_ids``): speculators trains on vLLM's numbering, where
  id j is the input of decoder layer j (the output of layer j-1: ``_maybe_add_hidden_state(aux, idx + 1,
  ...)`` after layer ``idx`` in vllm/model_executor/models/llama.py; 0 is the embeddings, N the last
  layer's output). SGLang's ``set_eagle3_layers_to_capture`` captures at the start of layer ``val + 1``
  for an explicit id ("in sglang, for the ith layer, it takes the output of the (i-1)th layer"), so its id
  k is the output of layer k - one less for the same layer - while its built-in default [2, N//2, N-3]
  (no ids in the draft config) is used unshifted, i.e. in vLLM's numbering.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# Each incompatibility: (key, what SGLang does instead, the speculators training flag that avoids it).
RETRAIN_FLAGS = {
    "norm_before_fc": "--no-norm-before-fc",
    "norm_output": "--no-norm-output",
    "norm_before_residual": "--no-norm-before-residual",
    "sliding_window": "--full-attention-indices 0",
    "layer_count": "--num-layers 1",
    "fc_norm": "--no-fc-norm",
}


@dataclass(frozen=True)
class SGLangLine:
    """What one line of SGLang's LlamaForCausalLMEagle3 loads and computes."""

    name: str
    since: tuple[int, ...]  # first release of the line
    native_layer_names: bool  # loads layers.{i}.* as speculators writes them
    computes: frozenset[str]  # speculators features (RETRAIN_FLAGS keys) it computes as trained
    max_layers: int | None  # draft decoder layers it loads (None: any)
    # SGLang's explicit eagle_aux_hidden_state_layer_ids = speculators' (vLLM's) id + this, for the same layer.
    aux_id_shift: int = -1
    aux_count: int | None = None  # aux layers its fc takes (None: as many as the config lists)

    @property
    def label(self) -> str:
        return "SGLang before 0.5.23" if self.name == "legacy" else f"SGLang {self.name} and newer"

    def layer_prefix(self, i: int) -> str:
        if self.native_layer_names:
            return f"layers.{i}."
        return "midlayer." if i == 0 else f"additional_layers.{i - 1}."


SGLANG_LINES = (
    # Conservative boundary: 0.5.23 is the first release read here with these features; older ones get the
    # legacy row, whose exports every line loads (0.5.23 maps midlayer to layers.0).
    SGLangLine("legacy", (0,), native_layer_names=False, computes=frozenset(), max_layers=1, aux_count=3),
    SGLangLine(
        "0.5.23",
        (0, 5, 23),
        native_layer_names=True,
        computes=frozenset({"norm_before_fc", "fc_norm", "norm_output", "layer_count", "sliding_window"}),
        max_layers=None,
    ),
)


def parse_version(version: str) -> tuple[int, ...]:
    """(0, 5, 23) from "0.5.23", "0.5.23.post1" or "v0.5.23rc1": the release numbers, suffixes ignored."""
    m = re.match(r"v?(\d+(?:\.\d+)*)", str(version).strip())
    if not m:
        raise ExportError(f"SGLang version {version!r} is not a version number such as 0.5.23")
    return tuple(int(x) for x in m.group(1).split("."))


def sglang_line(version: str | None) -> SGLangLine:
    """The row for an SGLang version ("legacy" or None: the legacy line, which every line loads)."""
    if version in (None, "", "legacy"):
        return SGLANG_LINES[0]
    found = parse_version(str(version))
    return [line for line in SGLANG_LINES if found >= line.since][-1]


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


def sglang_aux_layer_ids(trained: Any, line: SGLangLine, target_layers: int | None = None) -> list[int]:
    """The ``eagle_config`` ids that make SGLang capture the layers a speculators draft was trained on.

    ``trained`` is in speculators'/vLLM's numbering (what ``eagle_aux_hidden_state_layer_ids`` holds in a
    speculators checkpoint and what the extraction wrote). SGLang can capture the input of layers 1..N-1
    only: id 0 (the embeddings) and id N (the last layer's output, which EAGLE-3 always gets as its last
    hidden state) have no SGLang id.
    """
    ints = isinstance(trained, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in trained)
    if not (ints and trained):
        raise ExportError(f"eagle_aux_hidden_state_layer_ids must be a list of layer ids, not {trained!r}")
    high = f"..{target_layers - 1}" if target_layers else " and above"
    bad = [i for i in trained if i < 1 or (target_layers is not None and i >= target_layers)]
    if bad:
        raise ExportError(f"aux layer ids {bad} (speculators' numbering: id j is the input of decoder layer j) have no "
                          f"SGLang equivalent; SGLang captures the inputs of layers 1{high}: retrain with "
                          "--target-layer-ids inside that range")  # fmt: skip
    if len(set(trained)) != len(trained):
        raise ExportError(f"aux layer ids {trained} repeat a layer: retrain with distinct --target-layer-ids")
    if line.aux_count is not None and len(trained) != line.aux_count:
        raise ExportError(f"{line.label} feeds exactly {line.aux_count} aux layers to fc, the draft was trained on "
                          f"{len(trained)} ({trained}): retrain with {line.aux_count} --target-layer-ids")  # fmt: skip
    return [i + line.aux_id_shift for i in trained]


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


def draft_window(conf: dict[str, Any]) -> int | None:
    """The sliding window of the draft's layer, or None when it attends to everything."""
    layer = _layer_config(conf)
    layer_types = layer.get("layer_types") or []
    full_attention = conf.get("full_attention_indices")
    sliding = bool(
        (layer_types and layer_types[0] not in ("full_attention", None))
        or (layer.get("use_sliding_window") and layer.get("sliding_window"))
        or (conf.get("sliding_window") and not (isinstance(full_attention, list) and 0 in full_attention))
    )
    return int(layer.get("sliding_window") or conf.get("sliding_window") or 0) or None if sliding else None


def check_speculators_config(
    conf: dict[str, Any], line: SGLangLine, max_layers: int | None = None
) -> list[Incompatibility]:
    """What in a speculators EAGLE-3 config this SGLang line would not compute the way it was trained."""
    if conf.get("speculators_model_type") != "eagle3":
        raise ExportError(
            f"config.json has speculators_model_type {conf.get('speculators_model_type')!r}, not 'eagle3'"
        )
    layer = _layer_config(conf)
    found: list[Incompatibility] = []
    if conf.get("norm_before_fc"):
        found.append(Incompatibility("norm_before_fc", "it normalises the concatenated hidden states before fc"))
    if conf.get("fc_norm"):
        found.append(Incompatibility("fc_norm", "it normalises each auxiliary hidden state before fc"))
    if conf.get("norm_output"):
        found.append(Incompatibility("norm_output", "it normalises the layer output passed to the next step"))
    if conf.get("norm_before_residual"):
        found.append(
            Incompatibility("norm_before_residual", "its residual is taken after hidden_norm, SGLang's before it")
        )
    window = draft_window(conf)
    if window is not None:
        found.append(Incompatibility("sliding_window", f"its layer uses sliding-window attention ({window})"))
    layers = int(layer.get("num_hidden_layers", 1) or 1)
    limit = max_layers if max_layers is not None else line.max_layers
    if limit is not None and layers > limit:
        found.append(
            Incompatibility("layer_count", f"it has {layers} draft layers and {line.label} loads {limit}")
        )
    return [i for i in found if i.key == "layer_count" or i.key not in line.computes]


def server_args(conf: dict[str, Any], line: SGLangLine) -> list[str]:
    """launch_server arguments the draft needs on this line (its sliding window is a server argument)."""
    window = draft_window(conf)
    if window is not None and "sliding_window" in line.computes:
        return ["--speculative-draft-window-size", str(window)]
    return []


def sglang_config(conf: dict[str, Any], line: SGLangLine, target_layers: int | None = None) -> dict[str, Any]:
    """The draft config.json SGLang's LlamaForCausalLMEagle3 reads, from a speculators config.

    ``target_layers`` (the verifier's decoder layers, when known) bounds the aux layer ids.
    """
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
        # Always written, shifted to SGLang's numbering: without ids SGLang uses [2, N//2, N-3], right only
        # for a draft trained on exactly those layers.
        eagle["eagle_aux_hidden_state_layer_ids"] = sglang_aux_layer_ids(aux, line, target_layers)
        out["eagle3_ops_trained_layer_ids"] = list(aux)
    # SGLang takes the draft's window from a server argument (--speculative-draft-window-size), not from the
    # config: the draft carries it here for sglang_serve to pass on.
    window = draft_window(conf)
    if window is not None and "sliding_window" in line.computes:
        out["eagle3_ops_draft_window"] = window
    # The features this line computes, under the names its loader reads (eagle_config or top level).
    for key in ("norm_before_fc", "fc_norm", "norm_output"):
        if conf.get(key) and key in line.computes:
            if key == "norm_before_fc":
                eagle[key] = True
            else:
                out[key] = True
    out["eagle_config"] = eagle
    verifier = (conf.get("speculators_config") or {}).get("verifier") or {}
    if verifier.get("name_or_path"):
        out["eagle3_ops_verifier"] = verifier["name_or_path"]
    return out


def expected_shapes(sg: dict[str, Any], line: SGLangLine) -> dict[str, tuple[int, ...] | None]:
    """Tensor name -> shape this SGLang line expects (None: optional). Only for the layers it loads."""
    h = sg["hidden_size"]
    heads = sg["num_attention_heads"]
    kv = sg.get("num_key_value_heads", heads)
    head_dim = sg.get("head_dim") or h // heads
    inter = sg["intermediate_size"]
    target_h = sg.get("target_hidden_size") or h
    shapes: dict[str, tuple[int, ...] | None] = {}
    layer_prefixes = [line.layer_prefix(i) for i in range(sg.get("num_hidden_layers", 1))]
    n_aux = len((sg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
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
            "fc.weight": (h, n_aux * target_h),
            "norm.weight": (h,),
            "lm_head.weight": (sg["draft_vocab_size"], h),
            "d2t": (sg["draft_vocab_size"],),
        }
    )
    if (sg.get("eagle_config") or {}).get("norm_before_fc"):
        shapes["input_norm.weight"] = (n_aux * target_h,)
    if sg.get("fc_norm"):
        shapes.update({f"fc_norm.{i}.weight": (target_h,) for i in range(n_aux)})
    return shapes


OPTIONAL = {"embed_tokens.weight"}
LEGACY_NAMES = {"midlayer.": "layers.0.", "aux_norm_low.": "fc_norm.0.", "aux_norm_mid.": "fc_norm.1.",
                "aux_norm_high.": "fc_norm.2."}  # fmt: skip


def _modern_name(name: str) -> str:
    for legacy, modern in LEGACY_NAMES.items():
        if name.startswith(legacy):
            return modern + name[len(legacy) :]
    return name


def check_sglang_config(conf: dict[str, Any]) -> list[str]:
    """Problems with a draft config.json as SGLang's EAGLE-3 loader reads it (what eagle3_export writes)."""
    problems = []
    if conf.get("architectures") != ["LlamaForCausalLMEagle3"]:
        problems.append(f"architectures is {conf.get('architectures')!r}, not ['LlamaForCausalLMEagle3']")
    if "eagle_aux_hidden_state_layer_ids" not in (conf.get("eagle_config") or {}):
        problems.append("eagle_config.eagle_aux_hidden_state_layer_ids is missing")
    if "eagle_aux_hidden_state_layer_ids" in conf:
        problems.append("eagle_aux_hidden_state_layer_ids is at the top level, where SGLang does not read it")
    for key in ("draft_vocab_size", "vocab_size", "hidden_size", "num_attention_heads", "intermediate_size"):
        if key not in conf:
            problems.append(f"{key} is missing")
    return problems


def check_tensors(sg: dict[str, Any], tensors: dict[str, list[int]], line: SGLangLine) -> list[str]:
    """Problems with the exported tensors (name -> shape): missing, misshapen, or silently dropped."""
    problems = []
    expected = expected_shapes(sg, line)
    if line.native_layer_names:  # such lines map the legacy names as they load (SGLang's legacy_name_map)
        tensors = {_modern_name(name): shape for name, shape in tensors.items()}
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
        problems.append(f"{line.label} would silently drop {', '.join(unknown)}")
    return problems
