"""The hidden-state store of one extraction: which settings made it, and whether a shard of it is complete.

Either extractor (vLLM through ``speculators generate-offline-data``, or ``training.hidden_states``) writes
``hs_{i}.safetensors`` for row ``i`` of the prepared dataset: ``hidden_states`` ``[T, n_aux + 1, hidden]`` and
``token_ids`` ``[T]``; the ``fp8`` store adds ``hidden_states_scales`` ``[T, 1, 1]`` and keeps the states in
``float8_e4m3fn``. Neither writer knows which layers a file holds, so this store records the settings of the
extraction in ``EXTRACTION.json`` and ``begin`` empties a store that other settings (layers, store, extractor)
filled: files of other layers have the same shape and would train the drafter on the wrong features.

``check`` validates the rows of one shard - speculators' split of ``--world-size/--rank`` into contiguous
chunks (``get_indices_to_process`` in speculators/data_generation/offline.py) - or of the whole dataset:
each file must open, hold the row's token ids and the expected shape and dtype (and, with ``--values``,
finite values). A file that fails is renamed ``*.rejected`` so the next run regenerates it (the client's
resume only redoes unreadable files). A complete shard gets ``SHARD-{rank}-of-{world}.json``; a complete
store gets ``COMPLETE.json``, the marker the data stage skips on.

Usage:
  python3 -m training.hs_store begin --out DIR --settings JSON
  python3 -m training.hs_store check --data DATASET --out DIR --slots 4 --hidden 7168 [--world 2 --rank 1 | --all]
  python3 -m training.hs_store progress --out DIR --expected BYTES --state FILE

``progress`` prints one line for the data stage's wait: the bytes the store holds against the plan's for this
host's share (eagle3.ops.eagle3_plan), what is left, and an ETA at the rate measured since its first sample.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from typing import Any

try:  # shipped beside this file (links to the collection's module_utils/_atomic.py and _plan.py)
    from . import _atomic as st
    from ._plan import bytes_under
except ImportError:  # pragma: no cover - run as a loose script
    import _atomic as st  # type: ignore[no-redef]
    from _plan import bytes_under  # type: ignore[no-redef]

SETTINGS = "EXTRACTION.json"
COMPLETE = "COMPLETE.json"
FILE = re.compile(r"^hs_(\d+)\.safetensors$")
FLOAT_DTYPES = {"BF16", "F16", "F32"}
FP8_DTYPES = {"F8_E4M3"}


def shard_rows(total: int, world: int, rank: int) -> range:
    """The rows generate-offline-data gives rank ``rank`` of ``world``: contiguous chunks, sizes differ by <= 1."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is outside a world of {world}")
    size, extra = divmod(total, world)
    start = rank * size + min(rank, extra)
    return range(start, start + size + (1 if rank < extra else 0))


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def begin(out: str, settings: dict[str, Any]) -> str:
    """Record the settings; empty a store that other settings filled. Returns 'kept', 'new' or 'reset'."""
    os.makedirs(out, exist_ok=True)
    recorded = _read_json(os.path.join(out, SETTINGS))
    if recorded == settings:
        return "kept"
    state = "new"
    names = os.listdir(out)
    if recorded is not None or any(FILE.match(n) for n in names):
        state = "reset"
        for name in names:
            if FILE.match(name) or name.endswith(".rejected") or name.startswith("SHARD-") or name == COMPLETE:
                os.unlink(os.path.join(out, name))
    st.write_json_atomic(os.path.join(out, SETTINGS), settings)
    return state


def check_file(path: str, ids: list[int], slots: int, hidden: int, values: bool) -> str | None:
    """Why the file is not a complete row (None when it is)."""
    import torch
    from safetensors import safe_open

    try:
        with safe_open(path, "pt") as fh:
            keys = set(fh.keys())
            if not {"hidden_states", "token_ids"} <= keys:
                return f"keys {sorted(keys)} lack hidden_states or token_ids"
            if not torch.equal(fh.get_tensor("token_ids").to(torch.long), torch.tensor(ids, dtype=torch.long)):
                return "token ids differ from the dataset's row"
            hs = fh.get_slice("hidden_states")
            shape, dtype = tuple(hs.get_shape()), hs.get_dtype()
            if shape != (len(ids), slots, hidden):
                return f"hidden_states has shape {list(shape)}, expected {[len(ids), slots, hidden]}"
            if dtype in FP8_DTYPES:
                if "hidden_states_scales" not in keys:
                    return "fp8 hidden states without hidden_states_scales"
            elif dtype not in FLOAT_DTYPES:
                return f"hidden_states has dtype {dtype}"
            if values:
                tensors = [fh.get_tensor("hidden_states").float()]
                if "hidden_states_scales" in keys:
                    tensors.append(fh.get_tensor("hidden_states_scales").float())
                if not all(bool(torch.isfinite(t).all()) for t in tensors):
                    return "non-finite values"
    except Exception as exc:  # a torn or foreign file: any reader error means "regenerate it"
        return f"unreadable ({type(exc).__name__}: {exc})"
    return None


