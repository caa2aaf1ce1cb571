"""Token budget back-off for speculators EAGLE-3 training: the ladder the launcher walks down, and what a run that
died of out-of-memory looks like.

speculators packs samples into one row of ``total_seq_len`` tokens (there is no batch size), so the budget is the
knob that decides whether a GPU runs full or out of memory. The starting budget is the plan's (``_plan.py``, the
collection's planner shipped beside this file: a memory model calibrated on the seeds' run); it is a starting
point, not a promise: the launcher backs off down the same ladder when a run dies of out-of-memory and records why.
"""

from __future__ import annotations

import re

try:  # shipped beside this file (a link to the collection's module_utils/_plan.py)
    from ._plan import LADDER, ladder_from
except ImportError:  # pragma: no cover - run as a loose script
    from _plan import LADDER, ladder_from  # type: ignore[no-redef]

__all__ = ["LADDER", "OOM_PATTERNS", "died_of_oom", "ladder_from"]

OOM_PATTERNS = re.compile(
    r"CUDA out of memory|OutOfMemoryError|out of memory|HIP out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
    r"Tried to allocate [\d.]+ [GM]iB",
    re.IGNORECASE,
)


def died_of_oom(returncode: int, log_tail: str) -> bool:
    """A failed run whose log shows an allocation failure (a SIGKILL alone may be the host's OOM killer)."""
    return returncode != 0 and bool(OOM_PATTERNS.search(log_tail))
