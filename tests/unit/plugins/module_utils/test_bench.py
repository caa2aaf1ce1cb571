"""module_utils/_bench.py: benchmark points checked, and speedups against the baseline at the same concurrency."""

from __future__ import annotations

from tests.modules import module_utils

bench = module_utils("_bench")


def test_points_are_checked():
    assert bench.check_points([]) and bench.check_points(None)
    assert bench.check_points([{"max_concurrency": 1}]) == [
        "point 0 lacks output_throughput: pass the points spec_bench recorded"]
    assert bench.check_points([{"max_concurrency": 1, "output_throughput": 10.0}]) == []


def test_speedups_are_against_the_baseline_at_the_same_concurrency():
    points = [{"max_concurrency": 1, "output_throughput": 10.0, "draft_tokens": None},
              {"max_concurrency": 1, "output_throughput": 25.0, "draft_tokens": 16},
              {"max_concurrency": 4, "output_throughput": 30.0, "draft_tokens": 16}]  # fmt: skip
    got = [p["speedup"] for p in bench.speedups(points)]
    assert got == [None, 2.5, None]  # the baseline itself, 25/10, no baseline at 4