def check(args: argparse.Namespace) -> dict[str, Any]:
    from datasets import load_from_disk

    data = load_from_disk(args.data)
    total = len(data)
    world, rank = (1, 0) if args.all else (args.world, args.rank)
    rows = shard_rows(total, world, rank)
    missing: list[int] = []
    rejected: dict[int, str] = {}
    for i in rows:
        path = os.path.join(args.out, f"hs_{i}.safetensors")
        if not os.path.exists(path):
            missing.append(i)
            continue
        why = check_file(path, [int(t) for t in data[i]["input_ids"]], args.slots, args.hidden, args.values)
        if why is not None:
            rejected[i] = why
            os.replace(path, path + ".rejected")
    complete = not missing and not rejected
    result = {"rows": len(rows), "first": rows.start, "world": world, "rank": rank, "missing": len(missing),
              "missing_first": missing[:10], "rejected": len(rejected),
              "rejected_first": {str(k): v for k, v in list(rejected.items())[:5]}, "complete": complete}  # fmt: skip
    settings = _read_json(os.path.join(args.out, SETTINGS)) or {}
    if complete:
        marker = COMPLETE if args.all or world == 1 else f"SHARD-{rank}-of-{world}.json"
        record = {**settings, "samples": len(rows), "first": rows.start, "world": world, "rank": rank}
        st.write_json_atomic(os.path.join(args.out, marker), record)
        result["marker"] = marker
    return result


def _size(n: float, unit: float) -> str:
    return f"{n / unit:.0f}"


def progress(out: str, expected: int, state: str, now: float | None = None) -> str:
    """One progress line: the bytes the store holds against the plan's, what is left and when it should be done, at
    the rate measured since the first sample (kept in ``state``; a store that shrank starts the measure again)."""
    now = time.time() if now is None else now
    written = bytes_under(out) if os.path.isdir(out) else 0
    first = _read_json(state)
    if not isinstance(first, dict) or written < first.get("bytes", 0):
        first = {"time": now, "bytes": written}
        st.write_json_atomic(state, first)
    unit, name = (1000**3, "GB") if expected >= 10 * 1000**3 else (1000**2, "MB")
    left = max(0, expected - written)
    rate = (written - first["bytes"]) / (now - first["time"]) if now > first["time"] else 0.0
    if left == 0:
        eta = "the plan's bytes are in"
    elif rate > 0:
        seconds = left / rate
        eta = f"ETA {seconds / 3600:.1f} h" if seconds >= 3600 else f"ETA {seconds / 60:.0f} min"
    else:
        eta = "ETA after the next sample"
    return (f"[hidden] {_size(written, unit)}/{_size(expected, unit)} {name} written, {_size(left, unit)} {name} "
            f"to go, {eta} ({rate / 1000**2:.1f} MB/s)")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="hs_store", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("begin", help="record the extraction's settings; empty a store other settings filled")
    b.add_argument("--out", required=True)
    b.add_argument("--settings", required=True, help="JSON object: layers, store, extractor, numbering")
    c = sub.add_parser("check", help="validate one shard's files (or all of them) and mark it complete")
    c.add_argument("--data", required=True, help="dataset directory from speculators prepare-data")
    c.add_argument("--out", required=True)
    c.add_argument("--slots", type=int, required=True, help="hidden states per token: aux layers + the last")
    c.add_argument("--hidden", type=int, required=True)
    c.add_argument("--world", type=int, default=1)
    c.add_argument("--rank", type=int, default=0)
    c.add_argument("--all", action="store_true", help="the whole dataset, whatever the shards")
    c.add_argument("--values", action="store_true", help="also read every value (finite); reads the whole store")
    g = sub.add_parser("progress", help="bytes written against the plan's, what is left and an ETA (one line)")
    g.add_argument("--out", required=True)
    g.add_argument("--expected", type=int, required=True, help="the plan's bytes for this host's share")
    g.add_argument("--state", required=True, help="a file that keeps the first sample (the rate is measured since)")
    args = ap.parse_args(argv)
    if args.command == "progress":
        print(progress(args.out, args.expected, args.state))
        return 0
    if args.command == "begin":
        try:
            settings = json.loads(args.settings)
        except ValueError as exc:
            ap.error(f"--settings is not JSON: {exc}")
        if not isinstance(settings, dict):
            ap.error("--settings must be a JSON object")
        print(json.dumps({"store": begin(args.out, settings)}))
        return 0
    if not 0 <= args.rank < args.world:
        ap.error(f"--rank {args.rank} is outside --world {args.world}")
    print(json.dumps(check(args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
