"""module_utils/_cleanup.py: a cleanup's summary, which a fleet's report and a converged host read."""

from __future__ import annotations

from tests.modules import module_utils

cleanup = module_utils("_cleanup")


def result(**changes) -> dict:
    base = {"holders": [], "targets": [], "units": [], "signalled": [], "killed": [], "survivors": [], "freed_mib": 0,
            "observers": [], "spared_ancestors": []}  # fmt: skip
    return {**base, **changes}


def test_an_idle_host_is_idle():
    got = cleanup.summarised(result())
    assert got["idle"] is True
    assert got["summary"] == {"holders": 0, "signalled": 0, "killed": 0, "survivors": 0, "freed_mib": 0,
                              "observers": 0, "spared_sessions": 0, "units_stopped": [], "targets": []}  # fmt: skip


def test_a_unit_to_stop_or_a_holder_is_work():
    assert cleanup.summarised(result(units=[{"unit": "eagle3-train", "action": "stop"}]))["idle"] is False
    got = cleanup.summarised(result(holders=[{"pid": 7}], targets=[7], signalled=[7], killed=[7], freed_mib=512,
                                    units=[{"unit": "eagle3-train", "action": "stopped"}]))  # fmt: skip
    assert got["idle"] is False
    assert got["summary"]["units_stopped"] == ["eagle3-train"] and got["summary"]["freed_mib"] == 512
