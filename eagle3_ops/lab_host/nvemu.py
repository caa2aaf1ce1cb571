"""Emulated NVIDIA GPUs for lab containers: the device-node contract, ``nvidia-smi`` and a workload.

This file dispatches to the three programs (nvemu_device: the model; nvemu_smi: ``nvidia-smi``;
nvemu_workload: ``lab-workload``), installed beside it in every container.

Installed inside each lab container (standard library only, Python 3.9+). The emulation follows
the driver's observable contract rather than its internals:

* GPUs are the device nodes ``/dev/nvidia0..N-1`` (bind-mounted from the lab host, like the
  ``lxc.mount.entry`` lines of a real Proxmox GPU container), plus ``nvidiactl`` and ``nvidia-uvm``.
* A process "allocates" memory by opening a node and creating a context: a small file under
  ``/run/nvidia-emu/ctx`` that it keeps open, stating the GPU, MiB and utilisation. A context is
  alive while *any* process holds it open -- so DataLoader children forked after CUDA init keep the
  memory alive after their parent is killed, exactly the orphan problem real cleanups have.
* When the last holder dies the kernel closes its descriptors and the memory is free again:
  ``nvidia-smi`` derives everything from ``/proc/*/fd`` at every call, nothing is cached.
"""

from __future__ import annotations

import os
import sys

# The library side, for code that holds emulated memory itself: ``import nvemu; nvemu.alloc(gpu, mib)``.
try:
    from .nvemu_device import Context, alloc
except ImportError:  # pragma: no cover - loose files beside each other (in a container)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from nvemu_device import Context, alloc  # type: ignore[no-redef]

__all__ = ["Context", "alloc", "main"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    prog = os.path.basename(sys.argv[0])
    if prog == "nvidia-smi" or (argv and argv[0] == "smi"):
        from nvemu_smi import smi_main

        return smi_main(argv[1:] if prog != "nvidia-smi" else argv)
    if prog == "lab-workload" or (argv and argv[0] == "workload"):
        from nvemu_workload import workload_main

        return workload_main(argv[1:] if prog != "lab-workload" else argv)
    print("usage: nvemu.py smi|workload ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
