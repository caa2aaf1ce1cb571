"""module_utils/_status.py: each read of a status row on its own - a fake nvidia-smi's rows, no GPU tool at all, and
nothing listening where a server would be - none of them fails the row."""

from __future__ import annotations

import socket

from tests.modules import module_utils

status = module_utils("_status")


def params(**changes) -> dict:
    base = {"nvidia_smi": ["nvidia-smi"], "train_state": None, "python": None, "payload_dir": None, "server_url": "",
            "router_url": "", "timeout": 2, "api_key": None, "admin_key": None}  # fmt: skip
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
