"""Same inputs through SGLang's LlamaForCausalLMEagle3 and the lab's reference engine: do they agree?

Run with .venv-sglang's Python: ``python tests/data/draft_parity.py DRAFT SGLANG_VERSION [SEED]``. Both load
DRAFT through their own loaders, then run the draft over one fresh sequence (token ids, positions and
random target features; float32). Prints JSON: the largest absolute difference of the normed output
(what the logits read) and of what the next draft step is fed, and which loader dropped what.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import torch

PAYLOADS = Path(__file__).resolve().parents[2] / "eagle3_ops" / "payloads"
sys.path.insert(0, str(PAYLOADS))

from sglang_check import cpu_shims  # noqa: E402

cpu_shims.apply(models=True)
from serving.engine import load_draft  # noqa: E402
from sglang_check import judge  # noqa: E402


def main() -> int:
    draft, version = sys.argv[1], sys.argv[2]
    seed = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    conf = json.loads(Path(draft, "config.json").read_text())
    n_aux = len(conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    target_hidden = conf.get("target_hidden_size") or conf["hidden_size"]
    gen = torch.Generator().manual_seed(seed)
    n = 7
    ids = torch.randint(0, conf["vocab_size"], (n,), generator=gen)
    positions = torch.arange(1, n + 1)
    feats = torch.randn(n, n_aux * target_hidden, generator=gen) * 3

    model = judge.load_model(draft)
    s_normed, s_fed = judge.draft_forward(model, ids, positions, feats)

    target = types.SimpleNamespace(num_hidden_layers=max(conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) + 3,
                                   hidden_size=target_hidden)  # fmt: skip
    d, _aux, info = load_draft(draft, target, "EAGLE3", version)
    with torch.no_grad():
        m = d.midlayer
        hid = d.features(feats)
        q, k, v = m.qkv(d.embed_tokens(ids), hid, positions)
        h = m.finish(m.attend(q, k, v, torch.ones(n, n, dtype=torch.bool).tril()), hid)
        r_normed, r_fed = d.norm(h), d.feed(h)
    print(json.dumps({
        "normed_max_abs": float((s_normed - r_normed).abs().max()),
        "fed_max_abs": float((s_fed - r_fed).abs().max()),
        "scale": float(s_normed.abs().max()),
        "fed_scale": float(s_fed.abs().max()),
        "reference_dropped": info["dropped"],
        "reference_line": info["sglang_line"],
    }))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
