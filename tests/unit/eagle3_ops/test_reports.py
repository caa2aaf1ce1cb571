"""Benchmark report (module eagle3.ops.bench_report): JSON, markdown table with speedups against the same sweep's
baseline of the same engine, and a PNG with axes from 0 (speedup) and 1 (accept length)."""

from __future__ import annotations

import json

import pytest

from tests.modules import module_utils, run_module

_bench = module_utils("_bench")


def _points():
    pts = []
    for conc, base in ((1, 100.0), (4, 300.0)):
        pts.append({"max_concurrency": conc, "draft_tokens": None, "output_throughput": base, "accept_length": None,
                    "engine": "reference"})
        for dt, gain, acc in ((5, 1.8, 2.6), (10, 2.0, 2.9), (16, 1.9, 3.0)):
            pts.append({"max_concurrency": conc, "draft_tokens": dt, "output_throughput": base * gain,
                        "accept_length": acc, "median_ttft_ms": 10.0, "p99_itl_ms": 4.0,
                        "engine": "reference"})  # fmt: skip
    return pts


def _run(args, capsys, check=False):
    return run_module("bench_report", args, check=check, capsys=capsys)


def test_report_files_and_speedups(tmp_path, capsys):
    dest = tmp_path / "r"
    result = _run({"points": _points(), "dest": str(dest), "meta": {"target": "tiny", "engine": "reference"}}, capsys)
    assert result["changed"] and set(result["paths"]) == {"json", "md", "png"}
    data = json.loads((dest / "bench.json").read_text())
    by = {(p["draft_tokens"], p["max_concurrency"]): p for p in data["points"]}
    assert by[(10, 4)]["speedup"] == pytest.approx(2.0) and by[(None, 1)]["speedup"] is None
    md = (dest / "bench.md").read_text()
    assert "| 10 | reference | 4 | 600.0 | 2.00 |" in md and "| baseline | reference | 1 | 100.0 | - |" in md
    assert "engine: reference" in md and md == result["markdown"]
    png = (dest / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]  # no temporary left
    # The same points again: nothing changes; check mode writes nothing.
    again = _run({"points": _points(), "dest": str(dest), "meta": {"target": "tiny", "engine": "reference"}}, capsys)
    assert again["changed"] is False
    fresh = tmp_path / "fresh"
    assert _run({"points": _points(), "dest": str(fresh)}, capsys, check=True)["changed"]
    assert not fresh.exists()


def test_speedups_compare_within_one_engine():
    points = [{"max_concurrency": 1, "draft_tokens": None, "output_throughput": 500.0, "engine": "sglang"},
              {"max_concurrency": 1, "draft_tokens": None, "output_throughput": 100.0, "engine": "reference"},
              {"max_concurrency": 1, "draft_tokens": 5, "output_throughput": 200.0, "engine": "reference"},
              {"max_concurrency": 1, "draft_tokens": 5, "output_throughput": 900.0, "engine": "vllm"}]  # fmt: skip
    got = [p["speedup"] for p in _bench.speedups(points)]
    assert got == [None, None, pytest.approx(2.0), None]  # no baseline of its engine: no speedup


def test_no_points_is_a_one_sentence_error(tmp_path, capsys):
    result = _run({"points": [], "dest": str(tmp_path / "o")}, capsys)
    assert result["failed"]
    assert "no benchmark points" in result["msg"] and not (tmp_path / "o").exists()
    result = _run({"points": [{"draft_tokens": 5}], "dest": str(tmp_path / "o")}, capsys)
    assert "point 0 lacks max_concurrency, output_throughput" in result["msg"]
