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
