"""speculators checkpoints: which epoch directory is complete, and setting partial ones aside.

speculators writes ``SAVE/<epoch>/`` with model.safetensors, config.json, optimizer_state_dict.pt,
scheduler_state_dict.pt and training_state.json, and resumes from the newest epoch directory it finds.
A job killed while saving leaves a partial directory that it would then try to load: before each
launch the partial ones are renamed aside, so a resume starts from the newest complete epoch (and a
fresh start happens only when no complete epoch exists).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

try:  # shipped beside this file (links to the collection's module_utils/_safetensors.py and _atomic.py)
    from . import _atomic as aio
    from . import _safetensors as st
except ImportError:  # pragma: no cover - run as a loose script
    import _atomic as aio  # type: ignore[no-redef]
    import _safetensors as st  # type: ignore[no-redef]

REQUIRED = ("model.safetensors", "config.json", "optimizer_state_dict.pt", "scheduler_state_dict.pt",
            "training_state.json")  # fmt: skip


@dataclass
class Epoch:
    epoch: int
    path: str
    problem: str | None  # None when complete

    @property
    def complete(self) -> bool:
        return self.problem is None


def check_epoch_dir(path: str) -> str | None:
    """Why ``path`` is not a complete checkpoint, or None (each file by the codec's file_problem)."""
    for name in REQUIRED:
        problem = st.file_problem(os.path.join(path, name))
        if problem:
            return problem.replace(os.path.join(path, name), name)
    return None


def scan(save_dir: str) -> list[Epoch]:
    """Every epoch directory, oldest first, with what makes it incomplete."""
    if not os.path.isdir(save_dir):
        return []
    epochs = []
    for name in os.listdir(save_dir):
        path = os.path.join(save_dir, name)
        if re.fullmatch(r"\d+", name) and os.path.isdir(path) and not os.path.islink(path):
            epochs.append(Epoch(int(name), path, check_epoch_dir(path)))
    return sorted(epochs, key=lambda e: e.epoch)


def newest_complete(save_dir: str) -> Epoch | None:
    complete = [e for e in scan(save_dir) if e.complete]
    return complete[-1] if complete else None


def set_partial_aside(save_dir: str) -> list[str]:
    """Rename incomplete epoch directories newer than the newest complete one; returns the new names."""
    newest = newest_complete(save_dir)
    moved = []
    for e in scan(save_dir):
        if not e.complete and (newest is None or e.epoch > newest.epoch):
            target = os.path.join(save_dir, f".partial-{e.epoch}-{int(os.path.getmtime(e.path))}")
            os.rename(e.path, target)
            moved.append(target)
    return moved


def readable_weights(save_dir: str) -> list[str]:
    """Give every epoch's weights the mode an ordinary write gives (0666 less the umask); returns what changed.

    safetensors 0.8 writes model.safetensors through a temporary file, so speculators' checkpoints (and so
    checkpoint_best) come out 0600 beside 0644 configs: a server that runs as a service user, or reads the share
    with root squashed, could not load them. Only files with no group/other bits are widened.
    """
    mode = aio.new_file_mode()
    changed: list[str] = []
    if not os.path.isdir(save_dir):
        return changed
    for entry in sorted(os.listdir(save_dir)):
        path = os.path.join(save_dir, entry, "model.safetensors")
        try:
            st_mode = os.stat(path).st_mode & 0o7777
            if st_mode & 0o077 == 0 and st_mode != mode:
                os.chmod(path, mode)
                changed.append(path)
        except OSError:  # no weights there (a file beside the epochs, a partial epoch), or not ours to change
            continue
    return changed
