"""-e draft_tokens from the command line to what sglang_serve serves, as Ansible evaluates the defaults: eagle3_defaults
parses it once (the served_setting filter), sglang_serve takes the setting given or draft_tokens=auto's choice
(sglang_serve_setting), and a value the servers must refuse (0) reaches the refusal instead of becoming the default."""

from __future__ import annotations

import json
import sys

import pytest

PLAY = """- name: What sglang_serve would serve
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: eagle3.ops.eagle3_defaults
  tasks:
    - name: Load sglang_serve's defaults without running it
      ansible.builtin.include_role:
        name: eagle3.ops.sglang_serve
        tasks_from: router_check.yml
        public: true
      vars:
        sglang_serve_router: false
    - name: Write it down
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: "{{ {'speculative': sglang_serve_speculative, 'draft_tokens': sglang_serve_draft_tokens,
                     'topk': sglang_serve_topk, 'steps': sglang_serve_steps, 'auto': eagle3_defaults_auto} | to_json }}"
"""


@pytest.mark.parametrize(
    ("extra", "served"),
    [((), {"speculative": True, "draft_tokens": 16, "topk": None, "steps": None, "auto": False}),
     (("-e", "draft_tokens=5"), {"speculative": True, "draft_tokens": "5", "topk": None, "steps": None, "auto": False}),
     (("-e", '{"draft_tokens": 0}'), {"speculative": True, "draft_tokens": 0, "topk": None, "steps": None,
                                      "auto": False}),
     (("-e", "draft_tokens=AUTO"), {"speculative": True, "draft_tokens": "auto", "topk": None, "steps": None,
                                    "auto": True}),
     (("-e", '{"draft_tokens": 16, "speculative_topk": 4, "speculative_steps": 3}'),
      {"speculative": True, "draft_tokens": 16, "topk": 4, "steps": 3, "auto": False}),
     (("-e", '{"speculative": false}'), {"speculative": False, "draft_tokens": 16, "topk": None, "steps": None,
                                         "auto": False}),
     # deploy.yml's rollout under draft_tokens=auto: the benchmark's choice; no draft chosen serves the target alone
     (("-e", "draft_tokens=auto", "-e", '{"sglang_serve_setting": {"speculative": false, "draft_tokens": null, '
                                        '"topk": null, "steps": null}}'),
      {"speculative": False, "draft_tokens": 16, "topk": None, "steps": None, "auto": True})],
)  # fmt: skip
def test_the_served_setting_from_the_command_line_to_the_server(tmp_path, extra, served):
    from tests.conftest import run_playbook

    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    run_playbook(play, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                 "-e", f"out={tmp_path / 'served.json'}", *extra, timeout=120)
    assert json.loads((tmp_path / "served.json").read_text()) == served
