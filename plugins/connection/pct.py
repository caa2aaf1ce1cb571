# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run Ansible inside Proxmox LXC containers through their hypervisor: ssh + ``pct exec``."""

from __future__ import annotations

DOCUMENTATION = r"""
name: pct
short_description: Run tasks inside a Proxmox LXC container through its hypervisor (ssh + pct exec)
description:
  - Connects with OpenSSH to the Proxmox node that hosts the container and runs every command with
    C(pct exec VMID -- /bin/sh -c CMD). The container needs neither network nor sshd of its own.
  - Built on ansible-core's C(ssh) connection, so ControlPersist, ssh_args, ProxyJump, C(~/.ssh/config),
    host key checking and pipelining all work as they do for plain ssh. The ssh target is the
    hypervisor, so C(ansible_host), C(ansible_port) and C(ansible_user) (or the C(pct_hypervisor_*)
    variables) name the node's address, port and user.
  - Files travel in pieces of at most 8 MiB through the ssh connection's own C(exec_command) (its retries, its password
    handling) and are written by a process inside the container, so a symlink in the container can never redirect a
    write onto the hypervisor; memory use is constant whatever the file size.
  - Uses only the public API of ansible-core's ssh connection (its options and C(exec_command)).
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
extends_documentation_fragment:
  # every option of ansible-core's ssh connection, pipelining included (with its [ssh_connection] ini key)
  - eagle3.ops.pct_ssh
options:
  vmid:
    description:
      - Numeric ID of the container on its hypervisor.
      - C(proxmox_vmid) is accepted for inventories written for community.proxmox.proxmox_pct_remote.
    type: int
    required: true
    vars:
      - name: proxmox_vmid
      - name: pct_vmid
      - name: ansible_pct_vmid
    env:
      - name: ANSIBLE_PCT_VMID
  node:
    description:
      - Name of the Proxmox node, used in messages only. Defaults to the hypervisor address.
    type: str
    vars:
      - name: pct_node
      - name: proxmox_node
  pct_executable:
    description: Path or name of C(pct) on the hypervisor.
    type: str
    default: pct
    vars:
      - name: ansible_pct_executable
    env:
      - name: ANSIBLE_PCT_EXECUTABLE
    ini:
      - section: pct_connection
        key: pct_executable
  keep_env:
    description:
      - Pass C(--keep-env 1) so the hypervisor ssh session's environment leaks into the container.
      - Off by default (C(--keep-env 0)), so tasks see the same environment whoever runs them.
    type: bool
    default: false
    vars:
      - name: ansible_pct_keep_env
    env:
      - name: ANSIBLE_PCT_KEEP_ENV
    ini:
      - section: pct_connection
        key: keep_env
  hypervisor_sudo:
    description:
      - How to reach C(pct), which runs only as root, on the hypervisor.
      - V(auto) prefixes C(sudo -n) when the hypervisor user is not root; V(always) and V(never) force it.
      - C(sudo -n) never prompts; a hypervisor that wants a password fails with a message naming the fix.
    type: str
    default: auto
    choices: [auto, always, never]
    vars:
      - name: ansible_pct_hypervisor_sudo
    env:
      - name: ANSIBLE_PCT_HYPERVISOR_SUDO
    ini:
      - section: pct_connection
        key: hypervisor_sudo
notes:
  - The hypervisor user's login shell parses the command line, so it must be POSIX (sh, bash, dash, zsh).
  - C(meta reset_connection) stops the ControlPersist master of the hypervisor, which every container
    of that hypervisor shares.
  - A hypervisor that is not reached is named with its container and node, and ssh is asked once more over a new
    connection of its own (the shared master may be what died), with the same options, host key checking as
    configured and no prompt; what it says ends the message. This costs one more connection on the failure path only.
"""

EXAMPLES = r"""
# inventory/fleet/hosts.yml
all:
  children:
    trainers:
      vars:
        ansible_connection: pct
        ansible_user: root
        ansible_python_interpreter: /usr/bin/python3
      hosts:
        trainer-129:
          ansible_host: pve1.example.org   # the hypervisor
          pct_vmid: 129
        trainer-231:
          ansible_host: pve2.example.org
          pct_vmid: 231
          pct_hypervisor_user: ansible      # non-root: pct is run with sudo -n
"""

