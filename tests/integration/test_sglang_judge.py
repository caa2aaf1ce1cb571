"""SGLang 0.5.23 (the pinned CPU install in .venv-sglang) judges what eagle3-ops derives for it.

* Arguments: every row of the table goes through the project's filter and through SGLang's own
  ServerArgs resolution. Whatever the filter accepts, SGLang must run unchanged; whatever SGLang would
  rewrite or refuse, the filter must refuse. Rows the filter refuses although SGLang runs them are listed
  in STRICTER with the reason, so a change on either side shows up here.
* Weights: drafts written by eagle3_export go through SGLang's real LlamaForCausalLMEagle3.load_weights;
  every tensor must land in a parameter of the right shape (fused q/k/v and gate/up equal to their parts),
  and nothing may be dropped but t2d.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.conftest import ROOT
from tests.modules import run_module
from tests.unit.plugins.modules.test_eagle3_export import speculators_config
from tests.unit.plugins.modules.test_safetensors_remap import H, drafter_tensors

SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
PAYLOADS = ROOT / "eagle3_ops" / "payloads"

_spec = importlib.util.spec_from_file_location("eagle3_filter_sglang", ROOT / "plugins" / "filter" / "sglang.py")
assert _spec and _spec.loader
_filter = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_filter)


def judge(*args: str) -> tuple[int, dict]:
    if not SGLANG_PYTHON.exists():
        pytest.fail(f"{SGLANG_PYTHON} is missing: run scripts/bootstrap.sh (it installs the pinned SGLang)")
    proc = subprocess.run([str(SGLANG_PYTHON), "-m", "sglang_check.judge", *args], cwd=PAYLOADS,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


# (draft_tokens, topk, steps) as a user passes them: -e draft_tokens=N [-e speculative_topk=K -e speculative_steps=S]
# Trees at SGLang's limit, topk + (steps - 1) * topk^2 + 1: the last setting that runs and the first that fails at
# draft time, for several topk/steps (SGLang's documented example, steps 3 / topk 4 / 16, among them).
BOUNDARY = [(37, 4, 3), (38, 4, 3), (11, 2, 3), (12, 2, 3), (13, 3, 2), (14, 3, 2), (19, 2, 5), (20, 2, 5),
            (6, 5, 1), (7, 5, 1), (21, 4, 2), (22, 4, 2)]  # fmt: skip
TABLE = [
    (2, None, None), (4, None, None), (5, 1, 4), (16, None, None), (16, 1, 15), (64, None, None),  # chains
    (8, 4, 3), (8, 4, 5), (2, 2, 2), (16, 4, 3), (21, 4, 5), (22, 4, 5), (26, 8, 3), (64, 8, 3),  # trees
    *BOUNDARY,
    (16, 1, 3), (4, 1, 2), (1, None, None), (0, None, None), (65, None, None), (65, 8, 3), (69, 4, 5),
    (8, 4, None), (8, 0, 3), (-3, None, None),
]  # fmt: skip
# Refused by the filter although SGLang 0.5.23 runs them, and why the filter is right to refuse.
STRICTER = {
    (1, None, None): "one draft token is a chain of zero steps: no speculation at all",
    (65, None, None): "above sglang_serve_max_draft_tokens (64), the project's cap on verify width",
    (65, 8, 3): "above sglang_serve_max_draft_tokens (64), the project's cap on verify width",
    (69, 4, 5): "above sglang_serve_max_draft_tokens (64), the project's cap on verify width",
    (8, 4, None): "a tree needs its step count stated; SGLang would pick one the user did not ask for",
    (8, 0, 3): "topk 0 drafts nothing; SGLang accepts the value",
    (0, None, None): "zero draft tokens (steps -1): SGLang accepts the values as given",
    (-3, None, None): "negative draft tokens (steps -4): SGLang accepts the values as given",
}


def _raw_argv(tokens: int, topk: int | None, steps: int | None) -> list[str]:
    """What a hand-written command line would say for the row, bypassing the filter."""
    k = 1 if topk is None else topk
    s = steps if steps is not None else (tokens - 1 if k == 1 else 3)
    return ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(s),
            "--speculative-eagle-topk", str(k), "--speculative-num-draft-tokens", str(tokens)]  # fmt: skip


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Config-only target and draft directories: SGLang's resolution reads config.json and nothing else."""
    root = tmp_path_factory.mktemp("sglang-args")
    target, draft = root / "target", root / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4,
        "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "torch_dtype": "float32"}))  # fmt: skip
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "num_hidden_layers": 1, "vocab_size": 512, "draft_vocab_size": 256, "max_position_embeddings": 1024,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}))  # fmt: skip
    return {"target": target, "draft": draft}


