"""Extract the target's hidden states for EAGLE-3 training, resumably: one ``hs_{i}.safetensors`` per row.

For row ``i`` of the prepared dataset (a ``datasets`` directory written by ``speculators prepare-data``),
the file holds ``hidden_states`` ``[L, n_aux + 1, hidden]`` and ``token_ids`` ``[L]`` equal to the row's
``input_ids``: the layout vLLM's hidden-states connector writes for ``speculators generate-offline-data``, in
the same layer numbering. Layer id ``j`` is the *input* of decoder layer ``j`` - the output of layer ``j - 1``,
0 being the embeddings - as in vLLM (``_maybe_add_hidden_state(aux, idx + 1, ...)`` after layer ``idx``) and
so in speculators' ``--target-layer-ids``. The last slot is always id ``N``, the last layer's output *before*
the final norm, which speculators' trainer expects. Forward hooks read the states, so the final norm is never
applied. Each file is written under a temporary name, fsynced and renamed, so a crash leaves only complete
files; a rerun skips rows whose file is complete and matches the row's tokens and layers. Progress goes to
stderr as ``[hidden] done/total``; ``training.hs_store check`` decides afterwards whether the store is complete.

This is the path for targets vLLM cannot serve (``eagle3_data_extractor: transformers``); by default the data
stage extracts with vLLM itself.

Several hosts share the rows as generate-offline-data's ``--world-size/--rank`` do (contiguous chunks,
``training.hs_store.shard_rows``): each writes only its own rows into the one store.

Usage: python3 -m training.hidden_states --target DIR --data DATASET_DIR --layers 0 1 2 [--dtype bfloat16]
       [--world-size N --rank R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

try:
    from .hs_store import shard_rows
except ImportError:  # pragma: no cover - run as a loose script
    from hs_store import shard_rows  # type: ignore[no-redef]


def _complete(path: str, ids: list[int], layers: str) -> bool:
    """A file from an earlier run counts only for the same tokens and the same layers."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as fh:
            return (fh.metadata() or {}).get("layers") == layers and torch.equal(
                fh.get_tensor("token_ids"), torch.tensor(ids, dtype=torch.long)
            )
    except Exception:
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hidden_states", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--target", required=True)
    ap.add_argument("--data", required=True, help="dataset directory from speculators prepare-data")
    ap.add_argument("--out", help="default: DATA/hidden_states")
    ap.add_argument("--layers", type=int, nargs="+", required=True,
                    help="auxiliary layer ids, vLLM's numbering (id j: the input of decoder layer j)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto")
    ap.add_argument("--max-samples", type=int, default=0, help="first N rows only (0: all), as generate-offline-data")
    ap.add_argument("--progress-every", type=int, default=50)
    ap.add_argument("--world-size", type=int, default=1, help="hosts sharing the rows (generate-offline-data's split)")
    ap.add_argument("--rank", type=int, default=0, help="this host's share, 0..world-size-1")
    args = ap.parse_args(argv)
    if not 0 <= args.rank < args.world_size:
        ap.error(f"--rank {args.rank} is outside a world of {args.world_size}: give 0..{args.world_size - 1}")
    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    out_dir = args.out or os.path.join(args.data, "hidden_states")
    os.makedirs(out_dir, exist_ok=True)
    data = load_from_disk(args.data)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dtype = getattr(torch, args.dtype)
    if device == "cuda" and torch.cuda.device_count() > 1:
        # A target larger than one GPU is spread over the container's GPUs (layers placed in order).
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=dtype, device_map="auto").eval()
        device = str(model.get_input_embeddings().weight.device)
    else:
        model = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.float32 if device == "cpu" else dtype)
        model.to(device).eval()
    layers = model.model.layers
    n = len(layers)
    # The metadata names the numbering, so files of another convention are never taken as complete.
    layer_tag = "inputs:" + ",".join(map(str, args.layers))
    if len(set(args.layers)) != len(args.layers) or any(not 0 <= j < n for j in args.layers):
        raise SystemExit(f"--layers {args.layers}: aux layer ids must be distinct, in 0..{n - 1} for this {n}-layer "
                         f"target (id j is the input of layer j; id {n}, the last layer's output, is always captured)")
    captured: dict[int, torch.Tensor] = {}
    wanted = [*args.layers, n]

    def keep(j: int):
        def hook(_m, _i, out):
            captured[j] = (out[0] if isinstance(out, tuple) else out)[0]

        return hook

    # id j is what leaves layer j - 1, or the embeddings for j = 0
    for j in set(wanted):
        (model.get_input_embeddings() if j == 0 else layers[j - 1]).register_forward_hook(keep(j))
    total = min(len(data), args.max_samples) if args.max_samples > 0 else len(data)
    mine = shard_rows(total, args.world_size, args.rank)
    done = skipped = 0
    started = time.monotonic()
    with torch.no_grad():
        for i in mine:
            ids = [int(t) for t in data[i]["input_ids"]]
            path = os.path.join(out_dir, f"hs_{i}.safetensors")
            if os.path.exists(path) and _complete(path, ids, layer_tag):
                skipped += 1
                continue
            model(input_ids=torch.tensor([ids], device=device))
            # .cpu() first: a target spread over several GPUs leaves each layer's state on its own device
            hs = torch.stack([captured[k].cpu() for k in wanted], dim=1).to(dtype).contiguous()
            tmp = f"{path}.tmp"
            save_file({"hidden_states": hs, "token_ids": torch.tensor(ids, dtype=torch.long)}, tmp,
                      metadata={"layers": layer_tag})
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            done += 1
            if done % args.progress_every == 0:
                rate = done / max(time.monotonic() - started, 1e-6)
                print(f"[hidden] {done + skipped}/{len(mine)} ({rate:.1f} samples/s)", file=sys.stderr, flush=True)
    share = f" (rows {mine.start}..{mine.stop - 1} of {total}, rank {args.rank} of {args.world_size})"
    share = share if args.world_size > 1 else ""
    print(f"[hidden] {len(mine)}/{len(mine)} done{share} ({done} extracted, {skipped} already complete)",
          file=sys.stderr, flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
