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
    shards). The index's C(weight_map) converges on every run to the tensors the shards hold, whatever an
    earlier, interrupted run left behind; a failure part-way says which files were rewritten and which not.
  - Runs on one checkpoint are serialised, from one host or from several that mount one share (NFS). A real run
    holds an advisory lock on the checkpoint's directory (C(fcntl) record locks, which NFS forwards to its
    server; the file C(.eagle3-checkpoint.lock) names the holder and is removed on release) and reads the
    headers it rewrites only once it holds it. A run that cannot get the lock within O(lock_timeout) fails
    naming the run that holds it and since when, and changes nothing. C(eagle3.ops.eagle3_export) takes the same
    lock. Check mode takes no lock and writes nothing.
  - Every byte range is written whole or the run fails before the original is touched (a full disk leaves the
    file as it was and no journal behind). Temporary files are named C(.NAME.tmp-HOST-PID-RANDOM), unique
    across containers that share a directory; those of killed runs are removed under the lock and reported.
    Check mode predicts the recovery of a pending journal exactly as a real run would carry it out.
  - The renamed header is validated with the same rules as every read (no reserved name such as
    C(__metadata__), spans, dtypes) before either write path writes a byte. A file this user could not write
    is refused on both paths. A replaced file keeps its mode and owner; a new file gets 0666 less the umask.
  - A path that is a symbolic link (a Hugging Face cache entry pointing into its blobs) is replaced by a
    regular file holding the result; the file it pointed to is left unchanged. Both write paths do this.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
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
  lock_timeout:
    description:
      - Seconds to wait for another run (on this host or another one sharing the directory) to release the
        checkpoint's lock before failing.
    type: float
    default: 300
extends_documentation_fragment:
  - eagle3.ops.attributes
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
index_changes:
  description:
    - How the index's weight_map converges, C(renamed) names by the rules, names C(added) because a shard holds
      them and the index did not list them, names C(removed) because no shard holds them.
  returned: always
  type: dict
  sample: {renamed: 10, added: [], removed: []}
removed_temporaries:
  description: Temporary files of killed runs (C(.NAME.tmp-HOST-PID-RANDOM)) removed under the lock before writing.
  returned: always
  type: list
  elements: str
  sample: [/srv/d/.model.safetensors.tmp-trainer1-4121-5f0c2a9e]
