"""module_utils/_journal.py: one writer per checkpoint directory (a second one waits, then is refused naming the
holder), and an interrupted in-place header rewrite rolled back from its journal."""

from __future__ import annotations

import os

import numpy as np
from safetensors.numpy import save_file

from tests.modules import module_utils

journal = module_utils("_journal")
codec = module_utils("_safetensors")


def test_a_second_writer_is_refused_naming_the_first_and_the_lock_file_goes_with_the_last(tmp_path):
    with journal.CheckpointLock(str(tmp_path), timeout=5, what="an export"):
        assert (tmp_path / journal.LOCK_NAME).exists()
        pid = os.fork()
        if pid == 0:  # another process, as another host's run would be
            try:
                with journal.CheckpointLock(str(tmp_path), timeout=0.3, what="a remap"):
                    os._exit(0)
            except codec.SafetensorsError as exc:
                os._exit(3 if "did not release it within 0.3 s" in str(exc) else 4)
            os._exit(5)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 3
    assert not (tmp_path / journal.LOCK_NAME).exists()


def test_an_interrupted_in_place_rewrite_is_rolled_back_from_its_journal(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"layers.0.w": np.ones((2, 2), dtype=np.float32)}, str(path))
    original = path.read_bytes()
    header = codec.read_header(str(path))
    assert journal.pending_journal(str(path)) is None and journal.recover(str(path)) is False
    with open(journal.journal_path(str(path)), "wb") as fh:
        fh.write(journal.journal_blob(header))  # saved, then the rewrite died half way through the header
    with open(path, "r+b") as fh:
        fh.write(b"\0" * 12)
    assert journal.pending_journal(str(path)) == header.raw
    recovered, rolled_back = journal.read_header_as_recovered(str(path))
    assert rolled_back and recovered.names == header.names  # what check mode predicts, nothing written
    assert journal.recover(str(path)) is True
    assert path.read_bytes() == original and not os.path.exists(journal.journal_path(str(path)))


def test_a_torn_journal_means_the_file_was_never_touched(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": np.zeros(2, dtype=np.float32)}, str(path))
    header = codec.read_header(str(path))
    with open(journal.journal_path(str(path)), "wb") as fh:
        fh.write(journal.journal_blob(header)[:-5])  # cut short before it was fsynced
    assert journal.pending_journal(str(path)) is None
    assert journal.recover(str(path)) is False and not os.path.exists(journal.journal_path(str(path)))
