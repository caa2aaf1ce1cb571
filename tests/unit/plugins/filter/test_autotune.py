"""draft_tokens=auto: the search space checked by SGLang's rules, and the choice by objective against the baseline."""

from __future__ import annotations

import sys

import pytest
from ansible.errors import AnsibleFilterError

from tests.modules import ROOT

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
from autotune import bench_choice, bench_settings, bench_settings_problem


def pt(tokens, tput, itl, conc=4, engine="sglang", topk=None, steps=None):
    return {
        "draft_tokens": tokens,
        "topk": topk or (1 if tokens else None),
        "steps": steps or (tokens - 1 if tokens else None),
        "output_throughput": tput,
        "median_itl_ms": itl,
        "max_concurrency": conc,
        "engine": engine,
    }


def test_the_space_becomes_sglang_settings_and_what_sglang_would_refuse_or_rewrite_is_refused():
    assert bench_settings([5, {"draft_tokens": 16, "topk": 4, "steps": 3}]) == [
        {"draft_tokens": 5, "topk": 1, "steps": 4},
        {"draft_tokens": 16, "topk": 4, "steps": 3},
    ]
    # a chain whose steps are not draft_tokens - 1: SGLang would run steps + 1 draft tokens instead
    assert "chain drafting (topk 1) verifies steps + 1 tokens" in bench_settings_problem(
        [{"draft_tokens": 8, "steps": 3}]
    )
    # a tree that drafts fewer candidates than it verifies: SGLang fails at draft time
    assert "exceeds what a tree of topk 2 and 2 steps" in bench_settings_problem(
        [{"draft_tokens": 9, "topk": 2, "steps": 2}]
    )
    assert "drafts chains only" in bench_settings_problem([{"draft_tokens": 8, "topk": 2, "steps": 3}], "reference")
    assert "repeats a setting" in bench_settings_problem([5, {"draft_tokens": 5}])
    assert "non-empty list" in bench_settings_problem([])
    assert "draft_tokens is 1" in bench_settings_problem([1])
    with pytest.raises(AnsibleFilterError, match="unknown: topK"):
        bench_settings([{"draft_tokens": 4, "topK": 2}])


def test_the_choice_follows_the_objective_at_the_given_concurrency_and_engine():
    points = [pt(None, 100, 20), pt(5, 143, 14), pt(10, 95, 12), pt(16, 66, 15),
              pt(None, 30, 5, conc=1), pt(5, 20, 4, conc=1), pt(None, 50, 9, engine="other")]  # fmt: skip
    best = bench_choice(points, "throughput", 4, "sglang")
    assert (best["speculative"], best["draft_tokens"], best["label"], best["ratio"]) == (True, 5, "5", 1.43)
    assert best["sentence"].startswith("Chosen 5 draft tokens: 143.0 output tok/s against 100.0")
    itl = bench_choice(points, "itl", 4, "sglang")
    assert (itl["draft_tokens"], itl["value"]) == (10, 12)


def test_no_setting_beats_the_baseline_so_no_speculation_unless_insisted():
    points = [pt(None, 100, 10), pt(5, 90, 11), pt(10, 70, 13)]
    plain = bench_choice(points, "throughput", 4, "sglang")
    assert plain["speculative"] is False and plain["draft_tokens"] is None and plain["label"] == "baseline"
    assert "No setting beats the baseline" in plain["sentence"] and "serving without speculation" in plain["sentence"]
    insisted = bench_choice(points, "throughput", 4, "sglang", insist=True)
    assert insisted["speculative"] is True and insisted["draft_tokens"] == 5
    with pytest.raises(AnsibleFilterError, match="no baseline and drafted points"):
        bench_choice(points, "throughput", 16, "sglang")
