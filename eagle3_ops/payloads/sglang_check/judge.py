"""SGLang judges what eagle3-ops derives: its own argument resolution and its own EAGLE-3 weight loader.

Run with the serving host's Python (the one that has SGLang), from the payload directory::

    python -m sglang_check.judge args  [--json CASES.json | -- LAUNCH_SERVER ARGS...]
    python -m sglang_check.judge load  DRAFT_DIR
    python -m sglang_check.judge serve --verdicts DIR [--draft DRAFT] [--no-args] [--no-keep] -- LAUNCH_SERVER ARGS...

Both print one JSON object on stdout and exit 0 when SGLang accepts what was given, 1 when it does not
(the JSON says why), 2 when the check itself could not run. ``load_model`` and ``draft_forward`` run SGLang's
draft model itself (the tests compare it with the lab's reference engine, tests/data/draft_parity.py).

``args`` runs ``ServerArgs.add_cli_args`` -> ``from_cli_args`` -> ``resolve_once`` ->
``check_server_args`` -> ``resolved_dict`` on the exact command line, and compares every speculative
value that was asked for with what SGLang resolved it to: SGLang rewrites inconsistent values with a
warning instead of refusing them (EAGLE3, topk 1, 3 steps, 16 draft tokens runs with 4 draft tokens).

``serve`` is what a deploy asks (the role sglang_serve, one call per server): both verdicts, each kept as an empty
file named by the hash of its inputs under ``--verdicts`` - the command line and SGLang's release; the draft's files
(path, size, mtime, inode) and the release. A verdict kept for the same inputs is not asked again: a setting switch
of the same draft asks about its command line only, and a rerun about nothing (importing SGLang is seconds). Each
verdict that is asked runs in its own process (``args`` and ``load`` need different shims before SGLang is imported).

``load`` builds ``LlamaForCausalLMEagle3`` from the draft's config.json in a one-process gloo group and
feeds every tensor of the draft through the real ``load_weights``, one at a time, watching which
parameter elements each one writes (parameters start as NaN). It reports where each tensor landed, what
was dropped, which parameters nothing wrote, and checks the fused q/k/v and gate/up parameters and the
hot-token map against the tensors they came from.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
from typing import Any

try:
    from . import cpu_shims
except ImportError:  # pragma: no cover - run as a loose script
    import cpu_shims  # type: ignore[no-redef]

# The speculative values SGLang may resolve differently from what was asked, by ServerArgs field.
SPECULATIVE_FIELDS = (
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
)
# Dropped by the loader on purpose: SGLang maps draft ids to target ids with d2t alone.
DOCUMENTED_DROPS = {"t2d"}
# Parameters SGLang fills from the target model when the draft has none.
FROM_TARGET = {"model.embed_tokens.weight"}


def _emit(result: dict[str, Any], code: int) -> int:
    print(json.dumps(result, sort_keys=True, default=str))
    return code


def _sglang_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


# ---------------------------------------------------------------- args


def judge_args(argv: list[str]) -> dict[str, Any]:
    """SGLang's verdict on one launch_server command line (the arguments after ``launch_server``)."""
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang.launch_server", exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = parser.parse_args(argv)
    except argparse.ArgumentError as exc:
        return {"ok": False, "stage": "parse", "error": str(exc)}
    except SystemExit:  # argparse's own exit (unknown flags): its last line says why
        return {"ok": False, "stage": "parse", "error": " ".join(err.getvalue().strip().splitlines()[-1:])}
    asked = {f: getattr(ns, f, None) for f in SPECULATIVE_FIELDS if getattr(ns, f, None) is not None}
    try:
        server_args = ServerArgs.from_cli_args(ns)
        with contextlib.redirect_stdout(io.StringIO()):
            server_args.resolve_once()
            server_args.check_server_args()
        resolved_all = server_args.resolved_dict()
    except Exception as exc:  # SGLang refuses with ValueError, AssertionError, RuntimeError ...
        return {"ok": False, "stage": "resolve", "error": f"{type(exc).__name__}: {exc}", "asked": asked}
    resolved = {f: resolved_all.get(f) for f in SPECULATIVE_FIELDS}
    differences = [
        {"field": f, "asked": v, "resolved": resolved[f]}
        for f, v in asked.items()
        if str(v).upper() != str(resolved[f]).upper()
    ]
    result: dict[str, Any] = {"ok": not differences, "stage": "compare", "asked": asked, "resolved": resolved,
                              "differences": differences}  # fmt: skip
    if differences:
        result["error"] = "; ".join(
            f"{d['field'].replace('_', '-')} {d['asked']} would run as {d['resolved']}" for d in differences
        )
        return result
    topk, steps, tokens = (int(resolved.get(f) or 0) for f in ("speculative_eagle_topk", "speculative_num_steps",
                                                               "speculative_num_draft_tokens"))  # fmt: skip
    if str(resolved.get("speculative_algorithm", "")).upper() in ("EAGLE", "EAGLE3") and topk > 1 and steps > 0:
        problem = judge_tree(topk, steps, tokens)
        if problem:
            result.update(ok=False, stage="draft", error=problem)
    return result


