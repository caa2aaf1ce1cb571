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

    @property
    def fits(self) -> bool:
        return self.needed <= self.free

    def message(self) -> str:
        return (f"hidden states need {self.needed / TB:.2f} TB at {self.path} but {self.free / TB:.2f} TB are free: "
                "free space, mount a bigger volume, or extract fewer samples")  # fmt: skip


def hidden_state_bytes(samples: int, mean_tokens: float, hidden: int, aux_layers: int = 3, dtype_bytes: int = 2,
                       overhead: float = 1.02) -> int:  # fmt: skip
    """Bytes for the aux layers plus the verifier's last layer per token (safetensors adds ~2 % of headers
    and token ids)."""
    return int(samples * mean_tokens * hidden * (aux_layers + 1) * dtype_bytes * overhead)


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
    ap.add_argument("--already", type=int, default=0, help="bytes already written by an earlier run")
    args = ap.parse_args(argv)
    needed = max(0, hidden_state_bytes(args.samples, args.mean_tokens, args.hidden, args.aux_layers,
                                       args.dtype_bytes) - args.already)  # fmt: skip
    result = check(args.path, needed)
    print(json.dumps({"needed": result.needed, "free": result.free, "path": result.path, "fits": result.fits,
                      "message": "" if result.fits else result.message()}))  # fmt: skip
    if not result.fits:
        print(result.message(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
