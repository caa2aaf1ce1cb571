"""Write a tiny speculators EAGLE-3 epoch directory with the standard library only (no numpy in the lab CT)."""

import json
import os
import struct
import sys

H, INTER, HEADS, KV, HEAD_DIM, DRAFT_VOCAB, VOCAB = 16, 32, 4, 2, 4, 24, 64
SHAPES = {
    "layers.0.self_attn.q_proj.weight": [HEADS * HEAD_DIM, 2 * H],
    "layers.0.self_attn.k_proj.weight": [KV * HEAD_DIM, 2 * H],
    "layers.0.self_attn.v_proj.weight": [KV * HEAD_DIM, 2 * H],
    "layers.0.self_attn.o_proj.weight": [H, HEADS * HEAD_DIM],
    "layers.0.input_layernorm.weight": [H],
    "layers.0.hidden_norm.weight": [H],
    "layers.0.post_attention_layernorm.weight": [H],
    "layers.0.mlp.gate_proj.weight": [INTER, H],
    "layers.0.mlp.up_proj.weight": [INTER, H],
    "layers.0.mlp.down_proj.weight": [H, INTER],
    "fc.weight": [H, 3 * H],
    "norm.weight": [H],
    "lm_head.weight": [DRAFT_VOCAB, H],
}

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
for index, (name, shape) in enumerate(SHAPES.items()):
    count = 1
    for d in shape:
        count *= d
    blobs.append(struct.pack(f"<{count}f", *[(index + i % 7) / 10 for i in range(count)]))
    header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + 4 * count]}
    offset += 4 * count
for name, dtype, fmt, values in (("d2t", "I64", "q", range(DRAFT_VOCAB)), ("t2d", "BOOL", "?", [True] * VOCAB)):
    blob = struct.pack(f"<{len(values)}{fmt}", *values)
    header[name] = {"dtype": dtype, "shape": [len(values)], "data_offsets": [offset, offset + len(blob)]}
    blobs.append(blob)
    offset += len(blob)
body = json.dumps(header).encode()
body += b" " * (-len(body) % 8)
with open(os.path.join(out, "model.safetensors"), "wb") as fh:
    fh.write(struct.pack("<Q", len(body)) + body + b"".join(blobs))
config = {
    "architectures": ["Eagle3DraftModel"],
    "speculators_model_type": "eagle3",
    "transformer_layer_config": {
        "model_type": "llama", "hidden_size": H, "intermediate_size": INTER, "num_attention_heads": HEADS,
        "num_key_value_heads": KV, "head_dim": HEAD_DIM, "rms_norm_eps": 1e-5, "vocab_size": VOCAB,
        "num_hidden_layers": 1,
    },
    "draft_vocab_size": DRAFT_VOCAB,
    "norm_before_fc": False,
    "norm_output": False,
    "norm_before_residual": False,
    "eagle_aux_hidden_state_layer_ids": [1, 2, 3],
}
with open(os.path.join(out, "config.json"), "w") as fh:
    json.dump(config, fh)