def judge_tree(topk: int, steps: int, num_draft_tokens: int) -> str | None:
    """Run SGLang's own tree drafting on one sequence: why it fails at draft time, or None when it runs.

    The draft worker's loop (``EAGLEWorkerV2.draft_forward``) without a model: each step's candidates from
    ``select_top_k_tokens`` (topk at the first step, topk * topk after), then ``organize_draft_results``, which
    picks the best ``num_draft_tokens - 1`` of them for the verify. Random distributions stand in for the draft's
    logits; the shapes, which decide the outcome, are SGLang's.
    """
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # SGLang compiles a step function; eager computes the same
    import torch
    from sglang.srt.speculative.eagle_utils import organize_draft_results
    from sglang.srt.speculative.spec_utils import select_top_k_tokens

    gen = torch.Generator().manual_seed(0)
    vocab = max(64, 4 * topk)

    def proposals(rows: int) -> tuple[Any, Any]:
        return torch.topk(torch.softmax(torch.randn(rows, vocab, generator=gen), -1), topk, dim=-1)

    topk_p, topk_index = proposals(1)
    hidden = scores = None
    score_list, token_list, parents_list = [], [], []
    try:
        for i in range(steps):
            input_ids, hidden, scores, tree_info = select_top_k_tokens(i, topk_p, topk_index, hidden, scores, topk)
            score_list.append(tree_info[0])
            token_list.append(tree_info[1])
            parents_list.append(tree_info[2])
            if i == steps - 1:
                break
            topk_p, topk_index = proposals(input_ids.shape[0])
        organize_draft_results(score_list, token_list, parents_list, num_draft_tokens)
    except (RuntimeError, IndexError, ValueError) as exc:
        return f"drafting fails: {type(exc).__name__}: {exc}"
    return None


def cmd_args(ns: argparse.Namespace) -> int:
    cpu_shims.apply()
    if ns.json:
        with open(ns.json, encoding="utf-8") as fh:
            cases = json.load(fh)
        results = [dict(judge_args([str(a) for a in case["argv"]]), id=case.get("id")) for case in cases]
        return _emit({"sglang": _sglang_version(), "cases": results}, 0 if all(r["ok"] for r in results) else 1)
    result = judge_args(ns.argv)
    result["sglang"] = _sglang_version()
    return _emit(result, 0 if result["ok"] else 1)


# ---------------------------------------------------------------- load


def _single_process_group() -> None:
    """World of one over gloo: SGLang's parallel layers need model-parallel groups even at tp 1."""
    import torch
    from sglang.srt.distributed import parallel_state
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
        model_parallel_is_initialized,
    )
    from sglang.srt.runtime_context import SpawnRanks, get_parallel, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if not torch.distributed.is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo")
    if not model_parallel_is_initialized():
        reset_context()
        publish(ServerArgs(model_path="dummy", tp_size=1, pp_size=1, device="cpu"), role="test",
                ranks=SpawnRanks(world_rank=0))  # fmt: skip
        # Publishing resets the context; the WORLD group built above must survive it (as in SGLang's tests).
        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        initialize_model_parallel(backend="gloo")


def build_model(draft: str) -> Any:
    """SGLang's LlamaForCausalLMEagle3 for the draft's config.json, in float32, no weights loaded yet."""
    import torch
    from transformers import AutoConfig

    torch.set_default_dtype(torch.float32)  # exact comparisons: bf16/fp16 tensors widen without loss
    _single_process_group()
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

    return LlamaForCausalLMEagle3(AutoConfig.from_pretrained(draft))


