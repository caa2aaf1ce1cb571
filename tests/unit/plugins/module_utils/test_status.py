"""module_utils/_status.py: each read of a status row on its own - a fake nvidia-smi's rows, no GPU tool at all, and
nothing listening where a server would be - none of them fails the row."""

from __future__ import annotations

import json
import socket

import pytest

from tests.modules import module_utils

status = module_utils("_status")


def params(**changes) -> dict:
    base = {"nvidia_smi": ["nvidia-smi"], "train_state": None, "python": None, "payload_dir": None, "server_url": "",
            "router_url": "", "timeout": 2, "api_key": None, "admin_key": None, "served_record": None,
            "accept_drift_percent": 15.0}  # fmt: skip
    return {**base, **changes}


def test_gpus_from_nvidia_smi_and_none_without_it(tmp_path):
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, GPU-a, H100, 512, 81559, 70.5, 700.0, 3'\n")
    smi.chmod(0o755)
    rows = status.StatusReader(params(nvidia_smi=[str(smi)])).gpus()
    assert rows == [{"index": 0, "uuid": "GPU-a", "name": "H100", "memory_used": 512, "memory_total": 81559,
                     "power_draw": 70.5, "power_limit": 700.0, "utilization_gpu": 3}]  # fmt: skip
    got = status.StatusReader(params(nvidia_smi=[str(tmp_path / "none")])).read()
    assert got["gpus"] == [] and got["gpus_read"] is False and got["changed"] is False


def test_nothing_listening_is_no_server_and_no_router():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reader = status.StatusReader(params(server_url=f"http://127.0.0.1:{port}", router_url=f"http://127.0.0.1:{port}"))
    assert reader.serving() is None and reader.router() is None and reader.training() is None


METRICS = """# HELP sglang:spec_accept_length Mean acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 2.25
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 512.5
sglang:spec_accept_rate{model_name="m"} 0.4
"""


def test_the_live_figures_are_sglangs_gauges_and_zero_is_nothing_measured():
    assert status.live_figures(METRICS) == {"live_accept_length": 2.25, "tokens_per_s": 512.5}
    idle = METRICS.replace("} 2.25", "} 0.0").replace("} 512.5", "} 0.0")
    assert status.live_figures(idle) == {"live_accept_length": None, "tokens_per_s": None}
    assert status.live_figures(None) == {"live_accept_length": None, "tokens_per_s": None}


@pytest.mark.parametrize(("live", "gate", "percent", "warns"), [
    (2.25, 2.70, 15, True),    # 16.7% below
    (2.31, 2.70, 15, False),   # 14.4% below
    (2.25, 2.70, 20, False),
    (None, 2.70, 15, False),   # nothing measured live
    (2.25, None, 15, False),   # no deploy figure
])  # fmt: skip
def test_drift_is_the_live_figure_more_than_the_percent_below_the_gates(live, gate, percent, warns):
    said = status.drift_warning({"live_accept_length": live, "gate_accept_length": gate}, percent)
    assert (said is not None) == warns
    if warns:
        assert said.startswith(f"accepts {live:.2f} tokens per step live, 17% below the {gate:.2f} its gate measured")


def test_the_gates_figure_is_read_for_the_draft_served_now(tmp_path):
    record = tmp_path / "sglang.json"
    record.write_text(json.dumps({"accept_length": 2.7, "draft": "/d/v2"}))
    reader = status.StatusReader(params(served_record=str(record)))
    assert reader.gate_figure("/d/v2") == 2.7 and reader.gate_figure("/d/v1") is None
    assert status.StatusReader(params(served_record=str(tmp_path / "none"))).gate_figure("/d/v2") is None