"""

import os
import traceback
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._atomic import (
    stale_temporaries,
    write_json_atomic,
)
from ansible_collections.eagle3.ops.plugins.module_utils._journal import (
    CheckpointLock,
    read_header_as_recovered,
    recover,
)
from ansible_collections.eagle3.ops.plugins.module_utils._remap import (
    Plan,
    apply,
    check_writable,
    method_for,
    new_header_bytes,
    plan,
    plan_names,
    rename,
    validate_new_header,
)
from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import (
    INDEX_NAME,
    SafetensorsError,
    read_header,
    read_index,
)


def find_targets(path: str) -> tuple[str | None, list[str]]:
    """(index path or None, shard/file paths) for a file, an index or a directory."""
    if os.path.isdir(path):
        index_path = os.path.join(path, INDEX_NAME)
        if os.path.exists(index_path):
            return find_targets(index_path)
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


class Progress:
    """What has been written so far, so that a failure part-way can say exactly what changed."""

    def __init__(self) -> None:
        self.rewritten: list[str] = []
        self.index_written = False
        self.recovered: list[str] = []
        self.removed: list[str] = []

    @property
    def changed(self) -> bool:
        """Whether anything on disk changed so far."""
        return bool(self.rewritten or self.index_written or self.recovered or self.removed)


class SafetensorsRemapper:
    """One run of the module: plan every file, then (unless in check mode) carry the plan out."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.params = module.params
        self.check = module.check_mode
        self.rules = [(r["from"], r["to"]) for r in self.params["rules"]]
        self.result: dict[str, Any] = {
            "changed": False, "files": [], "renames": [], "dropped": [], "index": None, "removed_temporaries": [],
            "index_changes": {"renamed": 0, "added": [], "removed": []},
        }  # fmt: skip
        self.progress = Progress()

    def fail(self, msg: str) -> None:
        if not self.check:
            self.result["changed"] = self.progress.changed  # what happened on disk before the failure
        self.module.fail_json(msg=msg, **self.result)

    def validate(self) -> None:
        for r in self.params["rules"]:
            if not r["from"]:
                self.fail("A rule's 'from' is empty, which would rename every tensor: give a prefix.")
        if self.params["lock_timeout"] < 0:
            self.fail(f"lock_timeout must be 0 or more seconds, not {self.params['lock_timeout']}.")

    def run(self) -> None:
        """Plan and write under the checkpoint directory's lock (check mode: no lock, nothing written)."""
        path = self.params["path"]
        if self.check or not os.path.exists(path):
            self.remap()
            return
        directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
        with CheckpointLock(directory, self.params["lock_timeout"], "safetensors_remap"):
            self.remap()

    def remap(self) -> None:
        index_path, files = find_targets(self.params["path"])
        self.result["index"] = index_path
        self.clean_temporaries([*files, *([index_path] if index_path else [])])
        headers, recovered = self.headers(files)
        plans = [plan(h, self.rules, self.params["drop"]) for h in headers]
        all_new = [n for pl in plans for n in pl.new_names]
        plan_names(self.params["path"], all_new, [], [])  # names stay unique across shards too
        missing = [name for name in self.params["require"] if name not in set(all_new)]
        if missing:
            self.fail(f"{self.params['path']} lacks the required tensors {', '.join(missing)} (after renaming): "
                      "check the rules or the checkpoint.")
        index_obj = self.converge_index(index_path, plans) if index_path else None
        for pl in plans:
            if pl.changed:
                validate_new_header(pl.header, *new_header_bytes(pl)[1:])  # as either write path will
                check_writable(pl.header.path)
        if index_path and index_obj is not None:
            check_writable(index_path)
        self.report_plans(plans, recovered)
        if not self.check:
            self.write(plans, index_path, index_obj)
        self.result["changed"] = bool(
            self.result["renames"] or self.result["dropped"] or any(recovered.values())
            or self.result["removed_temporaries"] or index_obj is not None
        )  # fmt: skip
        if self.module._diff and self.result["changed"]:
            self.result["diff"] = {
                "before": "\n".join(sorted(n for pl in plans for n in pl.header.names)) + "\n",
                "after": "\n".join(sorted(all_new)) + "\n",
                "before_header": self.params["path"],
                "after_header": self.params["path"],
            }

    def clean_temporaries(self, paths: list[str]) -> None:
        stale = stale_temporaries(paths, locked=not self.check)
        if not self.check:
            for path in stale:
                os.unlink(path)
                self.progress.removed.append(path)
        self.result["removed_temporaries"] = stale

    def headers(self, files: list[str]) -> tuple[list, dict[str, bool]]:
        """Each file's header as it is after recovering an interrupted in-place write (predicted in check mode)."""
        headers, recovered = [], {}
        for f in files:
            if self.check:
                header, recovered[f] = read_header_as_recovered(f)
            else:
                recovered[f] = recover(f)
                if recovered[f]:
                    self.progress.recovered.append(f)
                header = read_header(f)
            headers.append(header)
        return headers, recovered

    def converge_index(self, index_path: str, plans: list[Plan]) -> dict[str, Any] | None:
        """The index with a weight_map that matches the shards after this run, or None when it already does.

        The rules are applied to the index's own names (so names an earlier run renamed in the shards but not
        in the index are caught), then the map is checked against what each shard will hold: names no shard
        holds are removed, names the index lacks are added, so the index converges whatever happened before.
        """
        index_obj = read_index(index_path)
        base = os.path.dirname(index_path)
        holder = {name: os.path.relpath(pl.header.path, base) for pl in plans for name in pl.new_names}
        dropped = {d for pl in plans for d in pl.dropped}
        new_map: dict[str, str] = {}
        renamed = 0
        for name in index_obj["weight_map"]:
            new_name = rename(name, self.rules)
            renamed += new_name != name
            if name in dropped or new_name not in holder:
                continue
            new_map[new_name] = holder[new_name]
        removed = sorted(n for n in index_obj["weight_map"] if rename(n, self.rules) not in new_map)
        added = sorted(n for n in holder if n not in new_map)
        for name in added:
            new_map[name] = holder[name]
        self.result["index_changes"] = {"renamed": renamed, "added": added, "removed": removed}
        if new_map == index_obj["weight_map"]:
            return None
        index_obj["weight_map"] = new_map
        return index_obj

    def report_plans(self, plans: list[Plan], recovered: dict[str, bool]) -> None:
        for pl in plans:
            self.result["files"].append({
                "path": pl.header.path, "method": method_for(pl), "renamed": len(pl.renames),
                "dropped": len(pl.dropped), "tensors": len(pl.new_names), "recovered": recovered[pl.header.path],
            })  # fmt: skip
            self.result["renames"] += [list(r) for r in pl.renames]
            self.result["dropped"] += pl.dropped

    def write(self, plans: list[Plan], index_path: str | None, index_obj: dict[str, Any] | None) -> None:
        for pl in plans:
            if pl.changed:
                apply(pl)
                self.progress.rewritten.append(pl.header.path)
        if index_path and index_obj is not None:
            write_json_atomic(index_path, index_obj)
            self.progress.index_written = True

    def describe_failure(self, where: str, why: str) -> str:
        """One sentence: what failed, what was and was not changed, and the fix."""
        done = self.progress.rewritten
        todo = [f["path"] for f in self.result["files"] if f["method"] != "none" and f["path"] not in done]
        index = self.result["index"]
        if not done:
            state = "the original is unchanged" if not index else "no file was changed"
        else:
            state = f"already rewritten: {', '.join(done)}"
            if todo:
                state += f"; not rewritten: {', '.join(todo)}"
            if index and not self.progress.index_written:
                state += f"; {index} still lists the old names"
        return f"Writing {where} failed ({why}); {state}: free space or fix permissions, then rerun, which converges."


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
            "lock_timeout": {"type": "float", "default": 300},
        },
        supports_check_mode=True,
    )
    remapper = SafetensorsRemapper(module)
    remapper.validate()
    try:
        remapper.run()
    except SafetensorsError as exc:
        remapper.fail(str(exc))
    except OSError as exc:
        remapper.fail(remapper.describe_failure(exc.filename or module.params["path"], exc.strerror or str(exc)))
    except Exception as exc:
        module.fail_json(msg=f"safetensors_remap failed unexpectedly: {exc}", exception=traceback.format_exc(),
                         **remapper.result)
    module.exit_json(**remapper.result)


if __name__ == "__main__":
    main()