import os
import re
import shlex
import subprocess
import typing as t

from ansible.errors import AnsibleConnectionFailure, AnsibleError, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection.ssh import Connection as SSHConnection
from ansible.utils.display import Display

display = Display()

# Bytes per piece of a file transfer: each piece is one exec_command of the ssh connection (its retries, its password
# handling), so memory stays bounded whatever the file's size.
CHUNK = 8 << 20
_PCT_MISSING = re.compile(rb"(^|\s|:)\S*pct: (command )?not found|pct: No such file or directory")


class Connection(SSHConnection):
    """ssh to the hypervisor, then ``pct exec`` into the container."""

    transport = "pct"
    has_pipelining = True

    # -- command construction -----------------------------------------------------------------

    def _vmid(self) -> str:
        vmid = self.get_option("vmid")
        if vmid is None or not 100 <= int(vmid) <= 999_999_999:
            raise AnsibleError(
                f"pct connection for {self._play_context.remote_addr}: set pct_vmid to the container's "
                f"numeric ID (100-999999999), not {vmid!r}."
            )
        return str(int(vmid))

    def _node(self) -> str:
        return self.get_option("node") or str(self.get_option("host"))

    def _pct_prefix(self) -> list[str]:
        sudo = self.get_option("hypervisor_sudo")
        user = self.get_option("remote_user") or self._play_context.remote_user
        use_sudo = sudo == "always" or (sudo == "auto" and user not in (None, "root"))
        return (["sudo", "-n", "--"] if use_sudo else []) + [self.get_option("pct_executable")]

    def build_pct_command(self, argv: list[str]) -> str:
        """The hypervisor-side command line running ``argv`` in the container, quoted for a POSIX shell."""
        keep_env = "1" if self.get_option("keep_env") else "0"
        inner = list(argv)
        if not self.get_option("keep_env"):
            # --keep-env 0 gives the command lxc-attach's minimal environment (PATH and container=lxc);
            # HOME is what Ansible's ~/.ansible/tmp and most tools need on top of it.
            inner = ["/usr/bin/env", "HOME=/root", "LOGNAME=root", "USER=root", *inner]
        return shlex.join([*self._pct_prefix(), "exec", self._vmid(), "--keep-env", keep_env, "--", *inner])

    def _where(self) -> str:
        port = self.get_option("port")
        address = f"{self.host}:{port}" if port else str(self.host)
        return f"CT {self.get_option('vmid')} on node {self._node()} (hypervisor {address})"

    # -- failure translation --------------------------------------------------------------------

    def _explain(self, rc: int, stderr: bytes) -> str | None:
        """A one-sentence explanation when the failure came from pct/sudo rather than the command (their own words on
        the hypervisor, which Proxmox's pct and sudo print)."""
        vmid = self.get_option("vmid")
        text = to_text(stderr, errors="surrogate_or_replace")
        if "does not exist" in text and f"lxc/{vmid}.conf" in text:
            return (
                f"{self._where()} does not exist: check pct_vmid, or point ansible_host at the node "
                f"that hosts the container."
            )
        if f"'{vmid}' not running" in text or "not running!" in text:
            return f"{self._where()} is not running: start it with 'pct start {vmid}' on the hypervisor."
        if _PCT_MISSING.search(stderr) or (rc == 127 and b"pct" in stderr):
            return (
                f"pct was not found on the hypervisor of {self._where()}: is it a Proxmox node? Set "
                f"ansible_pct_executable to pct's path."
            )
        if "a password is required" in text or "a terminal is required" in text:
            return (
                f"sudo on the hypervisor of {self._where()} wants a password for "
                f"{self.get_option('remote_user')}: allow NOPASSWD for pct or connect as root."
            )
        if "only root can run this command" in text or (
            "Permission denied" in text and "pct" in text and "sudo" not in text
        ):
            return (
                f"pct on the hypervisor of {self._where()} needs root: connect as root or set "
                f"ansible_pct_hypervisor_sudo=always."
            )
        return None

    def _unreachable(self, exc: Exception) -> str:
        """The sentence for a hypervisor command whose connection failed: pct's or sudo's own failure explained, else
        the hypervisor named as not reached, with what a new connection of its own says."""
        explained = self._explain(255, to_bytes(str(exc)))
        if explained:
            return explained
        return f"Cannot reach the hypervisor of {self._where()}: {str(exc).rstrip()} {self._ask_ssh()}"

    def ask_argv(self) -> list[str]:
        """ssh's command line for one new connection of its own to the hypervisor, from the ssh connection's documented
        options: no shared master (ControlPath=none, first, as ssh takes an option's first value), no prompt, host key
        checking, port, user, key, timeout and the user's ssh arguments as configured."""
        argv = [str(self.get_option("ssh_executable") or "ssh"), "-o", "ControlPath=none", "-o", "BatchMode=yes"]
        for name in ("ssh_args", "ssh_common_args", "ssh_extra_args"):
            argv += shlex.split(str(self.get_option(name) or ""))
        if self.get_option("host_key_checking") is False:
            argv += ["-o", "StrictHostKeyChecking=no"]
        for option, name in (("Port", "port"), ("User", "remote_user"), ("IdentityFile", "private_key_file"),
                             ("ConnectTimeout", "timeout")):  # fmt: skip
            value = self.get_option(name)
            if value not in (None, ""):
                argv += ["-o", f"{option}={os.path.expanduser(str(value)) if name == 'private_key_file' else value}"]
        return [*argv, str(self.host), "true"]

    def _ask_ssh(self) -> str:
        """Why ssh cannot reach the hypervisor, from one new connection of its own (not the shared master, which may be
        what died), with the play's options and no prompt."""
        if self._uses_password():
            return "(a new connection is not tried with a password: run the play with -vvv to see ssh's own messages)"
        try:
            proc = subprocess.run(self.ask_argv(), stdin=subprocess.DEVNULL, capture_output=True, check=False,
                                  timeout=int(self.get_option("timeout") or 10) + 20)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"(a new connection got no answer either: {exc})"
        if proc.returncode == 0:
            return ("(a new connection reaches the hypervisor: the connection broke during the task, e.g. the node's "
                    "sshd or network went away and came back)")  # fmt: skip
        lines = [line.strip() for line in to_text(proc.stderr, errors="surrogate_or_replace").splitlines()]
        said = [line for line in lines if line] or [f"ssh exited {proc.returncode}"]
        return f"(a new connection says: {said[-1]})"

    def _hop(self, remote: str, in_data: bytes | None, sudoable: bool = False) -> tuple[int, bytes, bytes]:
        """One hypervisor command through the ssh connection's public exec_command (its retries and password
        handling); a connection failure left after the retries is the hypervisor not reached, in one sentence."""
        try:
            return super().exec_command(remote, in_data=in_data, sudoable=sudoable)
        except AnsibleConnectionFailure as exc:
            raise AnsibleConnectionFailure(self._unreachable(exc)) from None

    def _run_checked(self, remote: str, in_data: bytes | None, sudoable: bool) -> tuple[int, bytes, bytes]:
        rc, out, err = self._hop(remote, in_data, sudoable)
        if rc != 0:
            explained = self._explain(rc, err)
            if explained:
                raise AnsibleConnectionFailure(explained)
            if not out.strip():
                # No answer at all (a module prints its result): the container may have stopped under the command (a
                # `pct stop`, a crash, its node going down) - then the host is gone, not the command failed. One
                # question to the hypervisor, on this failure path only.
                self._raise_if_stopped()
        return rc, out, err

    def _raise_if_stopped(self) -> None:
        """Raise the container as unreachable when the hypervisor says it is not running (a hypervisor that cannot be
        reached now is unreachable too)."""
        rc, out, _err = self._hop(shlex.join([*self._pct_prefix(), "status", self._vmid()]), None)
        said = to_text(out, errors="surrogate_or_replace").strip()
        if rc == 0 and said.startswith("status:") and said.split(":", 1)[1].strip() != "running":
            raise AnsibleConnectionFailure(
                f"{self._where()} stopped during the task ({said}): start it with 'pct start {self._vmid()}' on the "
                "hypervisor, then rerun."
            )

    # -- the connection API ---------------------------------------------------------------------

    def exec_command(self, cmd: str, in_data: bytes | None = None, sudoable: bool = True) -> tuple[int, bytes, bytes]:
        self.host = self.get_option("host") or self._play_context.remote_addr
        remote = self.build_pct_command(["/bin/sh", "-c", cmd])
        display.vvv(f"PCT EXEC {remote}", host=self.host)
        return self._run_checked(remote, in_data, sudoable)

    def _uses_password(self) -> bool:
        return bool(self.get_option("password") or self._play_context.password)

    def _transfer(self, argv: list[str], in_data: bytes | None, what: str, path: str) -> bytes:
        """One piece of a transfer: a command in the container, through the ssh connection's exec_command."""
        self.host = self.get_option("host") or self._play_context.remote_addr
        rc, out, err = self._hop(self.build_pct_command(argv), in_data)
        if rc != 0:
            self._transfer_failed(rc, err, what, path)
        return out

    def _transfer_failed(self, rc: int, stderr: bytes, what: str, path: str) -> t.NoReturn:
        explained = self._explain(rc, stderr)
        if explained:
            raise AnsibleConnectionFailure(explained)
        if b"No such file" in stderr or b"cannot open" in stderr or b"Not a directory" in stderr:
            raise AnsibleFileNotFound(f"{what} {path} in {self._where()}: {to_text(stderr).strip()}")
        raise AnsibleError(f"{what} {path} in {self._where()} failed (rc={rc}): {to_text(stderr).strip()}")

    def put_file(self, in_path: str, out_path: str) -> None:  # type: ignore[override]
        """Send a local file into the container; the writer runs inside it, so paths resolve there.

        The file goes in CHUNK-sized pieces, each one exec_command of the ssh connection naming its offset, so a piece
        retried after a dropped connection writes the same bytes again, and memory stays bounded.
        """
        super(SSHConnection, self).put_file(in_path, out_path)
        b_in = to_bytes(in_path, errors="surrogate_or_strict")
        if not os.path.exists(b_in):
            raise AnsibleFileNotFound(f"file or module does not exist: {in_path}")
        display.vvv(f"PCT PUT {in_path} TO {out_path}", host=self.host)
        with open(b_in, "rb") as src:
            offset = 0
            while True:
                piece = src.read(CHUNK)
                if not piece:
                    if offset == 0:  # an empty file: create it without reading stdin (ssh sends no EOF for b"")
                        self._transfer(["/bin/sh", "-c", ': > "$1"', "sh", out_path], None, "Writing", out_path)
                    break
                argv = ["/bin/sh", "-c", 'exec cat > "$1"', "sh", out_path] if offset == 0 else [
                    "/bin/sh", "-c", 'exec dd of="$1" bs=1M seek="$2" oflag=seek_bytes conv=notrunc status=none',
                    "sh", out_path, str(offset)]  # fmt: skip
                self._transfer(argv, piece, "Writing", out_path)
                offset += len(piece)

    def fetch_file(self, in_path: str, out_path: str) -> None:  # type: ignore[override]
        """Fetch a file out of the container to a local path, in CHUNK-sized pieces; nothing is left on failure."""
        super(SSHConnection, self).fetch_file(in_path, out_path)
        display.vvv(f"PCT FETCH {in_path} TO {out_path}", host=self.host)
        b_out = to_bytes(out_path, errors="surrogate_or_strict")
        try:
            with open(b_out, "wb") as dst:
                offset = 0
                while True:
                    argv = ["/bin/sh", "-c",
                            'exec dd if="$1" bs=1M skip="$2" count="$3" iflag=skip_bytes,count_bytes status=none',
                            "sh", in_path, str(offset), str(CHUNK)]  # fmt: skip
                    piece = self._transfer(argv, None, "Reading", in_path)
                    dst.write(piece)
                    offset += len(piece)
                    if len(piece) < CHUNK:
                        break
        except AnsibleError:
            if os.path.exists(b_out):
                os.unlink(b_out)
            raise

    def reset(self) -> None:
        self.host = self.get_option("host") or self._play_context.remote_addr
        super().reset()


__all__: t.Sequence[str] = ["Connection"]
