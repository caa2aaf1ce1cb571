#!/usr/bin/env python3
"""Benchmark: remapping a Kimi-K2.5-sized EAGLE-3 drafter for SGLang (layers.0.* -> midlayer.*).

Builds a synthetic speculators drafter with Kimi-K2.5 shapes (hidden 7168, 64 heads, intermediate
18432, draft vocab 32000, target vocab 163840, bf16, embed_tokens included: about 4 GiB), then
remaps copies of it four ways, each in its own process so peak RSS is that method's alone:

  (a) in place: safetensors_remap's header rewrite (the module's code path)
  (b) rewrite:  the module's temporary-file path (new header + kernel data copy + fsync + rename)
  (c) naive:    safetensors load_file + rename + save_file (needs torch for bf16)
  (d) floor:    cp of the file

Times for (a)-(c) are measured inside the process around the remap (interpreter start-up excluded);
(d) is the wall time of cp. The page cache is warm for every method (the file was just written).

Usage: python benchmarks/bench_remap.py [--dir /var/tmp/bench] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HIDDEN, HEADS, KV_HEADS, INTER, DRAFT_VOCAB, VOCAB = 7168, 64, 8, 18432, 32000, 163840
HEAD_DIM = HIDDEN // HEADS


def shapes() -> dict[str, list[int]]:
    return {
        "embed_tokens.weight": [VOCAB, HIDDEN],
        "layers.0.self_attn.q_proj.weight": [HEADS * HEAD_DIM, 2 * HIDDEN],
        "layers.0.self_attn.k_proj.weight": [KV_HEADS * HEAD_DIM, 2 * HIDDEN],
        "layers.0.self_attn.v_proj.weight": [KV_HEADS * HEAD_DIM, 2 * HIDDEN],
        "layers.0.self_attn.o_proj.weight": [HIDDEN, HEADS * HEAD_DIM],
        "layers.0.input_layernorm.weight": [HIDDEN],
        "layers.0.hidden_norm.weight": [HIDDEN],
        "layers.0.post_attention_layernorm.weight": [HIDDEN],
        "layers.0.mlp.gate_proj.weight": [INTER, HIDDEN],
        "layers.0.mlp.up_proj.weight": [INTER, HIDDEN],
        "layers.0.mlp.down_proj.weight": [HIDDEN, INTER],
        "fc.weight": [HIDDEN, 3 * HIDDEN],
        "norm.weight": [HIDDEN],
        "lm_head.weight": [DRAFT_VOCAB, HIDDEN],
    }


def build(path: Path) -> int:
    """Write the synthetic drafter with real (non-sparse) bytes; returns its size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes().items():
        n = 2
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    header["d2t"] = {"dtype": "I64", "shape": [DRAFT_VOCAB], "data_offsets": [offset, offset + 8 * DRAFT_VOCAB]}
    offset += 8 * DRAFT_VOCAB
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    chunk = os.urandom(1 << 24)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(body)) + body)
        left = offset
        while left:
            n = min(left, len(chunk))
            fh.write(chunk[:n])
            left -= n
        fh.flush()
        os.fsync(fh.fileno())  # every method starts from a file that is on disk, as a real checkpoint is
    return path.stat().st_size


