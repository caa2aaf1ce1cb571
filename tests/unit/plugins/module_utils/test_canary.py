"""module_utils/_canary.py: SGLang's per-request counters read from a /metrics page, a window's difference, and
the canary's decision with both accept lengths."""

from __future__ import annotations

from tests.modules import module_utils

canary = module_utils("_canary")

PAGE = """# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m",is_streaming="false"} 10.0
sglang:num_requests_total{model_name="m",is_streaming="true"} 5.0
sglang:generation_tokens_total{model_name="m",is_streaming="false"} 300.0
sglang:generation_tokens_total{model_name="m",is_streaming="true"} 150.0
sglang:spec_verify_calls_total{model_name="m"} 180.0
sglang:num_requests_created{model_name="m",is_streaming="false"} 1.7e9
"""


def counted(requests, tokens, verify):
    return {"num_requests_total": requests, "generation_tokens_total": tokens, "spec_verify_calls_total": verify}


def test_counters_are_summed_over_their_label_sets():
    assert canary.counters(PAGE) == counted(15.0, 450.0, 180.0)
    assert canary.counters("") == counted(0.0, 0.0, 0.0)


def test_a_window_is_the_difference_and_a_restart_voids_it():
    assert canary.window(counted(10, 100, 50), counted(30, 400, 150)) == counted(20, 300, 100)
    assert canary.window(counted(10, 100, 50), counted(2, 10, 5)) is None


def test_a_worse_canary_is_rolled_back_naming_both_figures():
    got = canary.decide(counted(40, 80, 50), [counted(30, 200, 80), counted(30, 220, 90)], 5, 20)
    assert got["decision"] == "rollback" and got["canary_accept_length"] == 1.6
    assert got["peers_accept_length"] == round(420 / 170, 3) and got["peers_requests"] == 60
    assert "accept length 1.60 against the others' 2.47 (-35.2 %), more than 5 % below" in got["reason"]


def test_an_equal_or_better_canary_is_promoted():
    got = canary.decide(counted(40, 240, 100), [counted(40, 250, 100)], 5, 20)
    assert got["decision"] == "promote"
    assert got["reason"] == "accept length 2.40 against the others' 2.50 (-4.0 %), not more than 5 % below"
    assert canary.decide(counted(40, 300, 100), [counted(40, 250, 100)], 0, 20)["decision"] == "promote"


def test_too_little_traffic_decides_nothing():
    got = canary.decide(counted(3, 30, 10), [counted(40, 250, 100)], 5, 20)
    assert got["decision"] == "rollback" and got["reason"].startswith("only 3 request(s) reached the canary")
    got = canary.decide(counted(40, 300, 100), [counted(0, 0, 0)], 5, 20)
    assert got["decision"] == "rollback" and "the other servers served no speculative request" in got["reason"]