@pytest.fixture(scope="module")
def verdicts(model_dirs, tmp_path_factory) -> dict[str, dict]:
    """SGLang's verdict on every row (filter-derived and raw) and a few hand-written lines, in one process."""
    base = ["--model-path", str(model_dirs["target"]), "--device", "cpu",
            "--speculative-draft-model-path", str(model_dirs["draft"])]  # fmt: skip
    cases = []
    for row in TABLE:
        cases.append({"id": f"raw {row}", "argv": base + _raw_argv(row[0], row[1], row[2])})
        if not _filter.sglang_speculative_problem(*row):
            cases.append({"id": f"filter {row}", "argv": base + _filter.sglang_speculative_args(*row)["argv"]})
    cases += [
        {"id": "unknown algorithm", "argv": [*base, "--speculative-algorithm", "EAGLE4"]},
        {"id": "unknown flag", "argv": [*base, "--speculative-drafts", "3"]},
        {"id": "EAGLE, not EAGLE3", "argv": [*base, *_raw_argv(4, 1, 3)[2:], "--speculative-algorithm", "EAGLE"]},
    ]
    path = tmp_path_factory.mktemp("sglang-cases") / "cases.json"
    path.write_text(json.dumps(cases))
    _rc, out = judge("args", "--json", str(path))
    assert out["sglang"] == "0.5.23"
    return {c["id"]: c for c in out["cases"]}


@pytest.mark.parametrize("row", TABLE, ids=[str(r) for r in TABLE])
def test_the_filter_and_sglang_agree(row, verdicts):
    problem = _filter.sglang_speculative_problem(*row)
    raw = verdicts[f"raw {row}"]
    if not problem:
        derived = verdicts[f"filter {row}"]
        assert derived["ok"], f"SGLang does not run what the filter derived for {row}: {derived.get('error')}"
        assert derived["resolved"] == derived["asked"]
        assert row not in STRICTER
    elif raw["ok"]:
        assert row in STRICTER, f"the filter refuses {row} ({problem}) but SGLang runs it unchanged"
    else:
        # SGLang would rewrite or refuse: the filter's refusal is the one the user sees, before anything changes.
        assert raw["stage"] in ("compare", "resolve", "parse", "draft")


@pytest.mark.parametrize(("last", "first"), list(zip(BOUNDARY[::2], BOUNDARY[1::2], strict=True)),
                         ids=[f"topk{r[1]}-steps{r[2]}" for r in BOUNDARY[::2]])  # fmt: skip
def test_the_tree_limit_is_sglangs_own_boundary(last, first, verdicts):
    # SGLang runs the last valid setting as asked and fails the next one at draft time; the filter agrees on both.
    assert verdicts[f"raw {last}"]["ok"], verdicts[f"raw {last}"].get("error")
    assert verdicts[f"filter {last}"]["ok"]
    failed = verdicts[f"raw {first}"]
    assert not failed["ok"] and failed["stage"] == "draft" and "selected index k out of range" in failed["error"]
    assert "exceeds what a tree of topk" in _filter.sglang_speculative_problem(*first)
    assert _filter.tree_limit(last[1], last[2]) == last[0]


def test_sglang_names_what_it_would_rewrite(verdicts):
    chain = verdicts[f"raw {(16, 1, 3)}"]
    assert not chain["ok"] and chain["resolved"]["speculative_num_draft_tokens"] == 4
    assert chain["error"] == "speculative-num-draft-tokens 16 would run as 4"
    assert "Unknown speculative algorithm name: EAGLE4" in verdicts["unknown algorithm"]["error"]
    assert "unrecognized arguments: --speculative-drafts 3" in verdicts["unknown flag"]["error"]
    # EAGLE with an EAGLE-3 draft resolves without complaint (and would accept ~1 token): the filter only
    # ever derives EAGLE3, and this row shows why the judge compares the algorithm too.
    assert verdicts["EAGLE, not EAGLE3"]["resolved"]["speculative_algorithm"] == "EAGLE"


