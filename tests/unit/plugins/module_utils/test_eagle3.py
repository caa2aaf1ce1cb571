"""module_utils/_eagle3.py: SGLang's release lines as the export reads them."""

from __future__ import annotations

import pytest

from tests.modules import module_utils

eagle3 = module_utils("_eagle3")


@pytest.mark.parametrize(("given", "parsed"), [("0.5.23", (0, 5, 23)), ("0.5.23.post1", (0, 5, 23)),
                                               ("v0.5.23rc1", (0, 5, 23)), (" 0.4 ", (0, 4))])  # fmt: skip
def test_versions(given, parsed):
    assert eagle3.parse_version(given) == parsed


def test_a_word_is_no_version():
    with pytest.raises(eagle3.ExportError, match="is not a version number"):
        eagle3.parse_version("latest")


def test_lines():
    assert eagle3.sglang_line(None).name == eagle3.sglang_line("legacy").name == "legacy"
    assert eagle3.sglang_line("0.4.9").name == "legacy"
    newest = eagle3.sglang_line("0.5.23")
    assert newest.name != "legacy" and eagle3.sglang_line("0.6.0").name == newest.name
