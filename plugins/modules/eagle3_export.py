#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: eagle3_export
short_description: Turn a speculators EAGLE-3 checkpoint into a draft directory SGLang loads
description:
  - Reads a speculators epoch directory (C(config.json) + C(model.safetensors)) and writes an SGLang
    C(LlamaForCausalLMEagle3) draft, either into O(dest) or in place.
  - What SGLang loads and computes depends on its version (O(sglang_version)); the rules live in one table,
    one row per SGLang line (module_utils C(_eagle3.SGLANG_LINES)).
  - For the legacy line weights are renamed (C(layers.0.) to C(midlayer.), further layers to
    C(additional_layers.N.)) without loading tensor data; SGLang 0.5.23 and newer load C(layers.N.) as
    speculators writes them. C(t2d), which SGLang never loads, is dropped. The new C(config.json) carries the
    flat llama fields, C(draft_vocab_size), the target vocabulary, the aux layer ids under C(eagle_config)
    and the speculators features the line implements (C(norm_before_fc), C(fc_norm), C(norm_output)).
  - Refuses, naming the speculators training flags to retrain with, a checkpoint that computes something
    the SGLang line does not (for the legacy line norm before fc, per-aux fc norms, norm on the output,
    sliding-window attention, more than one draft layer; for every line norm before the residual), unless
    O(allow_incompatible) names the difference.
  - Aux layer ids are rewritten in SGLang's numbering - speculators (like vLLM) names a layer by the decoder
    layer it feeds, SGLang by the layer that produces it, so the same layers are one less - and the ids
    trained on are kept beside them (C(eagle3_ops_trained_layer_ids)). When the verifier named in the
    checkpoint is readable, the ids are checked against its layer count.
  - Checks that every tensor SGLang's loader expects is present with the right shape and that no tensor
    would be silently dropped, before anything is written.
  - Verifies the draft at O(dest) after a real run, whether it wrote it or found it up to date - its
    C(config.json) is what SGLang's EAGLE-3 loader reads and its weights' names and shapes are that config's - so
    a draft it returns without failing is one the SGLang line loads (C(verified)).
  - The speculators original stays loadable, in place too, since its C(config.json) and weights are kept under
    C(speculators/) (the weights as a hard link; the export writes a new file).
  - Writers of one draft are serialised, across hosts that mount one share too (C(deploy.yml) exports on every
    server into the one shared draft path). A real run holds the checkpoint lock of O(src) and O(dest) (the one
    C(eagle3.ops.safetensors_remap) takes, taken in one order) and reads the checkpoint only once it holds them;
    the second run then finds the draft up to date and changes nothing. New files get the mode an ordinary
    write gives (0666 less the umask); replaced ones keep theirs.
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  src:
    description: The speculators checkpoint directory (an epoch directory such as C(SAVE/4) or C(SAVE/checkpoint_best)).
    type: path
    required: true
  dest:
    description: Directory for the SGLang draft. Defaults to O(src) (export in place).
    type: path
  allow_incompatible:
    description: Differences from SGLang's llama EAGLE-3 to accept anyway (the draft will accept fewer tokens).
    type: list
    elements: str
    choices: [norm_before_fc, fc_norm, norm_output, norm_before_residual, sliding_window, layer_count]
    default: []
  sglang_version:
    description:
      - The SGLang release on the serving host, such as C(0.5.23), or C(legacy) for the rules every line loads.
      - Decides whether keys are renamed and which speculators features are servable.
    type: str
    default: legacy
  max_draft_layers:
    description: How many draft decoder layers the SGLang in use can load, when it differs from its line's rule.
    type: int
  lock_timeout:
    description: Seconds to wait for another run writing O(src) or O(dest) (on any host sharing them) before failing.
    type: float
    default: 300
  versions:
    description:
      - Export into an immutable version under O(dest), the draft root, instead of O(dest) itself - a new
        directory named by the content hash of what it is made of (the exported C(config.json), the checkpoint's
        weights and the renames), so an export never rewrites a draft a server loads, and the same checkpoint
        always gives the same version, whatever the files' times.
      - A version is written in a hidden staging directory, read back, then renamed into place whole; two runs
        exporting one checkpoint at once make one version. O(dest)'s C(versions.json) records which version each
        server serves (M(eagle3.ops.draft_versions)).
      - With O(src_optional) and no checkpoint, the record's C(current) version is verified and served.
    type: bool
    default: false
  src_optional:
    description:
      - Accept a missing O(src) when O(dest) already holds an exported draft (a deploy after the training run's
        checkpoints were removed, or an export done elsewhere); that draft is verified and served as it is.
      - With neither, the module fails naming both paths.
    type: bool
    default: false
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode:
    support: full
  diff_mode:
    support: full
    details: The diff shows config.json before and after.
  idempotent:
    support: full
