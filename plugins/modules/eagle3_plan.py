#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3_plan
short_description: Disk, GPU memory and time each stage needs at the target's scale; refuse what cannot fit
description:
  - Reads the target's C(config.json) on the host (layers, hidden size, vocabulary, attention and expert shapes,
    quantization; a multimodal model's C(text_config)) and computes, for each stage in O(stages), what it will need
    and what it has to fit in, before anything runs. It only reads, so it runs in check mode on a host that has
    nothing installed yet.
  - V(regeneration) the prompts and the tokens expected; V(hidden_states) the bytes of speculators' files (aux
    layers and the last layer, bf16 or the fp8 store, and the token ids) on this host's share, against the free
    space where they will be written, less what an earlier run already wrote there; V(training) the starting
    token budget per GPU from the memory model calibrated on the seeds' run, steps per epoch from speculators'
    packing and the time from the throughput an earlier attempt logged on this host (else O(tokens_per_second),
    marked declared), and the exported draft's size; V(serving) GPU memory per server for the target's weights by
    their quantization, the draft and the KV cache at O(context_length) x O(concurrency), against O(mem_fraction)
    of one GPU.
  - A stage that cannot fit is refused in one sentence that names the numbers and the ways out, unless O(force)
    (then it is a warning).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  target_config:
    description: The target's C(config.json), or the model directory that holds it.
    type: path
    required: true
  stages:
    description: The stages to plan.
    type: list
    elements: str
    choices: [regeneration, hidden_states, training, serving]
    default: [regeneration, hidden_states, training]
  host:
    description: The host's inventory name, for the messages.
    type: str
    default: this host
  prompts:
    description: Prompts to regenerate (V(0) when not known yet).
    type: int
    default: 0
  prompts_file:
    description: A JSONL of prompts on the host (one per line) to count when O(prompts) is V(0) and the file exists.
    type: path
  max_tokens:
    description: The most tokens regeneration asks for per prompt (eagle3_data_max_tokens).
    type: int
    default: 2048
  prompt_tokens:
    description: Mean tokens of a prompt with its chat template, before regeneration has measured them.
    type: float
    default: 256
  samples:
    description: Samples with hidden states (the dataset's rows once prepared); V(0) takes O(prompts).
    type: int
    default: 0
  mean_tokens:
    description: Mean tokens per sample; V(0) takes O(prompt_tokens) + O(max_tokens) (an upper bound) until the
      dataset has measured them.
    type: float
    default: 0
  rows_summary:
    description: The data stage's summary of its rows on the host (C(rows), C(tokens)); when it exists, and neither
      O(samples) nor O(token_counts) is given, the plan sizes the hidden states and training from these measured
      counts instead of the estimate.
    type: path
  token_counts:
    description: The token count of each sample, when known (packing is planned from them).
    type: list
    elements: int
  hidden_path:
    description: Where the hidden states are written.
    type: path
  hidden_store:
    description: The hidden-state store (V(online) writes none).
    type: str
    choices: [file, fp8, online]
    default: file
  hidden_dtype_bytes:
    description: Bytes per value in the file store (2 for bf16, 4 for float32).
    type: int
    default: 2
  aux_layers:
    description: Auxiliary layers stored per token, besides the last layer.
    type: int
    default: 3
  shards:
    description: Trainers that extract a share each.
    type: int
    default: 1
  shared:
    description: Whether every shard writes to the same (shared) storage, which must then hold them all.
    type: bool
    default: true
  margin_percent:
    description: Room to keep beyond the estimate, in percent.
    type: float
    default: 5
  gpu_memory_mib:
    description: Memory of one GPU in MiB (nvidia-smi's memory.total).
    type: int
  gpus:
    description: GPUs per host (training ranks per node; a server's GPUs).
    type: int
    default: 1
  nodes:
    description: Hosts one training job spans.
    type: int
    default: 1
  draft_vocab:
    description: The draft's vocabulary (eagle3_train_draft_vocab_size).
    type: int
    default: 32000
  ttt_steps:
    description: Test-time-training steps (eagle3_train_ttt_steps).
    type: int
    default: 3
  total_seq_len:
    description: A budget set by hand (V(0) picks it from the memory model).
    type: int
    default: 0
  max_seq_len:
    description: The largest budget to start at.
    type: int
    default: 32768
  min_seq_len:
    description: The smallest budget worth trying.
    type: int
    default: 1024
  epochs:
    description: Training epochs.
    type: int
    default: 5
  val_ratio:
    description: The share of samples held out for validation.
    type: float
    default: 0.1
  train_state:
    description: The training job's state directory on this host; the last tokens/s an attempt logged there is the
      measured throughput.
    type: path
  tokens_per_second:
    description: Training throughput per GPU to plan with when no attempt has logged one (declared). The default is
      the seeds' run's (80M tokens of 4.6 TB of hidden states, 5 epochs in 10.8 h on 4 GPUs).
    type: float
    default: 2450
  tp_size:
    description: Tensor parallelism of a server (V(0) is its GPU count).
    type: int
    default: 0
  mem_fraction:
    description: SGLang's static memory fraction (weights and KV cache) of one GPU.
    type: float
    default: 0.85
  context_length:
    description: The context a server holds per request (V(0) is the target's max_position_embeddings).
    type: int
    default: 0
  concurrency:
    description: Requests a server holds at full context at once.
    type: int
    default: 1
  kv_dtype_bytes:
    description: Bytes per KV-cache value (2 for bf16, 1 for an fp8 KV cache).
    type: int
    default: 2
  draft_path:
    description: The exported draft a server loads (its size on disk, when there; else the estimate).
    type: path
  force:
    description: Proceed past refusals, with a warning (eagle3_plan_force).
    type: bool
    default: false
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Plan extraction and training before they start
  eagle3.ops.eagle3_plan:
    target_config: /models/Kimi-K2.5
    prompts: 83000
    hidden_path: /srv/eagle3/runs/kimi/data/hidden_states
    aux_layers: 3
    gpu_memory_mib: 97871
    gpus: 4
    ttt_steps: 5
  register: plan

- name: Refuse a server that cannot hold the target, its draft and the KV cache
  eagle3.ops.eagle3_plan:
    target_config: /models/Kimi-K2.5
    stages: [serving]
    gpu_memory_mib: 97871
    gpus: 8
    context_length: 32768
    concurrency: 8
"""

RETURN = r"""
plan:
  description: Each stage's figures (bytes, budget, steps, seconds, memory per GPU), the refusals, the warnings and
    the table.
  returned: always
  type: dict
  sample: {"stages": {"hidden_states": {"bytes": 4600842425344, "free": 12000000000000, "verdict": "ok"}},
           "refusals": [], "warnings": [], "table": ["stage | what | needs | against | verdict"]}
table:
  description: The plan as rows a person reads.
  returned: always
  type: list
  elements: str
"""

import json
import os
import re
import traceback
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._plan import (
    THROUGHPUT,
    Draft,
    Plan,
    PlanError,
    Target,
    bytes_under,
    log_tail,
    plan_hidden_states,
    plan_regen,
    plan_serving,
    plan_training,
)

ARGUMENT_SPEC: dict[str, Any] = {
    "target_config": {"type": "path", "required": True},
    "stages": {"type": "list", "elements": "str", "choices": ["regeneration", "hidden_states", "training", "serving"],
               "default": ["regeneration", "hidden_states", "training"]},
    "host": {"type": "str", "default": "this host"},
    "prompts": {"type": "int", "default": 0},
    "prompts_file": {"type": "path"},
    "max_tokens": {"type": "int", "default": 2048, "no_log": False},
    "prompt_tokens": {"type": "float", "default": 256, "no_log": False},
    "samples": {"type": "int", "default": 0},
    "mean_tokens": {"type": "float", "default": 0, "no_log": False},
    "rows_summary": {"type": "path"},
    "token_counts": {"type": "list", "elements": "int", "no_log": False},
    "hidden_path": {"type": "path"},
    "hidden_store": {"type": "str", "choices": ["file", "fp8", "online"], "default": "file"},
    "hidden_dtype_bytes": {"type": "int", "default": 2},
    "aux_layers": {"type": "int", "default": 3},
    "shards": {"type": "int", "default": 1},
    "shared": {"type": "bool", "default": True},
    "margin_percent": {"type": "float", "default": 5},
    "gpu_memory_mib": {"type": "int"},
    "gpus": {"type": "int", "default": 1},
    "nodes": {"type": "int", "default": 1},
    "draft_vocab": {"type": "int", "default": 32000},
    "ttt_steps": {"type": "int", "default": 3},
    "total_seq_len": {"type": "int", "default": 0},
    "max_seq_len": {"type": "int", "default": 32768},
    "min_seq_len": {"type": "int", "default": 1024},
    "epochs": {"type": "int", "default": 5},
    "val_ratio": {"type": "float", "default": 0.1},
    "train_state": {"type": "path"},
    "tokens_per_second": {"type": "float", "default": 2450, "no_log": False},
    "tp_size": {"type": "int", "default": 0},
    "mem_fraction": {"type": "float", "default": 0.85},
    "context_length": {"type": "int", "default": 0},
    "concurrency": {"type": "int", "default": 1},
    "kv_dtype_bytes": {"type": "int", "default": 2},
    "draft_path": {"type": "path"},
    "force": {"type": "bool", "default": False},
}
MIB = 1024**2


def measured_throughput(state: str | None) -> float | None:
    """The last ``tokens_per_s`` the newest attempt's log under ``state`` shows (speculators' profile line)."""
    if not state or not os.path.isdir(state):
        return None
    logs = sorted((f for f in os.listdir(state) if re.fullmatch(r"attempt-\d+\.log", f)),
                  key=lambda f: int(f[8:-4]))  # fmt: skip
    for name in reversed(logs):
        found = re.findall(THROUGHPUT, log_tail(os.path.join(state, name)))
        if found:
            return float(found[-1])
    return None


class Planner:
    """One host's plan for the stages asked, from its own config.json, disks and GPUs."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.plan = Plan()

    def target(self) -> Target:
        path = self.p["target_config"]
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as fh:
                return Target.from_config(json.load(fh))
        except OSError as exc:
            raise PlanError(f"Cannot read the target's config {path} ({exc.strerror}): point eagle3_target_path at the "
                            "model directory on this host") from exc  # fmt: skip
        except ValueError as exc:
            raise PlanError(f"The target's config {path} is not valid JSON ({exc}): fix or replace it") from exc

    def rows_summary(self) -> tuple[int, float] | None:
        """The data stage's measured rows and tokens, when it has them and nothing more precise was given."""
        path = self.p["rows_summary"]
        if self.p["samples"] or self.p["token_counts"] or not path or not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            rows, tokens = int(data["rows"]), int(data["tokens"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return (rows, tokens / rows) if rows > 0 else None

    def gpu_bytes(self) -> int:
        if not self.p["gpu_memory_mib"]:
            raise PlanError(f"No GPU memory to plan against on {self.p['host']}: read the GPUs first (gpu_facts) or "
                            "pass gpu_memory_mib")  # fmt: skip
        return int(self.p["gpu_memory_mib"]) * MIB

    def run(self) -> dict[str, Any]:
        p, t = self.p, self.target()
        stages = p["stages"]
        summary = self.rows_summary()
        if summary:
            p["samples"], p["mean_tokens"] = summary
        mean = p["mean_tokens"] or (p["prompt_tokens"] + p["max_tokens"])
        if not p["prompts"] and p["prompts_file"] and os.path.isfile(p["prompts_file"]):
            with open(p["prompts_file"], "rb") as fh:
                p["prompts"] = sum(1 for line in fh if line.strip())
        samples = p["samples"] or len(p["token_counts"] or []) or p["prompts"]
        if "regeneration" in stages:
            plan_regen(self.plan, p["prompts"], p["max_tokens"], p["prompt_tokens"])
        if "hidden_states" in stages:
            if not p["hidden_path"]:
                raise PlanError("The hidden_path is empty: name where the hidden states are written")
            already = bytes_under(p["hidden_path"]) if os.path.isdir(p["hidden_path"]) else 0
            plan_hidden_states(self.plan, t, samples=samples, mean_tokens=mean, token_counts=p["token_counts"],
                               aux_layers=p["aux_layers"], store=p["hidden_store"], path=p["hidden_path"],
                               shards=p["shards"], shared=p["shared"], margin=p["margin_percent"] / 100,
                               already=already, dtype_bytes=p["hidden_dtype_bytes"])  # fmt: skip
        if "training" in stages:
            measured = measured_throughput(p["train_state"])
            plan_training(self.plan, t, gpu_bytes=self.gpu_bytes(), gpus_per_node=p["gpus"], nodes=p["nodes"],
                          draft_vocab=p["draft_vocab"], ttt_steps=p["ttt_steps"],
                          total_seq_len=p["total_seq_len"] or None,
                          max_seq_len=p["max_seq_len"], min_seq_len=p["min_seq_len"], epochs=p["epochs"],
                          val_ratio=p["val_ratio"], samples=samples, mean_tokens=mean, token_counts=p["token_counts"],
                          tokens_per_second=measured or p["tokens_per_second"],
                          throughput_source="measured" if measured else "declared")  # fmt: skip
        if "serving" in stages:
            draft = p["draft_path"]
            size = bytes_under(draft) if draft and os.path.isdir(draft) else Draft.for_target(
                t, p["draft_vocab"], p["ttt_steps"]).export_bytes()
            plan_serving(self.plan, t, gpu_bytes=self.gpu_bytes(), gpus=p["gpus"], tp=p["tp_size"] or p["gpus"],
                         mem_fraction=p["mem_fraction"], context=p["context_length"] or t.max_positions,
                         concurrency=p["concurrency"], kv_dtype_bytes=p["kv_dtype_bytes"], draft_bytes=size,
                         host=p["host"])  # fmt: skip
        return self.plan.as_dict()


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    planner = Planner(module)
    try:
        plan = planner.run()
    except PlanError as exc:
        module.fail_json(msg=str(exc).rstrip(".") + ".", plan={}, table=[])
    except Exception as exc:
        module.fail_json(msg=f"eagle3_plan failed unexpectedly: {exc}", exception=traceback.format_exc())
    if plan["refusals"] and not module.params["force"]:
        module.fail_json(msg=f"{' '.join(plan['refusals'])} "
                             "(-e eagle3_plan_force=true proceeds anyway)", plan=plan, table=plan["table"])  # fmt: skip
    for refusal in plan["refusals"]:
        module.warn(f"Forced past a refusal: {refusal}")
    for warning in plan["warnings"]:
        module.warn(warning)
    module.exit_json(changed=False, plan=plan, table=plan["table"])


if __name__ == "__main__":
    main()