def test_the_command_line_form_exits_1_naming_both_values(model_dirs):
    rc, out = judge("args", "--", "--model-path", str(model_dirs["target"]), "--device", "cpu",
                    "--speculative-draft-model-path", str(model_dirs["draft"]), *_raw_argv(16, 1, 3))  # fmt: skip
    assert rc == 1 and out["differences"] == [{"field": "speculative_num_draft_tokens", "asked": 16, "resolved": 4}]


def test_serve_asks_each_verdict_once_per_inputs_and_keeps_only_what_passed(model_dirs, tmp_path):
    """The deploy's call: a verdict kept for the same inputs is not asked again; a refusal is never kept."""
    kept = tmp_path / "verdicts"
    base = ["--model-path", str(model_dirs["target"]), "--device", "cpu",
            "--speculative-draft-model-path", str(model_dirs["draft"])]  # fmt: skip
    good = [*base, *_raw_argv(4, 1, 3)]
    # check mode: asked, nothing kept
    rc, out = judge("serve", "--verdicts", str(kept), "--no-keep", "--", *good)
    assert (rc, out["judged"], out["kept"]) == (0, ["args"], []) and not kept.exists()
    rc, out = judge("serve", "--verdicts", str(kept), "--", *good)
    assert (rc, out["judged"], out["args"]["ok"], out["sglang"]) == (0, ["args"], True, "0.5.23")
    assert len(list(kept.iterdir())) == 1
    rc, out = judge("serve", "--verdicts", str(kept), "--", *good)
    assert (rc, out["judged"], out["kept"]) == (0, [], ["args"])  # not asked again: SGLang is not imported
    # what SGLang would rewrite: refused (exit 1), named, and not kept (the next run asks again)
    bad = [*base, *_raw_argv(16, 1, 3)]
    rc, out = judge("serve", "--verdicts", str(kept), "--", *bad)
    assert (rc, out["failed"], out["judged"]) == (1, "args", ["args"])
    assert out["args"]["differences"] == [{"field": "speculative_num_draft_tokens", "asked": 16, "resolved": 4}]
    assert len(list(kept.iterdir())) == 1
    # --no-args with no draft asks nothing at all
    rc, out = judge("serve", "--verdicts", str(kept), "--no-args", "--", *bad)
    assert (rc, out["judged"], out["kept"]) == (0, [], [])


def test_serve_asks_both_verdicts_at_once_and_keeps_the_one_that_passed(model_dirs, tmp_path):
    """A first deploy asks about the command line and the draft together (two processes at once); the draft here has
    no weights, so its load is refused and named, while the command line's verdict, which passed, is kept."""
    kept = tmp_path / "verdicts"
    good = ["--model-path", str(model_dirs["target"]), "--device", "cpu",
            "--speculative-draft-model-path", str(model_dirs["draft"]), *_raw_argv(4, 1, 3)]  # fmt: skip
    rc, out = judge("serve", "--verdicts", str(kept), "--draft", str(model_dirs["draft"]), "--", *good)
    assert rc != 0 and out["failed"] == "load" and out["judged"] == ["args", "load"], out
    assert out["args"]["ok"] and not out["load"]["ok"]
    assert [p.name.split("-")[0] for p in kept.iterdir()] == ["args"]


# ---------------------------------------------------------------- weights


def _epoch(root: Path, conf: dict, tensors: dict[str, np.ndarray]) -> Path:
    d = root / "epoch"
    d.mkdir(parents=True)
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps(conf))
    return d


def _export(capsys, src: Path, dest: Path, **args) -> dict:
    res = run_module("eagle3_export", {"src": str(src), "dest": str(dest), **args}, capsys=capsys)
    assert not res.get("failed"), res.get("msg")
    return res


