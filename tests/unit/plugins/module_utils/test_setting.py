"""The served setting read in one place: auto in any case or spacing, the one default, anything else kept for
sglang_speculative_args to judge - the same answer from the filter deploy.yml uses and from the CLI."""

from __future__ import annotations

import argparse

import pytest

from tests.modules import module_utils

setting = module_utils("_setting")


@pytest.mark.parametrize(
    ("given", "auto", "draft_tokens"),
    [("auto", True, "auto"), (" AUTO ", True, "auto"), ("Auto", True, "auto"), (None, False, 16), ("", False, 16),
     ("  ", False, 16), (10, False, 10), ("5", False, "5"), ("500", False, "500"), ("abc", False, "abc")],
)  # fmt: skip
def test_served_setting(given, auto, draft_tokens):
    assert setting.served_setting(given) == {"auto": auto, "draft_tokens": draft_tokens}


def test_the_default_is_written_once():
    assert setting.DEFAULT_DRAFT_TOKENS == 16
    assert setting.served_setting(None)["draft_tokens"] == setting.DEFAULT_DRAFT_TOKENS


def test_the_filter_and_the_cli_read_it_alike():
    from ansible_collections.eagle3.ops.plugins.filter.sglang import FilterModule

    from eagle3_ops import cli

    served = FilterModule().filters()["served_setting"]
    for given in ("auto", " Auto", "10"):
        assert served(given)["auto"] == (cli._draft_tokens(given) == "auto")
    assert cli._draft_tokens("10") == 10
    with pytest.raises(argparse.ArgumentTypeError, match="neither a number of draft tokens nor auto"):
        cli._draft_tokens("ten")