"""

EXAMPLES = r"""
- name: Export the best epoch for SGLang 0.5.23 (keys kept, norm before fc and on the output served)
  eagle3.ops.eagle3_export:
    src: /srv/train/kimi-eagle3/checkpoint_best
    dest: /srv/drafts/kimi-eagle3
    sglang_version: 0.5.23

- name: Export in place, accepting a drafter trained with speculators' norm_before_residual default
  eagle3_export:
    src: /srv/train/run7/4
    allow_incompatible: [norm_before_residual]
"""

RETURN = r"""
dest:
  description: The SGLang draft directory (with O(versions), the version's directory under the draft root).
  returned: always
  type: str
version:
  description: The version's name (the first 16 hex digits of its content hash), with O(versions).
  returned: with O(versions), when a version was found or made (or would be, in check mode)
  type: str
  sample: 3f9c2a7be01d44c5
config:
  description: The SGLang draft config.json written (or that would be written).
  returned: success
  type: dict
renames:
  description: Tensor renames as [old, new] pairs.
  returned: always
  type: list
dropped:
  description: Tensors left out because SGLang does not load them.
  returned: always
  type: list
incompatibilities:
  description: Differences from SGLang's llama EAGLE-3 that were found (and allowed, on success).
  returned: always
  type: list
  elements: dict
sglang_line:
  description: The SGLang line whose rules were applied.
  returned: always
  type: str
  sample: "0.5.23"
aux_layer_ids:
  description:
    - The auxiliary layers, in the numbering the draft was trained in (C(trained), speculators and vLLM) and in
      the one written for SGLang (C(sglang)); C(target_layers) is the verifier's layer count when it was read.
  returned: when the checkpoint names its aux layers
  type: dict
  sample: {"trained": [2, 30, 58], "sglang": [1, 29, 57], "target_layers": 61}
server_args:
  description:
    - launch_server arguments the draft needs on that line (its sliding window, when it has one).
    - Read from the checkpoint, so empty when O(src) was absent (O(src_optional)).
  returned: always
  type: list
  elements: str
source_found:
  description: Whether O(src) had a checkpoint; false only with O(src_optional), when the draft at O(dest) is served.
  returned: always
  type: bool
verified:
  description: Whether the draft at O(dest) was read back and found loadable (false in check mode).
  returned: always
  type: bool
"""

import json
import os
import shutil
import traceback

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._atomic import (
    copy_file_atomic,
    stale_temporaries,
    write_json_atomic,
)
from ansible_collections.eagle3.ops.plugins.module_utils._eagle3 import (
    ExportError,
    SGLangLine,
    check_sglang_config,
    check_speculators_config,
    check_tensors,
    server_args,
    sglang_config,
    sglang_line,
)
from ansible_collections.eagle3.ops.plugins.module_utils._journal import (
    LockSet,
    recover,
)
from ansible_collections.eagle3.ops.plugins.module_utils._remap import (
    Plan,
    build_header,
    check_writable,
    plan,
    write_rewrite,
)
from ansible_collections.eagle3.ops.plugins.module_utils._safetensors import (
    SafetensorsError,
    encode_header,
    read_header,
)
from ansible_collections.eagle3.ops.plugins.module_utils._versions import (
    VersionError,
    content_digest,
    is_version,
    publish,
    read_record,
    staging_dir,
    version_name,
)

WEIGHTS = "model.safetensors"
ORIGINAL_DIR = "speculators"


def _read_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ExportError(f"{path} does not exist: point src at a speculators epoch directory") from None
    except ValueError as exc:
        raise ExportError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ExportError(f"{path} is not a JSON object")
    return data


def _rules(line: SGLangLine, layers: int) -> list[tuple[str, str]]:
    """Key renames speculators -> this SGLang line (none for lines that load layers.N natively)."""
    return [(f"layers.{i}.", line.layer_prefix(i)) for i in range(layers) if line.layer_prefix(i) != f"layers.{i}."]


def _target_layers(conf: dict) -> int | None:
    """The verifier's decoder layer count, when the checkpoint names a verifier directory that is readable here."""
    path = ((conf.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path")
    if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    try:
        verifier = _read_json(os.path.join(path, "config.json"))
    except ExportError:
        return None
    layers = (verifier.get("text_config") or verifier).get("num_hidden_layers")
    return layers if isinstance(layers, int) else None


def _same_data(src: str, pairs: list, dest_header) -> bool:
    """Whether each kept tensor's bytes in ``src`` are the bytes of its exported twin in the draft's weights."""
    src_start = read_header(src).data_start
    with open(src, "rb") as a, open(dest_header.path, "rb") as b:
        for (tensor, _new), twin in zip(pairs, dest_header.tensors, strict=True):
            left, at_a, at_b = tensor.end - tensor.begin, src_start + tensor.begin, dest_header.data_start + twin.begin
            while left:
                step = min(left, 1 << 22)
                if os.pread(a.fileno(), step, at_a) != os.pread(b.fileno(), step, at_b):
                    return False
                left, at_a, at_b = left - step, at_a + step, at_b + step
    return True


def _is_sglang(conf: dict) -> bool:
    return conf.get("architectures") == ["LlamaForCausalLMEagle3"]


ARGUMENT_SPEC = {
    "src": {"type": "path", "required": True},
    "dest": {"type": "path"},
    "allow_incompatible": {
        "type": "list",
        "elements": "str",
        "default": [],
        "choices": ["norm_before_fc", "fc_norm", "norm_output", "norm_before_residual", "sliding_window",
                    "layer_count"],
    },
    "sglang_version": {"type": "str", "default": "legacy"},
    "max_draft_layers": {"type": "int"},
    "lock_timeout": {"type": "float", "default": 300},
    "src_optional": {"type": "bool", "default": False},
    "versions": {"type": "bool", "default": False},
}


class Done(Exception):
    """Nothing (more) to write: the export is complete (a real run still verifies it)."""


class DraftExporter:
    """speculators epoch directory -> SGLang draft: check, plan, skip when up to date, write, verify."""

    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.src = self.p["src"].rstrip("/")
        self.dest = (self.p["dest"] or self.src).rstrip("/")
        self.in_place = os.path.realpath(self.dest) == os.path.realpath(self.src)
        self.weights = os.path.join(self.src, WEIGHTS)
        self.result: dict = {"changed": False, "dest": self.dest, "renames": [], "dropped": [], "incompatibilities": [],
                             "server_args": [], "source_found": True, "verified": False}  # fmt: skip
        self.line = sglang_line(None)

    def run(self) -> None:
        """Export under the locks of src and dest (check mode: no lock, nothing written)."""
        if self.p["lock_timeout"] < 0:
            raise ExportError(f"lock_timeout must be 0 or more seconds, not {self.p['lock_timeout']}")
        if not self.src:
            raise ExportError("src is empty: point it at the speculators epoch directory to export")
        if self.p["versions"]:
            Versioned(self).run()
            return
        if not os.path.isfile(os.path.join(self.src, "config.json")) and self.p["src_optional"]:
            self.served_as_is()
            return
        if self.module.check_mode or not os.path.isdir(self.src):
            try:
                self.export()
            except Done:
                pass
            return
        created = not os.path.isdir(self.dest)
        os.makedirs(self.dest, exist_ok=True)
        try:
            with LockSet([self.src, self.dest], self.p["lock_timeout"], "eagle3_export"):
                for stale in stale_temporaries([self.weights, os.path.join(self.dest, WEIGHTS),
                                                os.path.join(self.dest, "config.json")]):  # fmt: skip
                    os.unlink(stale)
                try:
                    self.export()
                except Done:
                    pass
                self.verify()  # written or up to date: read back, under the locks, before it is called done
        except BaseException:
            if created:
                try:
                    os.rmdir(self.dest)  # only while it is still empty: what this run made, nothing else
                except OSError:
                    pass
            raise

    def export(self) -> None:
        self.line = sglang_line(self.p["sglang_version"])
        self.result["sglang_line"] = self.line.name
        if self.p["max_draft_layers"] is not None and self.p["max_draft_layers"] < 1:
            raise ExportError("max_draft_layers must be 1 or more")
        if os.path.isdir(self.src) and os.path.exists(os.path.join(self.src, "model.safetensors.index.json")):
            raise ExportError(f"{self.src} is sharded; eagle3_export handles single-file drafters: "
                              "use safetensors_remap")
        src_conf = _read_json(os.path.join(self.src, "config.json"))
        if not self.module.check_mode:
            recover(self.weights)
        if _is_sglang(src_conf):
            self.already_exported(src_conf)
        self.check_compatible(src_conf)
        sg, header, pl, pairs = self.plan(src_conf)
        current = self.up_to_date(sg, pairs)
        self.result["changed"] = self.module.check_mode  # a real run says what reached the disk (write())
        if self.module._diff:
            self.result["diff"] = {
                "before": json.dumps(current if current is not None else src_conf, indent=2, sort_keys=True) + "\n",
                "after": json.dumps(sg, indent=2, sort_keys=True) + "\n",
                "before_header": os.path.join(self.dest, "config.json"),
                "after_header": os.path.join(self.dest, "config.json"),
            }
        if not self.module.check_mode:
            self.write(sg, header, pl)

    def served_as_is(self) -> None:
        """No checkpoint at src, and src_optional: the draft already at dest is verified and kept as it is."""
        self.result["source_found"] = False
        if self.in_place or not os.path.isfile(os.path.join(self.dest, "config.json")):
            raise ExportError(f"Neither a checkpoint at {self.src} nor an exported draft at {self.dest} exists: "
                              "run train.yml first, or point src at a speculators epoch directory")
        self.line = sglang_line(self.p["sglang_version"])
        self.result["sglang_line"] = self.line.name
        if self.module.check_mode:
            self.result["config"] = _read_json(os.path.join(self.dest, "config.json"))
            return
        with LockSet([self.dest], self.p["lock_timeout"], "eagle3_export"):  # not while a writer replaces it
            self.result["config"] = self.verify()

    def verify(self) -> dict:
        """Read the draft at dest back: a config SGLang's loader reads, and weights named and shaped after it."""
        path = os.path.join(self.dest, "config.json")
        conf = _read_json(path)
        problems = check_sglang_config(conf)
        if not problems:
            header = read_header(os.path.join(self.dest, WEIGHTS))
            problems = check_tensors(conf, {t.name: t.shape for t in header.tensors}, self.line)
        if problems:
            raise ExportError(f"The draft at {self.dest} is not one {self.line.label} loads ({'; '.join(problems)}): "
                              "export it again from its checkpoint (remove the draft, then rerun)")
        self.result["verified"] = True
        return conf

    def already_exported(self, conf: dict) -> None:
        """An SGLang draft given as src: verify it in place and change nothing."""
        header = read_header(self.weights)
        problems = check_tensors(conf, {t.name: t.shape for t in header.tensors}, self.line)
        if problems:
            raise ExportError(f"{self.src} is an SGLang draft with problems: {'; '.join(problems)}")
        if not self.in_place:
            raise ExportError(f"{self.src} is already an SGLang draft, not a speculators checkpoint: "
                              "use it as the draft")
        self.result["config"] = conf
        raise Done

    def check_compatible(self, conf: dict) -> None:
        found = check_speculators_config(conf, self.line, self.p["max_draft_layers"])
        self.result["server_args"] = server_args(conf, self.line)
        self.result["incompatibilities"] = [{"key": i.key, "reason": i.reason, "retrain_with": i.flag} for i in found]
        refused = [i for i in found if i.key not in self.p["allow_incompatible"]]
        if refused:
            reasons = "; ".join(i.reason for i in refused)
            flags = " ".join(i.flag for i in refused)
            keys = ", ".join(i.key for i in refused)
            raise ExportError(f"{self.src} computes something {self.line.label} does not "
                              f"({reasons}): retrain with {flags}, or accept the difference with allow_incompatible: "
                              f"[{keys}].")  # fmt: skip

    def plan(self, conf: dict):
        target_layers = _target_layers(conf)
        sg = sglang_config(conf, self.line, target_layers)
        if "eagle3_ops_trained_layer_ids" in sg:
            self.result["aux_layer_ids"] = {
                "trained": sg["eagle3_ops_trained_layer_ids"],
                "sglang": sg["eagle_config"]["eagle_aux_hidden_state_layer_ids"],
                "target_layers": target_layers,
            }
        header = read_header(self.weights)
        drop = ["^t2d$"]
        # A feature the line does not compute has no parameter there; the user accepted the difference.
        if "norm_before_fc" in self.p["allow_incompatible"] and "norm_before_fc" not in self.line.computes:
            drop.append(r"^input_norm\.weight$")
        if "fc_norm" in self.p["allow_incompatible"] and "fc_norm" not in self.line.computes:
            drop.append(r"^fc_norm\.\d+\.weight$")
        pl: Plan = plan(header, _rules(self.line, sg["num_hidden_layers"]), drop)
        # (original tensor, exported name), in header order, for the tensors that are kept
        pairs = list(zip([t for t in header.tensors if t.name not in pl.dropped], pl.new_names, strict=True))
        problems = check_tensors(sg, {new: t.shape for t, new in pairs}, self.line)
        if problems:
            raise ExportError(f"{self.src} cannot become a complete SGLang draft: {'; '.join(problems)}")
        self.result.update(config=sg, renames=[list(r) for r in pl.renames], dropped=pl.dropped)
        return sg, header, pl, pairs

    def up_to_date(self, sg: dict, pairs: list) -> dict | None:
        """The draft at dest's config (None when there is none); raises Done when dest already holds this export."""
        if self.in_place or not os.path.exists(os.path.join(self.dest, "config.json")):
            return None
        current = _read_json(os.path.join(self.dest, "config.json"))
        try:
            dest_header = read_header(os.path.join(self.dest, WEIGHTS))
            same_weights = [(t.name, t.shape, t.dtype) for t in dest_header.tensors] == [
                (new, t.shape, t.dtype) for t, new in pairs
            ] and dest_header.file_size - dest_header.data_start == sum(t.end - t.begin for t, _unused in pairs)
        except SafetensorsError:
            same_weights = False
        # By content, never by the files' times: an older checkpoint deployed again is written again.
        if current == sg and same_weights and _same_data(self.weights, pairs, dest_header):
            raise Done
        return current

    def write(self, sg: dict, header, pl: Plan) -> None:
        obj, copies = build_header(pl, compact=bool(pl.dropped))
        check_writable(os.path.join(self.dest, WEIGHTS))
        check_writable(os.path.join(self.dest, "config.json"))
        if self.in_place:
            keep = os.path.join(self.src, ORIGINAL_DIR)
            os.makedirs(keep, exist_ok=True)
            copy_file_atomic(os.path.join(self.src, "config.json"), os.path.join(keep, "config.json"))
            self.result["changed"] = True  # from here on, a failure part-way has changed something
            kept_weights = os.path.join(keep, WEIGHTS)
            if os.path.exists(kept_weights):
                os.unlink(kept_weights)
            # A new file replaces model.safetensors; the hard link keeps the original's inode intact.
            os.link(self.weights, kept_weights)
        else:
            os.makedirs(self.dest, exist_ok=True)
        write_rewrite(header, encode_header(obj), copies if pl.dropped else None, dest=os.path.join(self.dest, WEIGHTS))
        self.result["changed"] = True
        write_json_atomic(os.path.join(self.dest, "config.json"), sg)  # run() reads it back under the locks (verify)


class Versioned:
    """The export into an immutable version under the draft root (versions=true)."""

    def __init__(self, exporter: DraftExporter) -> None:
        self.x = exporter
        self.root = exporter.dest
        self.check = exporter.module.check_mode

    def run(self) -> None:
        x = self.x
        if x.in_place:
            raise ExportError(f"versions=true needs dest, a draft root of its own, not the checkpoint {x.src}: "
                              "set dest (eagle3_draft_path)")
        if os.path.exists(self.root) and not os.path.isdir(self.root):
            raise ExportError(f"The draft root {self.root} is a file: move it aside, or point dest elsewhere")
        if not os.path.isfile(os.path.join(x.src, "config.json")) and x.p["src_optional"]:
            self.serve_current()
            return
        if self.check:
            self.export()
            return
        os.makedirs(self.root, exist_ok=True)
        with LockSet([x.src, self.root], x.p["lock_timeout"], "eagle3_export"):
            self.export()

    def export(self) -> None:
        x = self.x
        x.line = sglang_line(x.p["sglang_version"])
        x.result["sglang_line"] = x.line.name
        if x.p["max_draft_layers"] is not None and x.p["max_draft_layers"] < 1:
            raise ExportError("max_draft_layers must be 1 or more")
        if os.path.exists(os.path.join(x.src, "model.safetensors.index.json")):
            raise ExportError(f"{x.src} is sharded; eagle3_export handles single-file drafters: use safetensors_remap")
        src_conf = _read_json(os.path.join(x.src, "config.json"))
        if _is_sglang(src_conf):
            raise ExportError(f"{x.src} is already an SGLang draft, not a speculators checkpoint: export its "
                              "speculators checkpoint, or serve it as the draft")
        if not self.check:
            recover(x.weights)
        x.check_compatible(src_conf)
        sg, header, pl, _pairs = x.plan(src_conf)
        version = version_name(content_digest([x.weights], {
            "format": 1, "config": sg, "renames": [list(r) for r in pl.renames], "dropped": pl.dropped}))
        final = os.path.join(self.root, version)
        x.result.update(version=version, dest=final)
        exists = os.path.isfile(os.path.join(final, "config.json"))
        if x.module._diff:
            current = read_record(self.root)["current"] if os.path.isdir(self.root) else None
            x.result["diff"] = {"before": f"current version: {current}\n", "after": f"serves version: {version}\n"}
        if self.check:
            x.result["changed"] = not exists
            return
        if exists:
            x.dest = final
            x.verify()
            return
        staging = staging_dir(self.root, version)
        try:
            x.dest = staging
            x.write(sg, header, pl)
            x.verify()
            x.result["changed"] = publish(staging, final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        x.dest = final
        x.result["dest"] = final

    def serve_current(self) -> None:
        """No checkpoint at src: the record's current version is verified and served as it is."""
        x = self.x
        x.result["source_found"] = False
        x.line = sglang_line(x.p["sglang_version"])
        x.result["sglang_line"] = x.line.name
        current = read_record(self.root)["current"] if os.path.isdir(self.root) else None
        if not current and os.path.isfile(os.path.join(self.root, "config.json")):
            # a draft exported before versions, at the root itself: served as it is, as before
            x.result["config"] = _read_json(os.path.join(self.root, "config.json")) if self.check else x.verify()
            return
        if not current or not is_version(current) or not os.path.isdir(os.path.join(self.root, current)):
            raise ExportError(f"Neither a checkpoint at {x.src} nor a current draft version under {self.root} exists: "
                              "run train.yml first, or point src at a speculators epoch directory")
        x.dest = os.path.join(self.root, current)
        x.result.update(version=current, dest=x.dest)
        if self.check:
            x.result["config"] = _read_json(os.path.join(x.dest, "config.json"))
            return
        x.result["config"] = x.verify()


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    exporter = DraftExporter(module)
    try:
        exporter.run()
    except (ExportError, SafetensorsError, VersionError) as exc:
        module.fail_json(msg=str(exc), **exporter.result)
    except OSError as exc:
        state = "part of the draft was written" if exporter.result["changed"] else "nothing was changed"
        module.fail_json(msg=f"Writing the draft to {exc.filename or exporter.dest} failed ({exc.strerror}); {state}: "
                         "free space or fix permissions, then rerun, which converges.", **exporter.result)  # fmt: skip
    except Exception as exc:
        module.fail_json(msg=f"eagle3_export failed unexpectedly: {exc}", exception=traceback.format_exc(),
                         **exporter.result)
    module.exit_json(**exporter.result)


if __name__ == "__main__":
    main()
