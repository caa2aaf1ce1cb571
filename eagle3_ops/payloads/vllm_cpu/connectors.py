"""vLLM's hidden-state connectors for a host without CUDA: the same classes, one method replaced.

vLLM's ``ExampleHiddenStatesConnector`` (speculators' ``file`` store) and hs-connectors'
``FP8HiddenStatesConnector`` (the ``fp8`` store) copy each finished request's hidden states from the KV cache
to host memory asynchronously: a dedicated CUDA stream, CUDA events, pinned memory
(``_submit_async_write`` in vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py,
vLLM 0.32). None of that exists in a CPU build of torch, and on CPU the cache already is host memory. The
subclasses here do that one step synchronously and keep everything else of the parent: which slots are
read (``extract_from_kv_cache``), the per-file lock a client waits on, the writer thread pool, the FP8
quantization, the scheduler-side bookkeeping. Load them with ``kv_connector_module_path:
vllm_cpu.connectors`` and ``kv_connector: CpuHiddenStatesConnector`` (or ``CpuFP8HiddenStatesConnector``).
"""

from __future__ import annotations

import fcntl
import os
from functools import partial
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1 import example_hidden_states_connector as _example


class _Done:
    """Stands for the parent's CUDA event: on CPU the copy is complete when the event is made."""

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class _HostCopy:
    """Replaces the asynchronous device-to-host copy; the rest of the write path is the parent's."""

    def _submit_async_write(self: Any, pending: _example.PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size, dtype=torch.long)).flatten()
        # Advanced indexing already copies; clone() makes the copy's ownership explicit for the writer thread.
        hidden = _example.extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        if self._req_futures.get(pending.req_id) is not None:
            raise RuntimeError(f"a hidden-states write for request {pending.req_id} is already in flight")
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        done = _Done()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}
        future = self._executor.submit(self._write_tensors, tensors, done, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = done
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))


class CpuHiddenStatesConnector(_HostCopy, _example.ExampleHiddenStatesConnector):
    """speculators' ``file`` store (bf16 ``hs_{i}.safetensors``) on a CPU-only vLLM."""


try:  # the fp8 store comes with hs-connectors, which a vLLM environment may lack
    from hs_connectors.fp8_hidden_states_connector import FP8HiddenStatesConnector
except ImportError:  # pragma: no cover - depends on the environment
    FP8HiddenStatesConnector = None  # type: ignore[assignment,misc]
else:

    class CpuFP8HiddenStatesConnector(_HostCopy, FP8HiddenStatesConnector):  # type: ignore[misc,valid-type]
        """hs-connectors' ``fp8`` store (e4m3 values and per-token scales) on a CPU-only vLLM."""
