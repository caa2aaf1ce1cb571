"""Run speculators' real trainer on a CPU-only machine (the lab): ``python -m lab_target.cpu_shim [train args]``.

speculators 0.9.0 assumes an accelerator in six places; this shim patches exactly those, in memory, and
then runs ``speculators.train`` unchanged (same CLI, same model, data, loss, checkpointing and resume code):

1. ``trainer.get_local_rank`` returns the local rank as an int, which ``.to()`` reads as a CUDA device
   -> "cpu".
2. ``Trainer.device_type`` comes from ``torch.accelerator.current_accelerator()`` and falls back to "cuda"
   (used for autocast) -> "cpu".
3. ``torch.accelerator.synchronize`` / ``set_device_index`` fail without an accelerator -> no-ops.
4. Under torchrun, ``maybe_setup_distributed`` picks the accelerator's backend (NCCL) -> gloo on CPU,
   same module state afterwards.
5. ``recovery``'s device lookup -> "cpu".
6. Resuming: the checkpointer loads the last epoch onto ``get_current_device()``, "cuda:0" without an
   accelerator -> "cpu".

Two choices that are arguments, not patches, are needed with it: ``--draft-attn-impl sdpa`` (flex attention
has no CPU backward) and ``--loss-implementation eager`` (the fused loss needs Triton). This module lives
under the lab payload only; fleets run ``torchrun -m speculators.train`` directly.

In the lab each rank also holds its emulated GPU (``/dev/nvidia<LOCAL_RANK>``, ``EAGLE3_LAB_GPU_MIB`` MiB, 2048 by
default) through the emulator's own allocation API, as a CUDA context would: ``nvidia-smi`` lists the trainer's
ranks, and whatever frees GPUs (gpu_cleanup, the stages' checks that the GPUs are idle) sees the job.

Fault injection for the lab (a CPU has no GPU memory to run out of): with ``EAGLE3_LAB_OOM_ABOVE=N`` in the
environment, a run whose ``--total-seq-len`` is above N dies the way a GPU run does, with
``torch.OutOfMemoryError`` ("CUDA out of memory") before its first step.
"""

from __future__ import annotations

import os
import runpy
import sys


def patch() -> None:
    import torch
    import torch.distributed as dist
    from speculators.train import checkpointer, distributed, recovery, trainer

    torch.accelerator.synchronize = lambda *a, **k: None
    torch.accelerator.set_device_index = lambda *a, **k: None
    trainer.get_local_rank = lambda: "cpu"
    original_init = trainer.Trainer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer.Trainer.__init__ = init

    def setup(sp_size: int = 1) -> None:
        distributed._local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        distributed._is_distributed = "LOCAL_RANK" in os.environ
        if not distributed._is_distributed:
            return
        dist.init_process_group("gloo")
        distributed._rank = dist.get_rank()
        distributed._world_size = dist.get_world_size()
        distributed._init_sp_process_groups(distributed._rank, distributed._world_size, sp_size)

    distributed.maybe_setup_distributed = setup
    if hasattr(recovery, "get_local_rank"):
        recovery.get_local_rank = lambda: "cpu"
    checkpointer.get_current_device = lambda: "cpu"


NVEMU = "/usr/local/lib/nvemu"  # where the lab installs its nvidia-smi emulator in every container
_held: list[object] = []


def hold_emulated_gpu() -> None:
    """Hold this rank's emulated GPU for the life of the process (nothing outside the lab)."""
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    if not os.path.exists(os.path.join(NVEMU, "nvemu_device.py")) or not os.path.exists(f"/dev/nvidia{rank}"):
        return
    sys.path.insert(0, NVEMU)
    try:
        import nvemu_device  # type: ignore[import-not-found]
    finally:
        sys.path.remove(NVEMU)
    _held.append(nvemu_device.alloc(rank, int(os.environ.get("EAGLE3_LAB_GPU_MIB", "2048"))))


def inject_oom() -> None:
    limit = os.environ.get("EAGLE3_LAB_OOM_ABOVE")
    if not limit or "--total-seq-len" not in sys.argv:
        return
    total = int(sys.argv[sys.argv.index("--total-seq-len") + 1])
    if total > int(limit):
        import torch

        raise torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {total * 6 / 1024:.2f} GiB (lab fault injection: "
            f"total_seq_len {total} > EAGLE3_LAB_OOM_ABOVE={limit})"
        )


def main() -> None:
    inject_oom()
    hold_emulated_gpu()
    patch()
    # The CLI imported maybe_setup_distributed by name before we could patch the module attribute.
    from speculators.train import cli

    if hasattr(cli, "maybe_setup_distributed"):
        from speculators.train import distributed

        cli.maybe_setup_distributed = distributed.maybe_setup_distributed
    sys.argv[0] = "speculators.train"
    runpy.run_module("speculators.train", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
