"""Run inside a lab container: the reference engine's speculative output against its plain greedy output.

For every prompt, plain greedy decoding records the margin between the two best logits at each step; the
speculative output must be identical, or differ first at a step whose margin is an exact tie in float32
(below --tie), which is reported, never ignored. Prints one JSON line.
Usage: python lossless_check.py TARGET DRAFT PROMPTS.jsonl STEPS [MAX_NEW]
(the SGLang release whose loader the engine plays comes from EAGLE3_REFERENCE_SGLANG_VERSION, as in the unit)
"""

import json
import os
import sys

from serving.engine import Engine

target, draft, prompts_path, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
max_new = int(sys.argv[5]) if len(sys.argv) > 5 else 64
TIE = 1e-5
engine = Engine(target, draft, "EAGLE3", num_steps=steps,
                sglang_version=os.environ.get("EAGLE3_REFERENCE_SGLANG_VERSION"))
with open(prompts_path, encoding="utf-8") as fh:
    prompts = [json.loads(line)["prompt"] for line in fh if line.strip()]
identical = tokens = 0
ties, mismatches = [], []
for n, prompt in enumerate(prompts):
    ids = engine.encode(messages=[{"role": "user", "content": prompt}])
    gaps: list[float] = []
    plain = engine.generate(ids, max_new, speculative=False, gaps=gaps)["output_ids"]
    spec = engine.generate(ids, max_new)["output_ids"]
    tokens += len(plain)
    if plain == spec:
        identical += 1
        continue
    first = next((i for i, (a, b) in enumerate(zip(plain, spec, strict=False)) if a != b), min(len(plain), len(spec)))
    record = {"prompt": n, "position": first, "margin": gaps[first] if first < len(gaps) else None}
    (ties if record["margin"] is not None and record["margin"] <= TIE else mismatches).append(record)
print(json.dumps({"prompts": len(prompts), "identical": identical, "tokens": tokens, "ties": ties,
                  "mismatches": mismatches, "accept_length": engine.stats.accept_length()}))
