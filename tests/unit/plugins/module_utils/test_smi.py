"""module_utils/_smi.py: nvidia-smi's CSV typed, and its argv."""

from __future__ import annotations

import pytest

from tests.modules import module_utils

smi = module_utils("_smi")


@pytest.mark.parametrize(
    ("field", "value", "typed"),
    [("index", "3", 3), ("memory.used", "1024.0", 1024), ("power.draw", "71.5", 71.5), ("name", "H100", "H100"),
     ("memory.used", "[N/A]", None), ("power.limit", "N/A", None)],
)  # fmt: skip
def test_values_are_typed(field, value, typed):
    assert smi.smi_value(field, value) == typed


def test_a_non_numeric_value_is_named():
    with pytest.raises(ValueError, match=r"memory\.used has the non-numeric value 'lots'"):
        smi.smi_value("memory.used", "lots")


def test_rows_and_their_argv():
    fields = ["index", "memory.used"]
    assert smi.smi_rows("0, 512\n\n1, [N/A]\n", fields) == [{"index": 0, "memory_used": 512},
                                                             {"index": 1, "memory_used": None}]  # fmt: skip
    with pytest.raises(ValueError, match="printed 3 columns where 2 were queried"):
        smi.smi_rows("0, 512, MiB", fields)
    assert smi.smi_argv(["nvidia-smi"], fields) == ["nvidia-smi", "--query-gpu=index,memory.used",
                                                    "--format=csv,noheader,nounits"]  # fmt: skip


def test_a_missing_nvidia_smi_answers_none():
    assert smi.run_smi(["/nonexistent/nvidia-smi"], "query-gpu", "index") is None