def judge_load(draft: str) -> dict[str, Any]:
    import torch
    from safetensors import safe_open

    model = build_model(draft)
    config = model.config
    params = dict(model.named_parameters())
    with torch.no_grad():
        for p in params.values():
            p.fill_(float("nan"))
    files = sorted(f for f in os.listdir(draft) if f.endswith(".safetensors"))
    if not files:
        raise FileNotFoundError(f"{draft} has no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        with safe_open(os.path.join(draft, name), framework="pt") as fh:
            for key in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                tensors[key] = fh.get_tensor(key)
    landed: dict[str, list[str]] = {}
    refused: list[str] = []
    for key, tensor in tensors.items():
        before = {n: int(torch.isnan(p).sum()) for n, p in params.items()}
        try:
            model.load_weights([(key, tensor)])
        except AssertionError as exc:  # default_weight_loader's shape check
            refused.append(f"{key} {list(tensor.shape)}: {exc}")
            continue
        landed[key] = [n for n, p in params.items() if int(torch.isnan(p).sum()) < before[n]]
    hot = model.get_hot_token_id()
    consumed = {k for k in tensors if k == "d2t" or k.endswith(".d2t")} if hot is not None else set()
    dropped = sorted(k for k, where in landed.items() if not where and k not in consumed)
    unloaded = sorted(n for n, p in params.items() if bool(torch.isnan(p).any()))
    problems = [f"SGLang refused {r}" for r in refused]
    problems += [
        f"{k} is dropped silently by SGLang's loader" for k in dropped if k.split(".")[-1] not in DOCUMENTED_DROPS
    ]
    problems += [f"nothing in the draft loads SGLang's parameter {n}" for n in unloaded if n not in FROM_TARGET]
    problems += _check_values(params, tensors, landed, hot)
    return {
        "ok": not problems,
        "problems": problems,
        "landed": {k: v for k, v in landed.items() if v},
        "dropped": dropped,
        "unloaded": unloaded,
        "hot_token_map": hot is not None,
        "parameters": {n: list(p.shape) for n, p in params.items()},
        "config": {
            "num_hidden_layers": config.num_hidden_layers,
            "norm_before_fc": model.model.norm_before_fc,
            "fc_norm": model.model.fc_norm is not None,
            "norm_output": bool(model.model.norm_output),
            "num_aux_hidden_states": model.model.num_aux_hidden_states,
        },
    }


def _check_values(params: dict[str, Any], tensors: dict[str, Any], landed: dict[str, list[str]], hot: Any) -> list[str]:
    """Every parameter holds exactly what was loaded into it: fused ones as the concatenation of their parts."""
    import torch

    problems = []
    fused: dict[str, list[str]] = {}
    for key, where in landed.items():
        for name in where:
            fused.setdefault(name, []).append(key)
    order = {"q_proj": 0, "k_proj": 1, "v_proj": 2, "gate_proj": 0, "up_proj": 1}
    for name, keys in fused.items():
        parts = sorted(keys, key=lambda k: order.get(k.split(".")[-2], 0))
        expected = torch.cat([tensors[k].float() for k in parts], dim=0)
        got = params[name].detach()
        if got.dim() == expected.dim() and got.shape[0] > expected.shape[0] and got.shape[1:] == expected.shape[1:]:
            got = got[: expected.shape[0]]  # vocab-parallel parameters are padded to a multiple of 64 rows
        if got.shape != expected.shape or not torch.equal(got, expected.to(got.dtype)):
            problems.append(f"SGLang's parameter {name} does not equal {' + '.join(parts)} after loading")
    if hot is not None and "d2t" in tensors:
        want = tensors["d2t"] + torch.arange(tensors["d2t"].shape[0])
        if not torch.equal(hot, want):
            problems.append("SGLang's hot-token map is not d2t + arange(draft_vocab_size)")
    return problems


class CausalAttention:
    """The one piece of SGLang's draft forward that has no CPU kernel here: attention itself.

    Plain causal softmax attention over the batch's tokens (one sequence), grouped query heads repeated,
    with the layer's own scaling - what any of SGLang's attention backends computes for an extend of a
    fresh sequence. Everything around it (projections, rotary, norms, fc, residuals) is SGLang's code.
    """

    def forward(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any, save_kv_cache: bool = True,
                **_kwargs: Any) -> Any:  # fmt: skip
        import torch

        n = q.shape[0]
        heads, kv_heads = layer.tp_q_head_num, layer.tp_k_head_num
        q = q.view(n, heads, -1).transpose(0, 1)
        k = k.view(n, kv_heads, -1).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
        v = v.view(n, kv_heads, -1).transpose(0, 1).repeat_interleave(heads // kv_heads, dim=0)
        scores = (q @ k.transpose(-1, -2)) * layer.scaling
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))
        return (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(n, -1)


def load_model(draft: str) -> Any:
    """SGLang's LlamaForCausalLMEagle3 for the draft, weights through its own load_weights (float32)."""
    from safetensors.torch import load_file

    model = build_model(draft)
    for name in sorted(f for f in os.listdir(draft) if f.endswith(".safetensors")):
        model.load_weights(list(load_file(os.path.join(draft, name)).items()))
    return model.eval()


def draft_forward(model: Any, input_ids: Any, positions: Any, target_features: Any) -> tuple[Any, Any]:
    """SGLang's draft model over one fresh sequence: (normed output, what the next draft step is fed)."""
    import types

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.EXTEND, mm_input_embeds=None, contains_mm_inputs=lambda: False,
        spec_info=types.SimpleNamespace(hidden_states=target_features), global_num_token_non_padded_cpu=None,
        moe_num_token_non_padded=None,
    )  # fmt: skip
    with torch.no_grad(), forward_context(ForwardContext(attn_backend=CausalAttention())):
        normed, aux = model.model(input_ids, positions, batch)
    return normed, aux[0]


