"""The serving plane's keys as the modules send them, and the sentence for a refused one."""

from __future__ import annotations

import pytest

from tests.modules import module_utils

auth = module_utils("_auth")


def test_a_key_is_a_bearer_added_to_the_headers_and_none_adds_nothing():
    assert auth.bearer("K", {"Content-Type": "application/json"}) == {"Content-Type": "application/json",
                                                                      "Authorization": "Bearer K"}  # fmt: skip
    assert auth.bearer(None) == {} and auth.bearer("", {"A": "b"}) == {"A": "b"}


@pytest.mark.parametrize(("code", "key", "says"), [
    (401, "K" * 40, "The router refused the serving plane's admin key (HTTP 401): the key it runs with differs"),
    (403, None, "The router asks for a key (HTTP 403) and none was sent"),
    (500, "K", None),
    (None, "K", None),
])  # fmt: skip
def test_a_refusal_names_the_key_it_wanted_and_never_the_key(code, key, says):
    got = auth.refused(code, "The router", key, "admin")
    if says is None:
        assert got is None
    else:
        assert got.startswith(says) and (key or "unset") not in got


def test_the_keys_are_options_that_are_never_logged():
    assert auth.API_KEY_SPEC["api_key"]["no_log"] is True and auth.ADMIN_KEY_SPEC["admin_key"]["no_log"] is True
