"""Acceptance length from training metrics.

speculators reports per-TTT-step accuracy; the expected acceptance length of chain drafting is
tau = 1 + sum_k full_acc_k, where full_acc_k is the joint accuracy of the first k draft tokens. When only
per-step (conditional) accuracies are known, full_acc_k is their running product.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any


def tau_from_full(full_acc: list[float]) -> float:
    return 1.0 + sum(full_acc)


def tau_from_conditional(step_acc: list[float]) -> float:
    full, running = [], 1.0
    for acc in step_acc:
        running *= acc
        full.append(running)
    return tau_from_full(full)


def tau_constant(alpha: float, k: int) -> float:
    """tau for a constant per-step acceptance alpha and k draft tokens: (1 - alpha^(k+1)) / (1 - alpha)."""
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def _series(metrics: dict[str, Any], word: str) -> list[float]:
    """Values of keys like ``full_acc_0``, ``val/full_acc_0`` or speculators 0.9's ``full_acc_0_epoch``."""
    found = []
    for key, value in metrics.items():
        m = re.search(rf"(?:^|/){word}[_/]?(\d+)(?:_epoch)?$", key)
        if m and isinstance(value, (int, float)):
            found.append((int(m.group(1)), float(value)))
    return [v for _unused, v in sorted(found)]


def epoch_summary(val_metrics: dict[str, Any]) -> dict[str, Any]:
    """Per-step accuracies and tau from one epoch's val_metrics.json (keys like full_acc_0, cond_acc_1, ...)."""
    full = _series(val_metrics, "full_acc")
    cond = _series(val_metrics, "cond_acc") or _series(val_metrics, "acc")
    if not full and cond:
        running, full = 1.0, []
        for a in cond:
            running *= a
            full.append(running)
    return {"step_accuracy": cond, "full_accuracy": full, "tau": tau_from_full(full) if full else None}


def collect(save_dir: str) -> dict[str, Any]:
    """Summaries of every epoch that has val_metrics.json, the best, and the epochs without one.

    speculators writes ``<epoch>/val_metrics.json`` only when that epoch lowered the validation loss
    (``Trainer.maybe_update_best``), and a job killed between an epoch's checkpoint and its validation
    never writes it: such epochs have a checkpoint but no metrics, and are listed as ``unscored``.
    """
    epochs, checkpointed = {}, []
    for name in sorted(os.listdir(save_dir), key=lambda n: int(n) if n.isdigit() else -1):
        if not name.isdigit() or not os.path.isdir(os.path.join(save_dir, name)):
            continue
        checkpointed.append(int(name))
        path = os.path.join(save_dir, name, "val_metrics.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as fh:
                epochs[int(name)] = epoch_summary(json.load(fh))
    scored = {e: s for e, s in epochs.items() if s["tau"] is not None}
    best = max(scored, key=lambda e: scored[e]["tau"]) if scored else None
    return {"epochs": epochs, "checkpoints": checkpointed, "unscored": [e for e in checkpointed if e not in scored],
            "best_epoch": best, "tau": scored[best]["tau"] if best is not None else None}
