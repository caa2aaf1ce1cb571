"""eagle3_common's keys entry point, run by Ansible on the controller: the serving keys generated once into a 0600
file and never printed, kept on a rerun, refused when others may read them or when one is missing, loaded from an
ansible-vault encrypted file, and nothing written in check mode."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import yaml

PLAY = """- name: The serving keys
  hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: eagle3.ops.eagle3_defaults
  tasks:
    - name: Load them
      ansible.builtin.import_role:
        name: eagle3.ops.eagle3_common
        tasks_from: keys
    - name: Write down a digest of each, never the key
      ansible.builtin.copy:
        dest: "{{ out }}"
        mode: "0600"
        content: "{{ [_k.api, _k.admin] | map('hash', 'sha256') | list | to_json }}"
      vars:
        _k: "{{ eagle3_common_keys }}"
      when: not ansible_check_mode
"""


def run(tmp_path: Path, *extra: str, check: bool = True, keys: Path | None = None) -> subprocess.CompletedProcess:
    from tests.conftest import run_playbook

    play = tmp_path / "play.yml"
    play.write_text(PLAY)
    return run_playbook(play, "-i", "localhost,", "-e", f"ansible_python_interpreter={sys.executable}",
                        "-e", f"eagle3_keys_file={keys or tmp_path / 'keys.yml'}", "-e", f"out={tmp_path / 'out.json'}",
                        *extra, check=check, timeout=120)  # fmt: skip


def test_keys_are_generated_once_private_and_never_printed(tmp_path):
    first = run(tmp_path)
    keys_file = tmp_path / "keys.yml"
    assert stat.S_IMODE(os.stat(keys_file).st_mode) == 0o600
    keys = yaml.safe_load(keys_file.read_text())
    assert sorted(keys) == ["admin", "api"] and len(set(keys.values())) == 2
    assert all(len(k) == 40 and k.isalnum() for k in keys.values())
    assert not any(k in first.stdout + first.stderr for k in keys.values())
    digests = (tmp_path / "out.json").read_text()
    again = run(tmp_path)
    assert yaml.safe_load(keys_file.read_text()) == keys  # kept, not regenerated
    assert (tmp_path / "out.json").read_text() == digests
    assert not any(k in again.stdout + again.stderr for k in keys.values())


def test_the_keys_files_directory_is_made_private_when_new_and_left_alone_when_not(tmp_path):
    keys = tmp_path / "home" / ".eagle3-ops" / "eagle3-keys.yml"
    run(tmp_path, keys=keys)
    assert stat.S_IMODE(os.stat(keys.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(keys).st_mode) == 0o600
    keys.unlink()
    os.chmod(keys.parent, 0o700 | stat.S_ISVTX)
    run(tmp_path, keys=keys)
    assert stat.S_IMODE(os.stat(keys.parent).st_mode) == 0o700 | stat.S_ISVTX and keys.exists()


def test_a_keys_file_others_may_read_is_refused_in_one_sentence(tmp_path):
    run(tmp_path)
    os.chmod(tmp_path / "keys.yml", 0o644)
    proc = run(tmp_path, check=False)
    assert proc.returncode == 2
    assert (f"{tmp_path / 'keys.yml'} holds the serving keys but others may read it (mode 0644): chmod 600 it"
            in " ".join(proc.stdout.split()))  # fmt: skip


def test_a_keys_file_without_the_admin_key_is_refused(tmp_path):
    (tmp_path / "keys.yml").write_text("api: " + "w" * 40 + "\n")
    os.chmod(tmp_path / "keys.yml", 0o600)
    proc = run(tmp_path, check=False)
    assert proc.returncode == 2 and "must hold an api and an admin key" in " ".join(proc.stdout.split())
    assert "w" * 40 not in proc.stdout


def test_the_same_key_twice_is_refused(tmp_path):
    (tmp_path / "keys.yml").write_text("api: " + "w" * 40 + "\nadmin: " + "w" * 40 + "\n")
    os.chmod(tmp_path / "keys.yml", 0o600)
    proc = run(tmp_path, check=False)
    assert proc.returncode == 2 and "the two different" in " ".join(proc.stdout.split())


def test_without_keys_nothing_is_written_or_loaded(tmp_path):
    proc = run(tmp_path, "-e", "eagle3_serving_keys=false", check=False)
    assert proc.returncode == 2 and "eagle3_common_keys" in proc.stdout  # the play's own read of the keys fails
    assert not (tmp_path / "keys.yml").exists()


def test_a_vault_encrypted_keys_file_loads(tmp_path):
    keys = {"api": "W" * 40, "admin": "A" * 40}
    (tmp_path / "keys.yml").write_text(yaml.safe_dump(keys))
    (tmp_path / "vault-pass").write_text("correct horse\n")
    vault = Path(sys.executable).parent / "ansible-vault"
    subprocess.run([str(vault), "encrypt", "--vault-password-file", str(tmp_path / "vault-pass"),
                    str(tmp_path / "keys.yml")], check=True, capture_output=True)  # fmt: skip
    os.chmod(tmp_path / "keys.yml", 0o600)
    assert "AA" not in (tmp_path / "keys.yml").read_text()
    run(tmp_path, "--vault-password-file", str(tmp_path / "vault-pass"))
    import hashlib
    import json

    want = [hashlib.sha256(keys[name].encode()).hexdigest() for name in ("api", "admin")]
    assert json.loads((tmp_path / "out.json").read_text()) == want


def test_check_mode_writes_no_keys(tmp_path):
    run(tmp_path, "--check")
    assert not (tmp_path / "keys.yml").exists()
