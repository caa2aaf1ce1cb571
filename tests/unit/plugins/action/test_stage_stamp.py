"""stage_stamp's controller half: a stage's variables are the declared inputs of its roles (meta/inputs.yml) and the
names it gives, exactly - never a pattern - and secrets are never fingerprinted."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleError

from tests.modules import init_collection_loader

init_collection_loader()

from ansible_collections.eagle3.ops.plugins.action import stage_stamp  # noqa: E402


class _Templar:
    def template(self, value):
        return value


def action() -> stage_stamp.ActionModule:
    plugin = stage_stamp.ActionModule.__new__(stage_stamp.ActionModule)
    plugin._templar = _Templar()
    return plugin


def test_every_stage_role_declares_its_inputs():
    for role in ("eagle3_train", "sglang_serve", "lab_host", "sglang_router"):
        inputs = stage_stamp.declared_inputs(role)
        assert inputs and all(isinstance(name, str) for name in inputs)


def test_exactly_the_named_variables_are_taken_and_never_a_secret():
    task_vars = {"draft_tokens": 16, "draft_tokens_old": 5, "eagle3_x": 1, "sglang_serve_api_key": "k",
                 "proxmox_api_password": "p"}  # fmt: skip
    got = action()._var_digests(task_vars, ["draft_tokens", "sglang_serve_api_key", "proxmox_api_password", "absent"])
    assert sorted(got) == ["var:draft_tokens"]  # not draft_tokens_old, not eagle3_x, no secret, nothing undefined


@pytest.mark.parametrize(("text", "says"), [(None, "cannot be read"), ("inputs: eagle3_x\n", "no list of names"),
                                            ("inputs: [1, [2]]\n", "no list of names")])  # fmt: skip
def test_a_role_without_a_readable_declaration_is_named(tmp_path: Path, text: str | None, says: str):
    role = tmp_path / "demo" / "meta"
    role.mkdir(parents=True)
    if text is not None:
        (role / "inputs.yml").write_text(text)
    with pytest.raises(AnsibleError, match=f"inputs of role demo|{says}") as exc:
        stage_stamp.declared_inputs("demo", roles_dir=tmp_path)
    assert says in str(exc.value) and "demo" in str(exc.value)
