"""The pct connection's command line: loaded through Ansible's plugin loader, parsed by a real shell."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.modules import ROOT

os.environ.setdefault("ANSIBLE_CONFIG", str(ROOT / "ansible.cfg"))

from ansible.errors import AnsibleConnectionFailure
from ansible.playbook.play_context import PlayContext
from ansible.plugins.loader import connection_loader

ARGV_DUMPER = '#!/bin/sh\nfor a in "$@"; do printf \'%s\\0\' "$a"; done\n'


@pytest.fixture(scope="module")
def fake_pct(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("bin") / "pct"
    path.write_text(ARGV_DUMPER)
    path.chmod(0o755)
    return path


def make(**options) -> object:
    conn = connection_loader.get("eagle3.ops.pct", PlayContext(), None)
    assert conn is not None, "pct connection plugin not found by the loader"
    direct = {"vmid": 129, "host": "pve1.example.org", "remote_user": "root"}
    direct.update(options)
    conn.set_options(direct=direct)
    return conn


def remote_argv(line: str) -> list[bytes]:
    """What the hypervisor's POSIX login shell hands to the program when ssh delivers `line`."""
    out = subprocess.run(["/bin/sh", "-c", line], capture_output=True, check=True).stdout
    return out.split(b"\0")[:-1]


def test_loader_finds_plugin_and_ssh_options():
    conn = make()
    assert conn.transport == "pct"
    assert conn.has_pipelining
    # Options inherited from the installed ansible-core ssh plugin are accepted.
    assert conn.get_option("ssh_executable") == "ssh"
    assert conn.get_option("use_tty") is False


def test_command_shape(fake_pct):
    conn = make(pct_executable=str(fake_pct))
    argv = remote_argv(conn.build_pct_command(["/bin/sh", "-c", "echo hi"]))
    assert argv == [
        b"exec",
        b"129",
        b"--keep-env",
        b"0",
        b"--",
        b"/usr/bin/env",
        b"HOME=/root",
        b"LOGNAME=root",
        b"USER=root",
        b"/bin/sh",
        b"-c",
        b"echo hi",
    ]


def test_keep_env_passes_the_command_directly(fake_pct):
    conn = make(pct_executable=str(fake_pct), keep_env=True)
    assert remote_argv(conn.build_pct_command(["true"])) == [b"exec", b"129", b"--keep-env", b"1", b"--", b"true"]


@pytest.mark.parametrize(
    ("user", "mode", "sudo"),
    [
        ("root", "auto", False),
        ("ansible", "auto", True),
        ("root", "always", True),
        ("ansible", "never", False),
    ],
)
def test_sudo_prefix_for_non_root_hypervisor_users(user, mode, sudo):
    line = make(remote_user=user, hypervisor_sudo=mode).build_pct_command(["true"])
    assert line.startswith("sudo -n -- pct exec") == sudo


def test_vmid_is_validated():
    with pytest.raises(Exception, match="set pct_vmid to the container's numeric ID"):
        make(vmid=12).build_pct_command(["true"])


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=200))
def test_any_command_string_arrives_byte_exact(fake_pct, cmd):
    # fake_pct is module-scoped, so hypothesis may reuse it across examples.
    conn = make(pct_executable=str(fake_pct))
    argv = remote_argv(conn.build_pct_command(["/bin/sh", "-c", cmd]))
    assert argv[-1] == cmd.encode()
    assert argv[:2] == [b"exec", b"129"]


@pytest.mark.parametrize(
    ("stderr", "rc", "needle"),
    [
        (b"Configuration file 'nodes/pve1/lxc/129.conf' does not exist\n", 255, "does not exist: check pct_vmid"),
        (b"container '129' not running!\n", 255, "is not running: start it with 'pct start 129'"),
        (b"bash: line 1: pct: command not found\n", 127, "pct was not found on the hypervisor"),
        (b"sudo: a password is required\n", 1, "sudo on the hypervisor"),
        (b"only root can run this command\n", 255, "needs root"),
    ],
)
def test_failures_are_explained(stderr, rc, needle):
    conn = make(node="pve1")
    conn.host = "pve1.example.org"
    text = conn._explain(rc, stderr)
    assert text is not None and needle in text
    assert "CT 129 on node pve1" in text