def _assert_every_tensor_lands(out: dict, draft: Path) -> None:
    assert out["ok"], out["problems"]
    names = set(load_file(str(draft / "model.safetensors")))
    assert set(out["landed"]) == names - {"d2t"}  # d2t becomes the hot-token map, checked by the judge
    assert out["dropped"] == [] and out["hot_token_map"]
    assert out["unloaded"] in ([], ["model.embed_tokens.weight"])  # the embedding comes from the target


@pytest.mark.parametrize("version", ["legacy", "0.5.23"])
def test_a_plain_export_loads_every_tensor_in_sglang(version, tmp_path, capsys):
    src = _epoch(tmp_path, speculators_config(), drafter_tensors())
    res = _export(capsys, src, tmp_path / "draft", sglang_version=version)
    assert bool(res["renames"]) == (version == "legacy")
    rc, out = judge("load", str(tmp_path / "draft"))
    assert rc == 0
    _assert_every_tensor_lands(out, tmp_path / "draft")
    q = "midlayer.self_attn.q_proj.weight" if version == "legacy" else "layers.0.self_attn.q_proj.weight"
    assert out["landed"][q] == ["model.layers.0.self_attn.qkv_proj.weight"]
    assert out["parameters"]["model.layers.0.self_attn.qkv_proj.weight"] == [2 * H, 2 * H]  # q 16 + k 8 + v 8 rows


def test_speculators_defaults_load_with_their_norms_on_0523(tmp_path, capsys):
    tensors = drafter_tensors()
    tensors["input_norm.weight"] = np.linspace(0.5, 1.5, 3 * H, dtype=np.float32)
    src = _epoch(tmp_path, speculators_config(norm_before_fc=True, norm_output=True), tensors)
    _export(capsys, src, tmp_path / "draft", sglang_version="0.5.23")
    rc, out = judge("load", str(tmp_path / "draft"))
    assert rc == 0
    _assert_every_tensor_lands(out, tmp_path / "draft")
    assert out["landed"]["input_norm.weight"] == ["model.input_norm.weight"]
    assert out["config"]["norm_before_fc"] and out["config"]["norm_output"]


def test_unrenamed_weights_are_exactly_what_the_legacy_line_dropped(tmp_path, capsys):
    """The seeds' failure, judged by SGLang 0.5.23: a speculators draft with SGLang's config but the
    input_norm of norm_before_fc, which the config does not announce, is dropped silently."""
    tensors = drafter_tensors()
    tensors["input_norm.weight"] = np.ones(3 * H, np.float32)
    src = _epoch(tmp_path, speculators_config(norm_before_fc=True), tensors)
    _export(capsys, src, tmp_path / "draft", sglang_version="0.5.23")
    conf = json.loads((tmp_path / "draft" / "config.json").read_text())
    conf["eagle_config"].pop("norm_before_fc")  # a hand-made config that forgets the feature
    (tmp_path / "draft" / "config.json").write_text(json.dumps(conf))
    rc, out = judge("load", str(tmp_path / "draft"))
    assert rc == 1 and out["dropped"] == ["input_norm.weight"]
    assert out["problems"] == ["input_norm.weight is dropped silently by SGLang's loader"]


def test_wrong_shapes_are_refused_by_sglang_itself(tmp_path, capsys):
    src = _epoch(tmp_path, speculators_config(), drafter_tensors())
    _export(capsys, src, tmp_path / "draft", sglang_version="0.5.23")
    tensors = load_file(str(tmp_path / "draft" / "model.safetensors"))
    tensors["fc.weight"] = np.zeros((H, 2 * H), np.float32)  # two aux layers' worth where the config says three
    save_file(tensors, str(tmp_path / "draft" / "model.safetensors"))
    rc, out = judge("load", str(tmp_path / "draft"))
    assert rc == 1 and any(p.startswith("SGLang refused fc.weight [16, 32]") for p in out["problems"])
    assert "nothing in the draft loads SGLang's parameter model.fc.weight" in out["problems"]


# ---------------------------------------------------------------- the reference engine computes SGLang's function


