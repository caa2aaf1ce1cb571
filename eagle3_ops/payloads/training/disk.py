"""Disk preflight for hidden-state extraction: samples x tokens x hidden x layers x dtype bytes."""

from __future__ import annotations

import os
from dataclasses import dataclass

TB = 1000**4


@dataclass
class DiskCheck:
    needed: int
    free: int
    path: str
    fp8_needed: int | None = None  # what the fp8 store would need instead (None: it is the store already)

    @property
    def fits(self) -> bool:
        return self.needed <= self.free

    def message(self) -> str:
        ways = []
        if self.fp8_needed is not None:
            fits = "fits" if self.fp8_needed <= self.free else "does not fit either"
            ways.append(f"the fp8 store needs {self.fp8_needed / TB:.2f} TB and {fits} (eagle3_data_hidden_store: fp8)")
        ways.append("online training keeps none on disk (eagle3_train_hidden_states: online, the trainer asks the "
                    "vLLM server for each sample)")  # fmt: skip
        return (f"hidden states need {self.needed / TB:.2f} TB at {self.path} but {self.free / TB:.2f} TB are free: "
                f"{'; '.join(ways)}; or free space, mount a bigger volume, or extract fewer samples")  # fmt: skip


def hidden_state_bytes(samples: int, mean_tokens: float, hidden: int, aux_layers: int = 3, dtype_bytes: int = 2,
                       overhead: float = 1.02, fp8: bool = False) -> int:  # fmt: skip
    """Bytes for the aux layers plus the verifier's last layer per token (safetensors adds ~2 % of headers
    and token ids). The fp8 store keeps one byte per value and a float32 scale per token."""
    per_token = hidden * (aux_layers + 1) * (1 if fp8 else dtype_bytes) + (4 if fp8 else 0)
    return int(samples * mean_tokens * per_token * overhead)


def check(path: str, needed: int) -> DiskCheck:
    probe = path
    while not os.path.exists(probe):
        probe = os.path.dirname(probe) or "/"
    st = os.statvfs(probe)
    return DiskCheck(needed, st.f_bavail * st.f_frsize, path)


def main(argv: list[str] | None = None) -> int:
    """``python3 -m training.disk``: print the check as JSON; exit 1 (with the numbers) when it does not fit."""
    import argparse
    import json
    import sys

    ap = argparse.ArgumentParser(prog="disk", description="Disk preflight for hidden-state extraction.")
    ap.add_argument("--path", required=True)
    ap.add_argument("--samples", type=int, required=True)
    ap.add_argument("--mean-tokens", type=float, required=True)
    ap.add_argument("--hidden", type=int, required=True)
    ap.add_argument("--aux-layers", type=int, default=3)
    ap.add_argument("--dtype-bytes", type=int, default=2)
    ap.add_argument("--store", choices=["file", "fp8"], default="file")
    ap.add_argument("--shards", type=int, default=1, help="hosts that each keep only their share of the rows")
    ap.add_argument("--already", type=int, default=0, help="bytes already written by an earlier run")
    args = ap.parse_args(argv)
    samples = -(-args.samples // max(args.shards, 1))

    def need(fp8: bool) -> int:
        total = hidden_state_bytes(samples, args.mean_tokens, args.hidden, args.aux_layers, args.dtype_bytes, fp8=fp8)
        return max(0, total - args.already)

    result = check(args.path, need(args.store == "fp8"))
    if args.store == "file":
        result.fp8_needed = need(True)
    report = {"needed": result.needed, "free": result.free, "path": result.path, "fits": result.fits,
              "fp8_needed": result.fp8_needed, "message": "" if result.fits else result.message()}  # fmt: skip
    print(json.dumps(report))
    if not result.fits:
        print(result.message(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
