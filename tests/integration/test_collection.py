"""The repository is the collection eagle3.ops: built, installed into an empty directory, used by FQCN."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from tests.conftest import ROOT

BIN = Path(sys.executable).parent

PLAYBOOK = """
- name: Use eagle3.ops from an installed collection
  hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Rename a drafter's keys with the collection's module
      eagle3.ops.safetensors_remap:
        path: "{{ ckpt }}"
      register: remap

    - name: Derive SGLang's speculative arguments with the collection's filter
      ansible.builtin.set_fact:
        spec: "{{ 16 | eagle3.ops.sglang_speculative_args }}"

    - name: Read the GPUs through the collection's role (two emulated ones)
      ansible.builtin.import_role:
        name: eagle3.ops.gpu_facts
      vars:
        gpu_facts_nvidia_smi: "{{ smi }}"

    - name: Write what was used
      ansible.builtin.copy:
        dest: "{{ out }}"
        content: >-
          {{ {'renamed': remap.renames | length, 'steps': spec.num_steps, 'gpus': gpu_facts_gpus | length} | to_json }}
        mode: "0644"
"""


def test_build_install_and_use_by_fqcn(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    # Not the checkout's ansible.cfg (whose collections path links this checkout): only the installed copy resolves.
    (tmp_path / "empty.cfg").write_text("[defaults]\n")
    env["ANSIBLE_CONFIG"] = str(tmp_path / "empty.cfg")
    env["ANSIBLE_COLLECTIONS_PATH"] = str(tmp_path / "collections")
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(tmp_path / "dist"),
                            str(ROOT)], capture_output=True, text=True, env=env, check=False)
    assert build.returncode == 0, build.stderr
    tarball = next((tmp_path / "dist").glob("eagle3-ops-*.tar.gz"))
    # Only what the repository tracks ships (the checkout's environments and labs are beside it, ignored by git).
    with tarfile.open(tarball) as tar:
        shipped = {m.name for m in tar.getmembers() if m.isfile()} - {"MANIFEST.json", "FILES.json"}
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False)
    if tracked.returncode == 0:  # (a source tree without git: nothing to compare with)
        assert shipped <= set(tracked.stdout.splitlines()), sorted(shipped - set(tracked.stdout.splitlines()))[:10]
    assert tarball.stat().st_size < 2 * 1024 * 1024, f"the collection is {tarball.stat().st_size} bytes"
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", "-p", str(tmp_path / "collections"),
                              str(tarball)], capture_output=True, text=True, env=env, check=False)
    assert install.returncode == 0, install.stderr
    installed = tmp_path / "collections" / "ansible_collections" / "eagle3" / "ops"
    assert (installed / "plugins" / "modules" / "gpu_cleanup.py").exists()
    assert not (installed / "tests").exists() and not (installed / ".venv").exists()

    ckpt = tmp_path / "model.safetensors"
    save_file({"layers.0.mlp.up_proj.weight": np.ones((4, 4), np.float32), "fc.weight": np.ones(2, np.float32)},
              str(ckpt))
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / name).write_bytes(b"")
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nNVEMU_DEV_DIR={dev} NVEMU_CTX_DIR={tmp_path / 'ctx'} "
                   f"exec {sys.executable} {ROOT / 'eagle3_ops' / 'lab_host' / 'nvemu.py'} smi \"$@\"\n")
    smi.chmod(0o755)
    out = tmp_path / "out.json"
    extra = [f"ckpt={ckpt}", f"smi={smi}", f"out={out}", f"ansible_python_interpreter={sys.executable}"]
    play = subprocess.run([str(BIN / "ansible-playbook"), str(tmp_path / "play.yml"),
                           *(arg for pair in extra for arg in ("-e", pair))],
                          cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert play.returncode == 0, play.stdout[-3000:] + play.stderr[-2000:]
    assert json.loads(out.read_text()) == {"renamed": 1, "steps": 15, "gpus": 2}
    assert "midlayer.mlp.up_proj.weight" in load_file(str(ckpt))