def _parity(draft: Path, version: str) -> dict:
    proc = subprocess.run([str(SGLANG_PYTHON), str(ROOT / "tests" / "data" / "draft_parity.py"), str(draft), version],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("features", "extra"),
    [
        ({}, {}),
        ({"norm_before_fc": True, "norm_output": True}, {"input_norm.weight": (3 * H,)}),  # speculators' defaults
        ({"fc_norm": True}, {f"fc_norm.{i}.weight": (H,) for i in range(3)}),
    ],
    ids=["plain", "speculators-defaults", "fc-norm"],
)
def test_the_reference_engine_computes_sglangs_draft_function(features, extra, tmp_path, capsys):
    rng = np.random.default_rng(1)
    tensors = drafter_tensors()
    tensors["embed_tokens.weight"] = rng.standard_normal((64, H), dtype=np.float32)
    for name in list(tensors):
        if name.endswith("norm.weight"):  # norms away from 1, so a norm applied in the wrong place shows
            tensors[name] = rng.uniform(0.5, 1.5, tensors[name].shape).astype(np.float32)
    tensors.update({name: rng.uniform(0.5, 1.5, shape).astype(np.float32) for name, shape in extra.items()})
    src = _epoch(tmp_path, speculators_config(**features), tensors)
    _export(capsys, src, tmp_path / "draft", sglang_version="0.5.23")
    got = _parity(tmp_path / "draft", "0.5.23")
    assert got["reference_dropped"] == [] and got["scale"] > 0.1
    # float32, different kernels (SGLang's rotary, our attention stand-in): relative 1e-5 of each output's scale
    assert got["normed_max_abs"] <= 1e-5 * max(1.0, got["scale"]), got
    assert got["fed_max_abs"] <= 1e-5 * max(1.0, got["fed_scale"]), got
    if features:
        # The same draft read by the legacy line (which knows none of these features) computes something else:
        # the comparison has teeth.
        legacy = _parity(tmp_path / "draft", "legacy")
        assert legacy["reference_dropped"] and max(legacy["normed_max_abs"], legacy["fed_max_abs"]) > 1e-2


GATE_PROBE = r"""
import json, sys
from sglang_check import cpu_shims
cpu_shims.torchvision_operator_schemas()
from sglang.srt.entrypoints.openai.protocol import (ChatCompletionRequest, ChatCompletionResponse,
    ChatCompletionResponseChoice, ChatMessage, UsageInfo)
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
chat, generate = json.loads(sys.stdin.read())
req = ChatCompletionRequest.model_validate(chat)
gen = GenerateReqInput(**generate)
params = SamplingParams(**gen.sampling_params)
answer = ChatCompletionResponse(id="chatcmpl-1", model=req.model, choices=[ChatCompletionResponseChoice(
    index=0, message=ChatMessage(role="assistant", content="a reply"), finish_reason="length")],
    usage=UsageInfo(prompt_tokens=9, completion_tokens=req.max_tokens, total_tokens=9 + req.max_tokens))
print(json.dumps({"chat": [req.messages[0].role, req.messages[0].content, req.max_tokens, req.temperature],
                  "generate": [gen.text, params.max_new_tokens, params.top_k],
                  "answer": json.loads(answer.model_dump_json())}))
"""


def test_sglang_takes_the_gates_smoke_requests_and_its_chat_answer_reads_back():
    """The smoke requests of eagle3.ops.sglang_service (chat, the default, and generate) are what SGLang 0.5.23's own
    request models accept, and what its chat response model writes is the text and token count the gate reads."""
    from ansible_collections.eagle3.ops.plugins.module_utils._gate import Gate

    params = {"url": "http://127.0.0.1:1", "max_tokens": 7}
    chat, generate = Gate({**params, "api": "chat"}).body("Say hi."), Gate({**params, "api": "generate"}).body("Hi")
    proc = subprocess.run([str(SGLANG_PYTHON), "-c", GATE_PROBE], cwd=PAYLOADS, input=json.dumps([chat, generate]),
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    # Greedy both ways: temperature 0 on the chat request; SamplingParams turns it into top_k 1 (its greedy form).
    assert got["chat"] == ["user", "Say hi.", 7, 0] and got["generate"] == ["Hi", 7, 1]
    assert Gate.reply(got["answer"], chat=True) == ("a reply", 7)
