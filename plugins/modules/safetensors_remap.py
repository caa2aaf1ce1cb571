#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: safetensors_remap
short_description: Rename, drop and require tensors in safetensors checkpoints without loading tensor data
description:
  - Renames tensors by ordered prefix rules (default C(layers.0.) to C(midlayer.), what SGLang's
    EAGLE-3 loader expects of a speculators drafter), optionally drops tensors by pattern and checks that
    required tensors exist. C(__metadata__) is kept.
  - Only the header is read and validated (length, JSON, dtypes, spans = shape x dtype size, contiguous,
    inside the file, no duplicate names before or after renaming). Any problem fails with one sentence and
    leaves the file byte-identical.
  - When the new header fits in the old one it is rewritten in place behind an fsynced journal; an
    interrupted rewrite is rolled back the next time the module runs on the file. Otherwise (or when
    tensors are dropped) a temporary file beside the original gets the new header and a kernel copy of
    the data, is fsynced and checked, then atomically replaces the original.
  - Works on a single file, a directory, or a sharded checkpoint (C(model.safetensors.index.json) and its
    shards; the index's C(weight_map) is renamed too).
version_added: "0.1.0"
author: eagle3-ops
options:
  path:
    description:
      - A C(.safetensors) file, a C(model.safetensors.index.json), or a directory holding either.
    type: path
    required: true
  rules:
    description:
      - Ordered prefix rules; the first rule whose C(from) starts a name renames it.
    type: list
    elements: dict
    default: [{from: "layers.0.", to: "midlayer."}]
    suboptions:
      from:
        description: Prefix to replace.
        type: str
        required: true
      to:
        description: Replacement prefix.
        type: str
        required: true
  drop:
    description:
      - Regular expressions (searched in the original name); matching tensors are removed and the data
        section is compacted.
    type: list
    elements: str
    default: []
  require:
    description:
      - Tensor names (after renaming) that must exist, checked before anything is written.
    type: list
    elements: str
    default: []
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff lists the tensor names before and after.
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Make a speculators drafter loadable by SGLang (layers.0.* -> midlayer.*)
  safetensors_remap:
    path: /srv/drafts/kimi-eagle3/4/model.safetensors
    require: [midlayer.self_attn.q_proj.weight, fc.weight, lm_head.weight, d2t]

- name: Rename and drop in a sharded checkpoint
  safetensors_remap:
    path: /srv/drafts/big
    rules:
      - {from: "layers.0.", to: "midlayer."}
      - {from: "layers.", to: "additional_layers."}
    drop: ['^t2d$']
"""

RETURN = r"""
files:
  description: One entry per file looked at.
  returned: always
  type: list
  elements: dict
  sample: [{path: /srv/d/model.safetensors, method: in_place, renamed: 9, dropped: 0, tensors: 15, recovered: false}]
renames:
  description: The renames, as [old, new] pairs, over all files.
  returned: always
  type: list
  sample: [["layers.0.mlp.up_proj.weight", "midlayer.mlp.up_proj.weight"]]
dropped:
  description: Names of dropped tensors.
  returned: always
  type: list
  sample: ["t2d"]
index:
  description: Path of the sharded checkpoint's index, when there is one.
  returned: always
  type: str
  sample: /srv/d/model.safetensors.index.json
"""

import os
import traceback

from ansible.module_utils._safetensors import (
    INDEX_NAME,
    SafetensorsError,
    apply,
    plan,
    plan_names,
    read_header,
    read_index,
    recover,
    write_json_atomic,
)
from ansible.module_utils.basic import AnsibleModule


def find_targets(path: str) -> tuple[str | None, list[str]]:
    """(index path or None, shard/file paths) for a file, an index or a directory."""
    if os.path.isdir(path):
        index = os.path.join(path, INDEX_NAME)
        if os.path.exists(index):
            return find_targets(index)
        files = sorted(os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors"))
        if not files:
            raise SafetensorsError(f"{path} holds no .safetensors file and no {INDEX_NAME}")
        return None, files
    if not os.path.exists(path):
        raise SafetensorsError(f"{path} does not exist: point path at a .safetensors file, an index or a directory")
    if path.endswith(".json"):
        index = read_index(path)
        base = os.path.dirname(path)
        shards = sorted({os.path.join(base, f) for f in index["weight_map"].values()})
        missing = [s for s in shards if not os.path.exists(s)]
        if missing:
            raise SafetensorsError(f"{path} names shards that do not exist ({', '.join(missing)})")
        return path, shards
    return None, [path]


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "rules": {
                "type": "list",
                "elements": "dict",
                "default": [{"from": "layers.0.", "to": "midlayer."}],
                "options": {"from": {"type": "str", "required": True}, "to": {"type": "str", "required": True}},
            },
            "drop": {"type": "list", "elements": "str", "default": []},
            "require": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    p = module.params
    result = {"changed": False, "files": [], "renames": [], "dropped": [], "index": None}
    rules = [(r["from"], r["to"]) for r in p["rules"]]
    for r in p["rules"]:
        if not r["from"]:
            module.fail_json(msg="A rule's 'from' is empty, which would rename every tensor: give a prefix.", **result)
    try:
        index_path, files = find_targets(p["path"])
        result["index"] = index_path
        # Roll back any in-place rewrite that an earlier run did not finish, before reading headers.
        recovered = {f: (recover(f) if not module.check_mode else False) for f in files}
        plans = [plan(read_header(f), rules, p["drop"]) for f in files]
        # Names must stay unique across shards too.
        all_new = [n for pl in plans for n in pl.new_names]
        plan_names(p["path"], all_new, [], [])
        missing = [name for name in p["require"] if name not in set(all_new)]
        if missing:
            module.fail_json(
                msg=f"{p['path']} lacks the required tensors {', '.join(missing)} (after renaming): "
                "check the rules or the checkpoint.",
                **result,
            )
        index_obj = read_index(index_path) if index_path else None
        index_changed = False
        if index_obj is not None:
            mapping = {old: new for pl in plans for old, new in pl.renames}
            dropped_all = {d for pl in plans for d in pl.dropped}
            new_map = {
                mapping.get(name, name): shard
                for name, shard in index_obj["weight_map"].items()
                if name not in dropped_all
            }
            index_changed = new_map != index_obj["weight_map"]
            index_obj["weight_map"] = new_map
        for pl in plans:
            method = "none"
            if pl.changed and not module.check_mode:
                method = apply(pl)
            elif pl.changed:
                method = "in_place" if not pl.dropped else "rewrite"
            result["files"].append(
                {
                    "path": pl.header.path,
                    "method": method,
                    "renamed": len(pl.renames),
                    "dropped": len(pl.dropped),
                    "tensors": len(pl.new_names),
                    "recovered": recovered[pl.header.path],
                }
            )
            result["renames"] += [list(r) for r in pl.renames]
            result["dropped"] += pl.dropped
        if index_changed and not module.check_mode:
            write_json_atomic(index_path, index_obj)
        result["changed"] = bool(result["renames"] or result["dropped"] or index_changed or any(recovered.values()))
        if module._diff and result["changed"]:
            before = sorted(n for pl in plans for n in pl.header.names)
            result["diff"] = {
                "before": "\n".join(before) + "\n",
                "after": "\n".join(sorted(all_new)) + "\n",
                "before_header": p["path"],
                "after_header": p["path"],
            }
    except SafetensorsError as exc:
        module.fail_json(msg=str(exc), **result)
    except OSError as exc:
        where = exc.filename or p["path"]
        module.fail_json(
            msg=f"Writing {where} failed ({exc.strerror}); the original is unchanged: free space or fix permissions.",
            **result,
        )
    except Exception as exc:
        module.fail_json(
            msg=f"safetensors_remap failed unexpectedly: {exc}", exception=traceback.format_exc(), **result
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
