"""Run inside a lab container: does the served draft see the hidden states it was trained on?

1. Features: the reference engine (which captures as SGLang does for the ids in the exported config) runs the
   target over dataset rows; its aux features must equal the slots of the vLLM store's hs_{i}.safetensors that
   training read (the ids in speculators' numbering), within bf16 tolerance; with the ids one layer off they
   differ.
2. Acceptance: the same draft with its ids shifted by one (the mistake the layer-id rule prevents: speculators'
   ids written into SGLang's config unchanged) accepts fewer tokens than with the exported ids.
Prints one JSON line.
Usage: python aux_ids_check.py TARGET DRAFT DATASET HIDDEN_STATES PROMPTS.jsonl ROWS PROMPT_COUNT
"""

import json
import os
import shutil
import sys
import tempfile

from datasets import load_from_disk
from safetensors.torch import load_file
from serving.engine import Engine

target, draft, dataset, hidden, prompts_path = sys.argv[1:6]
rows, prompt_count = int(sys.argv[6]), int(sys.argv[7])
version = os.environ.get("EAGLE3_REFERENCE_SGLANG_VERSION")
with open(os.path.join(draft, "config.json"), encoding="utf-8") as fh:
    exported = json.load(fh)
sglang_ids = exported["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
trained_ids = exported["eagle3_ops_trained_layer_ids"]

data = load_from_disk(dataset)


def feature_diff(path: str) -> float:
    """Largest difference, relative to the stored scale, between the engine's aux features and the store's."""
    eng = Engine(target, path, "EAGLE3", num_steps=3, sglang_version=version)
    worst = 0.0
    for i in range(rows):
        ids = [int(t) for t in data[i]["input_ids"]]
        _logits, feats, _cache = eng._target(ids, None)
        stored = load_file(os.path.join(hidden, f"hs_{i}.safetensors"))["hidden_states"].float()  # [T, n_aux+1, H]
        n_aux, width = stored.shape[1] - 1, stored.shape[2]
        mine = feats.float().reshape(len(ids), n_aux, width)
        worst = max(worst, (mine - stored[:, :n_aux]).abs().max().item() / stored[:, :n_aux].abs().max().item())
    return worst


def accept_length(path: str) -> float:
    eng = Engine(target, path, "EAGLE3", num_steps=3, sglang_version=version)
    with open(prompts_path, encoding="utf-8") as fh:
        prompts = [json.loads(line)["prompt"] for line in fh if line.strip()][:prompt_count]
    for prompt in prompts:
        eng.generate(eng.encode(messages=[{"role": "user", "content": prompt}]), 48)
    return float(eng.stats.accept_length() or 0.0)


wrong = tempfile.mkdtemp(prefix="aux-ids-")
try:
    for name in os.listdir(draft):
        if os.path.isfile(os.path.join(draft, name)):
            shutil.copy(os.path.join(draft, name), wrong)
    # speculators' ids copied into SGLang's config unchanged: SGLang then captures one layer deeper
    eagle = dict(exported["eagle_config"], eagle_aux_hidden_state_layer_ids=trained_ids)
    with open(os.path.join(wrong, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(dict(exported, eagle_config=eagle), fh)
    report = {"sglang_ids": sglang_ids, "trained_ids": trained_ids, "rows": rows,
              "feature_max_rel_diff": feature_diff(draft), "off_by_one_feature_max_rel_diff": feature_diff(wrong),
              "accept_length": accept_length(draft), "off_by_one_accept_length": accept_length(wrong)}  # fmt: skip
finally:
    shutil.rmtree(wrong, ignore_errors=True)
print(json.dumps(report))
