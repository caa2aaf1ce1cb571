"""The status table of eagle3-ops."""

from __future__ import annotations

from eagle3_ops.cli import build_parser, render_status


def test_status_table():
    rows = {
        "ct129": {"state": "running", "gpus": [
            {"memory_used": 30003, "memory_total": 97887, "power_draw": 462.5, "power_limit": 600.0,
             "utilization_gpu": 95}] * 4,
            "training": {"n": 3, "total_seq_len": 16384, "cause": "running"}},
        "ct130": {"state": "unreachable"},
    }  # fmt: skip
    lines = render_status(rows).splitlines()
    assert lines[0].split()[:3] == ["HOST", "STATE", "GPUS"]
    assert lines[1].split()[:3] == ["ct129", "running", "4"]
    assert "117.2/382.4 GiB" in lines[1] and "1850/2400 W" in lines[1] and "95%" in lines[1]
    assert "attempt 3 seq 16384: running" in lines[1]
    assert lines[2].split() == ["ct130", "unreachable", "0", "-", "-", "-", "-"]


def test_parser_has_the_commands():
    parser = build_parser()
    for argv in (["lab", "up"], ["cleanup", "-l", "trainers", "--check"], ["provision", "-i", "x"], ["status"]):
        assert parser.parse_args(argv).func
