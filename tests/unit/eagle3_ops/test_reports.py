"""Benchmark report: JSON, markdown table with speedups against the same sweep's baseline, and a PNG."""

from __future__ import annotations

import json

import pytest

from eagle3_ops import reports


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


def test_report_files_and_speedups(tmp_path):
    paths = reports.bench_report(_points(), str(tmp_path / "r"), {"target": "tiny", "engine": "reference"})
    data = json.loads((tmp_path / "r" / "bench.json").read_text())
    by = {(p["draft_tokens"], p["max_concurrency"]): p for p in data["points"]}
    assert by[(10, 4)]["speedup"] == pytest.approx(2.0) and by[(None, 1)]["speedup"] is None
    md = (tmp_path / "r" / "bench.md").read_text()
    assert "| 10 | reference | 4 | 600.0 | 2.00 |" in md and "| baseline | reference | 1 | 100.0 | - |" in md
    assert "engine: reference" in md
    png = (tmp_path / "r" / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert set(paths) == {"json", "md", "png"}


def test_speedups_compare_within_one_engine():
    points = [{"max_concurrency": 1, "draft_tokens": None, "output_throughput": 500.0, "engine": "sglang"},
              {"max_concurrency": 1, "draft_tokens": None, "output_throughput": 100.0, "engine": "reference"},
              {"max_concurrency": 1, "draft_tokens": 5, "output_throughput": 200.0, "engine": "reference"},
              {"max_concurrency": 1, "draft_tokens": 5, "output_throughput": 900.0, "engine": "vllm"}]  # fmt: skip
    got = [p["speedup"] for p in reports.speedups(points)]
    assert got == [None, None, pytest.approx(2.0), None]  # no baseline of its engine: no speedup


def test_no_points_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="no benchmark points"):
        reports.bench_report([], str(tmp_path))
    src = tmp_path / "empty.json"
    src.write_text("[]")
    assert reports.main(["bench", "--results", str(src), "--out", str(tmp_path / "o")]) == 1
