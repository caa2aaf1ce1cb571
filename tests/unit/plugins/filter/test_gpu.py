"""GPU filters."""

from __future__ import annotations

import sys

import pytest
from ansible.errors import AnsibleFilterError

from tests.modules import ROOT

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
from gpu import FilterModule, nvidia_smi_csv


def test_parses_typed_rows():
    text = "0, GPU-a, 3, 97887, 31.00, 600.00\n1, GPU-b, [N/A], 97887, 462.57, 600.00\n"
    rows = nvidia_smi_csv(text, "index,uuid,memory.used,memory.total,power.draw,power.limit")
    assert rows == [
        {
            "index": 0,
            "uuid": "GPU-a",
            "memory_used": 3,
            "memory_total": 97887,
            "power_draw": 31.0,
            "power_limit": 600.0,
        },
        {
            "index": 1,
            "uuid": "GPU-b",
            "memory_used": None,
            "memory_total": 97887,
            "power_draw": 462.57,
            "power_limit": 600.0,
        },
    ]


def test_empty_output_is_no_rows():
    assert nvidia_smi_csv("", ["pid", "used_memory"]) == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0, 3 MiB\n", "non-numeric"),
        ("0, 3, 4\n", "printed 3 columns where 2 were queried"),
    ],
)
def test_bad_output_is_named(text, message):
    with pytest.raises(AnsibleFilterError, match=message):
        nvidia_smi_csv(text, ["index", "memory.used"])


def test_registered():
    assert "nvidia_smi_csv" in FilterModule().filters()