HARNESS = r"""
import json, os, resource, sys, time
sys.path.insert(0, {utils!r})
mode, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
if mode == "naive":
    from safetensors.torch import load_file, save_file
    start = time.perf_counter()
    tensors = load_file(path)
    def new_name(k):
        return "midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k
    renamed = {{new_name(k): v for k, v in tensors.items()}}
    save_file(renamed, out, metadata={{"format": "pt"}})
    elapsed = time.perf_counter() - start
else:
    import atexit, contextlib, shutil, tempfile, types
    if os.path.exists(os.path.join({utils!r}, "_remap.py")):
        # The codec in rooms (codec, journal and lock, rewrite): imported by their collection name, as modules do.
        top = tempfile.mkdtemp(prefix="eagle3-bench-")
        atexit.register(shutil.rmtree, top, True)
        os.makedirs(os.path.join(top, "ansible_collections", "eagle3"))
        os.symlink(os.path.dirname(os.path.dirname(os.path.abspath({utils!r}))),
                   os.path.join(top, "ansible_collections", "eagle3", "ops"))
        sys.path.insert(0, top)
        from ansible_collections.eagle3.ops.plugins.module_utils import _journal, _remap, _safetensors
        codec = types.SimpleNamespace(**{{**vars(_safetensors), **vars(_journal), **vars(_remap)}})
    else:  # an earlier release's one-file codec
        import _safetensors as codec
    start = time.perf_counter()
    # As the modules run it: under the checkpoint directory's lock (when this codec has one), offsets read inside.
    lock = getattr(codec, "CheckpointLock", None)
    with lock(os.path.dirname(path)) if lock else contextlib.nullcontext():
        plan = codec.plan(codec.read_header(path), [("layers.0.", "midlayer.")], [])
        if mode == "in_place":
            method = codec.apply(plan)
            assert method == "in_place", method
        else:
            obj, _ = codec.build_header(plan, compact=False)
            codec.write_rewrite(plan.header, codec.encode_header(obj), None, dest=out)
    elapsed = time.perf_counter() - start
print(json.dumps({{"seconds": elapsed, "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""


CODEC_DIR = [str(ROOT / "plugins" / "module_utils")]


def run_child(mode: str, path: Path, out: Path) -> dict[str, float]:
    code = HARNESS.format(utils=CODEC_DIR[0])
    proc = subprocess.run(
        [sys.executable, "-c", code, mode, str(path), str(out)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"rc={proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_cp(src: Path, dst: Path) -> dict[str, float]:
    start = time.perf_counter()
    pid = os.spawnvp(os.P_NOWAIT, "cp", ["cp", str(src), str(dst)])  # noqa: S606 -- wait4 gives cp's own rusage
    _, status, usage = os.wait4(pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        return {"error": "cp failed"}
    # cp's own rusage, flushed to disk like the rewrite path (which fsyncs)
    fd = os.open(dst, os.O_RDONLY)
    start_sync = time.perf_counter()
    os.fsync(fd)
    os.close(fd)
    return {"seconds": elapsed + (time.perf_counter() - start_sync), "maxrss_kib": usage.ru_maxrss}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="/var/tmp/eagle3-bench-remap")  # noqa: S108 -- a benchmark scratch dir
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="runs per method (median reported)")
    ap.add_argument("--codec-dir", default=CODEC_DIR[0],
                    help="the module_utils directory whose codec to measure (another release's, to compare)")
    args = ap.parse_args()
    CODEC_DIR[0] = args.codec_dir
    work = Path(args.dir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    original = work / "original.safetensors"
    size = build(original)
    print(f"synthetic Kimi-K2.5 EAGLE-3 drafter: {size / 2**30:.2f} GiB, bf16, {len(shapes()) + 1} tensors")
    results: dict[str, list[dict[str, float]]] = {"in_place": [], "rewrite": [], "naive": [], "cp": []}
    for _ in range(args.repeat):
        for mode in ("in_place", "rewrite", "naive", "cp"):
            target = work / f"{mode}.safetensors"
            out = work / f"{mode}.out.safetensors"
            for p in (target, out):
                p.unlink(missing_ok=True)
            if mode == "in_place":
                # the in-place path needs its own copy to modify; the copy is not timed
                subprocess.run(["cp", "--reflink=auto", str(original), str(target)], check=True)
                fd = os.open(target, os.O_RDONLY)
                os.fsync(fd)  # flush the copy now so its dirty pages are not charged to the header rewrite
                os.close(fd)
                results[mode].append(run_child(mode, target, out))
            elif mode == "cp":
                results[mode].append(run_cp(original, out))
            else:
                results[mode].append(run_child(mode, original, out))
            for p in (target, out):
                p.unlink(missing_ok=True)

    def median(mode: str, key: str) -> float | None:
        values = sorted(r[key] for r in results[mode] if key in r)
        return values[len(values) // 2] if values else None

    floor = median("cp", "seconds")
    print(f"\n{'method':<34}{'time (median)':>16}{'x cp':>9}{'peak RSS':>12}")
    labels = {
        "in_place": "(a) in place (header only)",
        "rewrite": "(b) rewrite (kernel copy + fsync)",
        "naive": "(c) load_file + rename + save_file",
        "cp": "(d) cp (floor)",
    }
    for mode, label in labels.items():
        secs = median(mode, "seconds")
        if secs is None:
            print(f"{label:<34}{'n/a: ' + results[mode][0].get('error', '?'):>16}")
            continue
        rss = median(mode, "maxrss_kib") / 1024
        ratio = f"{secs / floor:.2f}" if floor else "-"
        print(f"{label:<34}{secs * 1000:>13.1f} ms{ratio:>9}{rss:>9.1f} MB")
    naive = median("naive", "seconds")
    a, b = median("in_place", "seconds"), median("rewrite", "seconds")
    if naive and a and b:
        print(f"\n(c)/(a) = {naive / a:.0f}x   (c)/(b) = {naive / b:.1f}x")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