def cmd_load(ns: argparse.Namespace) -> int:
    cpu_shims.apply(models=True)
    result = judge_load(ns.draft)
    result["sglang"] = _sglang_version()
    return _emit(result, 0 if result["ok"] else 1)


# ---------------------------------------------------------------- serve


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _files(draft: str) -> list[dict[str, Any]]:
    """What identifies the draft's files without reading them (a new export replaces them: a new inode or mtime)."""
    out = []
    for name in ("config.json", "model.safetensors"):
        path = os.path.join(draft, name)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            out.append({"path": path, "exists": False})
            continue
        out.append({"path": path, "exists": True, "size": st.st_size, "mtime": st.st_mtime_ns, "inode": st.st_ino})
    return out


def _ask(argv: list[str]) -> subprocess.Popen[str]:
    """One verdict in a process of its own (SGLang's imports and process groups stay out of this one)."""
    return subprocess.Popen([sys.executable, "-m", "sglang_check.judge", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # fmt: skip


def _verdict(kind: str, proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any]]:
    out, err = proc.communicate()
    code = proc.returncode if proc.returncode in (0, 1) else 2
    try:
        return code, json.loads(out.strip().splitlines()[-1])
    except (IndexError, ValueError):
        return 2, {"ok": False, "error": f"the {kind} check could not run (exit {proc.returncode}): "
                                         f"{(err.strip().splitlines() or ['no output'])[-1]}"}  # fmt: skip


def cmd_serve(ns: argparse.Namespace) -> int:
    sglang = _sglang_version()
    asked: dict[str, tuple[str, list[str]]] = {}
    if ns.check_args:
        asked["args"] = ("args-" + _digest({"args": ns.argv, "sglang": sglang}), ["args", "--", *ns.argv])
    if ns.draft:
        asked["load"] = ("load-" + _digest({"draft": ns.draft, "files": _files(ns.draft), "sglang": sglang}),
                         ["load", ns.draft])  # fmt: skip
    result: dict[str, Any] = {"ok": True, "sglang": sglang, "judged": [], "kept": []}
    # The verdicts not kept are asked at once, each in its own process: importing SGLang is most of each one's time
    # (a first deploy asks both); they are read, and refusals named, in the same order as before (args, then load).
    running = {}
    for kind, (name, argv) in asked.items():
        if os.path.exists(os.path.join(ns.verdicts, name)):
            result["kept"].append(kind)
        else:
            running[kind] = _ask(argv)
    failed: tuple[str, int] | None = None
    for kind, proc in running.items():
        code, verdict = _verdict(kind, proc)
        result[kind] = verdict
        result["judged"].append(kind)
        if code != 0 or not verdict.get("ok"):
            failed = failed or (kind, code or 1)  # the first in order is the one named
        elif ns.keep:  # a verdict that passed is kept; a refusal never is (the next run asks again)
            os.makedirs(ns.verdicts, exist_ok=True)
            with open(os.path.join(ns.verdicts, asked[kind][0]), "a", encoding="utf-8"):
                pass
    if failed:
        result.update(ok=False, failed=failed[0])
        return _emit(result, failed[1])
    return _emit(result, 0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="judge", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    a = sub.add_parser("args", help="resolve a launch_server command line with SGLang's ServerArgs")
    a.add_argument("--json", help="a JSON list of {id, argv} cases, judged in one process")
    a.add_argument("argv", nargs=argparse.REMAINDER, help="launch_server arguments, after --")
    a.set_defaults(run=cmd_args)
    ld = sub.add_parser("load", help="load a draft through SGLang's LlamaForCausalLMEagle3.load_weights")
    ld.add_argument("draft")
    ld.set_defaults(run=cmd_load)
    sv = sub.add_parser("serve", help="a deploy's verdicts, each asked only when none is kept for its inputs")
    sv.add_argument("--verdicts", required=True, help="directory of the kept verdicts (empty files named by hash)")
    sv.add_argument("--draft", help="the draft to load through SGLang's loader (none: no load verdict)")
    sv.add_argument("--no-args", dest="check_args", action="store_false", help="no verdict on the command line")
    sv.add_argument("--no-keep", dest="keep", action="store_false", help="keep nothing (check mode)")
    sv.add_argument("argv", nargs=argparse.REMAINDER, help="launch_server arguments, after --")
    sv.set_defaults(run=cmd_serve)
    ns = ap.parse_args(argv)
    if getattr(ns, "argv", None) and ns.argv[0] == "--":
        ns.argv = ns.argv[1:]
    try:
        return ns.run(ns)
    except Exception as exc:
        return _emit({"ok": False, "error": f"the check could not run: {type(exc).__name__}: {exc}",
                      "sglang": _sglang_version()}, 2)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