def test_command_failures_are_not_misread_as_connection_problems():
    conn = make()
    conn.host = "h"
    assert conn._explain(1, b"grep: nothing matched\n") is None
    assert conn._explain(127, b"/bin/sh: 1: nvcc: not found\n") is None


def test_pipelining_follows_the_ssh_settings():
    # The project's ansible.cfg turns pipelining on; the plugin must see it (a lost ini key once cost 3x).
    conn = make()
    assert conn.get_option("pipelining") is True
    assert conn.is_pipelining_enabled() is True


# -- file transfers go through ssh's retry path ---------------------------------------------------------

FAKE_SSH = """#!/bin/sh
# A stand-in for ssh to the hypervisor: every other connection drops (exit 255, as ssh does on a reset);
# the others run the remote line here, as the hypervisor's shell would.
count="$FAKE_SSH_STATE/count"
n=$(( $(cat "$count" 2>/dev/null || echo 0) + 1 ))
echo "$n" > "$count"
if [ $(( n % 2 )) -eq 1 ]; then
  echo "Connection reset by peer" >&2
  exit 255
fi
for last; do :; done
exec /bin/sh -c "$last"
"""
FAKE_PCT_EXEC = """#!/bin/sh
# pct exec VMID [options] -- CMD...: run CMD here.
while [ "$1" != "--" ]; do shift; done
shift
exec "$@"
"""


