"""module_utils/_gpu.py: systemd's time spans and the GPUs a cleanup is asked for."""

from __future__ import annotations

import pytest

from tests.modules import module_utils

gpu = module_utils("_gpu")


@pytest.mark.parametrize(("span", "seconds"), [("2min", 120.0), ("1min 30s", 90.0), ("500ms", 0.5), ("infinity", None),
                                               ("", None), ("3 fortnights", None)])  # fmt: skip
def test_systemd_spans(span, seconds):
    assert gpu.systemd_seconds(span) == seconds


def test_gpus_by_index_or_uuid():
    gpus = [{"index": 0, "uuid": "GPU-a"}, {"index": 1, "uuid": "GPU-b"}]
    assert gpu.resolve_gpus([], gpus) is None
    assert gpu.resolve_gpus(["1", "GPU-a"], gpus) == {0, 1}
    with pytest.raises(ValueError, match="neither an index nor the UUID"):
        gpu.resolve_gpus(["GPU-z"], gpus)
