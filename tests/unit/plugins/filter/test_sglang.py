"""Speculative arguments derived from draft_tokens, and benchmark points: the filter plugin's table of cases."""

from __future__ import annotations

import sys

import pytest
from ansible.errors import AnsibleFilterError

from tests.modules import ROOT

sys.path.insert(0, str(ROOT / "plugins" / "filter"))
from sglang import bench_point, sglang_speculative_args, sglang_speculative_problem, tree_limit


@pytest.mark.parametrize(
    ("draft_tokens", "topk", "steps", "expected"),
    [
        (16, None, None, ("chain", 15, 1, 16)),
        ("10", None, None, ("chain", 9, 1, 10)),  # -e draft_tokens=10 arrives as a string
        (5, 1, None, ("chain", 4, 1, 5)),
        (5, 1, 4, ("chain", 4, 1, 5)),
        (2, None, None, ("chain", 1, 1, 2)),
        (8.0, None, None, ("chain", 7, 1, 8)),
        (8, 4, 3, ("tree", 3, 4, 8)),
        (13, "4", "3", ("tree", 3, 4, 13)),
        (64, None, None, ("chain", 63, 1, 64)),
    ],
)
def test_derivation(draft_tokens, topk, steps, expected):
    args = sglang_speculative_args(draft_tokens, topk, steps)
    assert (args["mode"], args["num_steps"], args["eagle_topk"], args["num_draft_tokens"]) == expected
    assert args["algorithm"] == "EAGLE3"
    assert args["argv"] == ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(expected[1]),
                            "--speculative-eagle-topk", str(expected[2]),
                            "--speculative-num-draft-tokens", str(expected[3])]  # fmt: skip


@pytest.mark.parametrize(
    ("draft_tokens", "topk", "steps", "message"),
    [
        (0, None, None, "draft_tokens is 0; it must be between 2 and 64"),
        (-3, None, None, "draft_tokens is -3"),
        (1, None, None, "draft_tokens is 1"),
        (65, None, None, "it must be between 2 and 64"),
        (1.5, None, None, "must be a whole number, got 1.5"),
        ("1.5", None, None, "must be an integer, got '1.5'"),
        ("abc", None, None, "must be an integer, got 'abc'"),
        ("", None, None, "must be an integer"),
        (True, None, None, "must be an integer, got True"),
        (None, None, None, "must be an integer, got None"),
        ([16], None, None, "must be an integer"),
        (16, 4, None, "needs steps as well"),
        (16, None, 4, "steps 4 contradicts draft_tokens 16"),
        (12, 2, 3, "exceeds what a tree of topk 2 and 3 steps drafts for SGLang to verify (2 + 2*2*2 + 1 = 11)"),
        (38, 4, 3, "(4 + 2*4*4 + 1 = 37)"),
        (16, 0, None, "speculative topk is 0"),
        (16, 2, 0, "speculative steps is 0"),
    ],
)
def test_bad_values_name_the_value(draft_tokens, topk, steps, message):
    with pytest.raises(AnsibleFilterError, match=None) as err:
        sglang_speculative_args(draft_tokens, topk, steps)
    assert message in str(err.value)


def test_limits_from_the_draft():
    with pytest.raises(AnsibleFilterError, match="do not fit the draft's context of 8"):
        sglang_speculative_args(16, context_length=8)
    assert sglang_speculative_args(32, max_draft_tokens=32)["num_steps"] == 31
    with pytest.raises(AnsibleFilterError, match="between 2 and 8"):
        sglang_speculative_args(9, max_draft_tokens=8)
    # As -e gives them: strings of digits count, anything else is one sentence naming the option.
    assert sglang_speculative_args("16", "4", "3", max_draft_tokens="64", context_length="2048")["mode"] == "tree"
    for option, value in (("max_draft_tokens", "lots"), ("context_length", "2k"), ("max_draft_tokens", None)):
        with pytest.raises(AnsibleFilterError, match=f"^{option} must be an integer"):
            sglang_speculative_args(16, **{option: value})
    assert "max_draft_tokens must be an integer" in sglang_speculative_problem(16, max_draft_tokens="x")


def test_sglangs_documented_tree_runs_and_the_limit_grows_with_topk_squared():
    # SGLang's docs: --speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 16.
    assert sglang_speculative_args(16, 4, 3)["argv"][-1] == "16"
    assert [tree_limit(k, s) for k, s in ((4, 3), (2, 3), (8, 3), (4, 5), (5, 1))] == [37, 11, 137, 69, 6]
    assert sglang_speculative_args(37, 4, 3)["num_draft_tokens"] == 37


def test_bench_point_labels_and_fields():
    result = {"output_throughput": 410.5, "median_ttft_ms": 12.0, "spec_accept_length": 2.9, "extra": 1}
    point = bench_point([result, "4"], "16", "ct130")
    assert point["max_concurrency"] == 4 and point["draft_tokens"] == 16 and point["label"] == "16"
    assert point["accept_length"] == 2.9 and "extra" not in point and point["host"] == "ct130"
    tree = bench_point([result, 4], {"draft_tokens": 16, "topk": 4, "steps": 3}, "ct130")
    assert (tree["topk"], tree["steps"], tree["label"]) == (4, 3, "16 (tree topk 4, 3 steps)")
    base = bench_point([{"output_throughput": 200.0}, 1], None, "ct130")
    assert base["draft_tokens"] is None and base["label"] == "baseline"
    with pytest.raises(AnsibleFilterError, match="not a JSON object"):
        bench_point(["oops", 1], 16, "h")