@pytest.fixture
def flaky_hop(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh", FAKE_SSH), ("pct", FAKE_PCT_EXEC)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("FAKE_SSH_STATE", str(state))
    conn = make(pct_executable=str(bin_dir / "pct"), ssh_executable=str(bin_dir / "ssh"), reconnection_retries=3,
                keep_env=True, ssh_args="", control_path_dir=str(tmp_path / "cp"))
    module = __import__(type(conn).__module__, fromlist=["CHUNK"])
    monkeypatch.setattr(module, "CHUNK", 4096)  # several pieces
    return conn, state / "count"


@pytest.mark.parametrize("auth", ["key", "password"])
@pytest.mark.parametrize("size", [4096 * 5 + 123, 4096 * 5, 0], ids=["pieces", "exact-pieces", "empty"])
def test_put_and_fetch_survive_dropped_connections(flaky_hop, tmp_path, monkeypatch, auth, size):
    conn, count = flaky_hop
    if auth == "password":
        # Both go through the ssh connection's exec_command (which feeds sshpass/askpass); the fake ssh asks none.
        monkeypatch.setattr(type(conn), "_uses_password", lambda self: True)
    payload = os.urandom(size)
    src = tmp_path / "src.bin"
    src.write_bytes(payload)
    remote = tmp_path / "remote" / "copy.bin"
    remote.parent.mkdir()
    remote.write_bytes(b"an older, longer file" * 2000)  # replaced, never merged
    conn.put_file(str(src), str(remote))
    assert remote.read_bytes() == payload
    # Every connection's first try dropped and was retried: one piece per 4096 bytes (at least one), whatever the auth.
    pieces = max(1, -(-size // 4096))
    assert int(count.read_text()) == 2 * pieces
    back = tmp_path / "back.bin"
    conn.fetch_file(str(remote), str(back))
    assert back.read_bytes() == payload


def test_a_missing_remote_file_is_reported_and_no_partial_copy_is_left(flaky_hop, tmp_path):
    from ansible.errors import AnsibleFileNotFound

    conn, _count = flaky_hop
    out = tmp_path / "out.bin"
    with pytest.raises(AnsibleFileNotFound, match="No such file"):
        conn.fetch_file(str(tmp_path / "nowhere.bin"), str(out))
    assert not out.exists()


# -- a hypervisor that is not reached is named with ssh's reason ---------------------------------------------------

ANSWERING_SSH = """#!/bin/sh
# A stand-in for ssh: records its arguments, then answers as FAKE_SSH_ANSWER says (refused, or reached).
printf '%s\\n' "$@" > "$FAKE_SSH_STATE/argv"
if [ "$FAKE_SSH_ANSWER" = refused ]; then
  echo "ssh: connect to host pve1.example.org port 22: Connection refused" >&2
  exit 255
fi
exit 0
"""
SILENT = 'Data could not be sent to remote host "pve1.example.org". Make sure this host can be reached over ssh: '


# Whatever ansible-core's message says (it is never read): ssh's reason, or none at all.
WITH_REASON = SILENT + "ssh: connect to host pve1.example.org port 22: No route to host"


@pytest.mark.parametrize(
    ("answer", "says"),
    [("refused", "a new connection says: ssh: connect to host pve1.example.org port 22: Connection refused"),
     ("reached", "a new connection reaches the hypervisor: the connection broke during the task")],
)  # fmt: skip
@pytest.mark.parametrize("message", [SILENT, WITH_REASON], ids=["no-reason", "reason"])
def test_an_unreachable_hypervisor_is_asked_again_without_the_shared_master(tmp_path, monkeypatch, answer, says,
                                                                             message):  # fmt: skip
    ssh = tmp_path / "ssh"
    ssh.write_text(ANSWERING_SSH)
    ssh.chmod(0o755)
    monkeypatch.setenv("FAKE_SSH_STATE", str(tmp_path))
    monkeypatch.setenv("FAKE_SSH_ANSWER", answer)
    conn = make(node="pve1", ssh_executable=str(ssh), control_path_dir=str(tmp_path / "cp"), port=2222,
                ssh_common_args="-o ProxyJump=jump.example.org", private_key_file="~/.ssh/lab key")  # fmt: skip
    conn.host = "pve1.example.org"
    text = conn._unreachable(AnsibleConnectionFailure(message))
    assert text.startswith("Cannot reach the hypervisor of CT 129 on node pve1 (hypervisor pve1.example.org:2222")
    assert message.strip() in text and text.endswith(f"({says})" if answer == "refused" else ")"), text
    assert says in text, text
    argv = (tmp_path / "argv").read_text().splitlines()
    # Its own connection (the master may be what died) first, no prompt, the play's options as ssh options, host key
    # checking left to ssh's configuration (no StrictHostKeyChecking=no while host_key_checking is on).
    assert argv[:4] == ["-o", "ControlPath=none", "-o", "BatchMode=yes"] and argv[-2:] == ["pve1.example.org", "true"]
    for option in ("ProxyJump=jump.example.org", "Port=2222", "User=root",
                   f"IdentityFile={os.path.expanduser('~/.ssh/lab key')}"):  # fmt: skip
        assert option in argv, argv
    assert "StrictHostKeyChecking=no" not in argv


def test_the_new_connection_keeps_host_key_checking_as_configured(tmp_path):
    conn = make(host_key_checking=False)
    conn.host = "pve1.example.org"
    assert "StrictHostKeyChecking=no" in conn.ask_argv()


@pytest.mark.parametrize(
    ("answer", "status", "gone"),
    [((1, b"", b""), "stopped", True),  # the container stopped under the command: the host is gone
     ((1, b"", b""), "running", False),  # no output, but the container runs: the command's own failure
     ((1, b'{"failed": true}', b""), "stopped", False)],  # an answer is an answer: no question asked
    ids=["stopped", "running", "answered"],
)  # fmt: skip
def test_a_container_that_stops_under_a_command_is_unreachable_not_a_module_failure(monkeypatch, answer, status, gone):
    asked: list[str] = []

    def ssh_exec(self, cmd, in_data=None, sudoable=True):
        asked.append(cmd)
        return answer if " exec " in f" {cmd} " else (0, f"status: {status}\n".encode(), b"")

    conn = make(node="pve1")
    # The ssh plugin's exec_command, which the pct connection extends (nothing reaches ssh).
    monkeypatch.setattr(type(conn).__mro__[1], "exec_command", ssh_exec)
    if gone:
        with pytest.raises(AnsibleConnectionFailure, match=r"CT 129 on node pve1 \(hypervisor pve1.example.org\) "
                           r"stopped during the task \(status: stopped\): start it with 'pct start 129'"):
            conn.exec_command("python3 module")
    else:
        assert conn.exec_command("python3 module") == answer
    assert len(asked) == (1 if answer[1] else 2), asked
    assert asked[-1] == ("pct status 129" if not answer[1] else asked[0])
