"""The lab used as a user would: pct through the ssh hop, push/pull, states, GPUs under a workload."""

from __future__ import annotations

import os
import pwd
import subprocess
import time

import pytest

from tests.conftest import LAB_ROOT, PCT, hop, lab_workload, pct, recap, run_playbook, smi, stop_marked

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]

HOSTILE = [
    "plain",
    "it's \"quoted\" 'twice'",
    "$(touch /tmp/pwned) `touch /tmp/pwned2` ${HOME} $$",
    "semi; colon && and || or | pipe > redirect < in & bg",
    "new\nline\n\ttab and  two  spaces ",
    "unicode: é ü 日本語 🚀",
    "glob * ? [a-z] ~ # not a comment",
    "backslash \\ \\\\ \\n end\\",
    "-n",
    "",
]


def test_second_up_changes_nothing(lab):
    """Another up changes nothing (the tests before this one stopped containers, restarted hops and put host keys
    back, so it may run the build and find it so); the run right after it, with the lab as that complete build left
    it, is one fingerprint check (eagle3.ops.stage_stamp) and the build is skipped as a whole."""
    proc = run_playbook("lab.yml")
    counts = recap(proc.stdout)["lab-host"]
    assert counts["changed"] == 0, proc.stdout[-4000:]
    assert counts["failed"] == 0
    again = run_playbook("lab.yml")
    assert recap(again.stdout)["lab-host"]["changed"] == 0
    assert "lab on lab-host: nothing to do" in " ".join(again.stdout.split()), again.stdout[-4000:]


def test_a_lab_whose_api_died_is_built_again_and_then_converged(lab):
    """The fingerprint's probes: the lab's Proxmox API killed, the next lab.yml names it, runs the build (which starts
    the API again) and keeps the fingerprint; the run after it has nothing to do."""
    pidfile = str(LAB_ROOT / "pveapi" / "pveapi.pid")
    subprocess.run(["pkill", "--pidfile", pidfile, "--full", "pveapi.py"], check=True)
    deadline = time.monotonic() + 10
    while subprocess.run(["pgrep", "--pidfile", pidfile, "--full", "pveapi.py"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "the API did not stop"
        time.sleep(0.1)
    proc = run_playbook("lab.yml")
    text = " ".join(proc.stdout.split())
    assert "lab on lab-host: runs (the lab Proxmox API runs does not hold (pgrep exited 1))" in text, text[-4000:]
    assert recap(proc.stdout)["lab-host"]["changed"] >= 1
    assert subprocess.run(["pgrep", "--pidfile", pidfile, "--full", "pveapi.py"], capture_output=True).returncode == 0
    again = run_playbook("lab.yml")
    assert "lab on lab-host: nothing to do" in " ".join(again.stdout.split()), again.stdout[-4000:]


def test_pct_list_over_the_hop_shows_the_containers(lab):
    # A bare `pct` over the hop is this lab's own (its sshd puts the lab's pct first on PATH).
    assert hop("command", "-v", "pct").stdout.decode().strip() == PCT
    proc = hop("pct", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[0].split() == ["VMID", "Status", "Lock", "Name"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["129"] == ["running", "trainer"]
    assert rows["130"] == ["running", "server"]


def test_a_command_over_the_hop_runs_in_the_nodes_environment_not_the_lab_hosts_shell_startup(lab):
    # sshd starts `bash -c` for each command, and bash would read the lab host root's ~/.bashrc first (on this
    # machine a pyenv init that puts its shims before everything on PATH). The hop's sshd sets the shell level so
    # that it does not: the PATH a task sees is exactly the node's.
    node_path = f"{os.path.dirname(PCT)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    proc = hop('printf "%s\\n%s" "$PATH" "$SHLVL"')
    assert proc.returncode == 0, proc.stderr
    path, level = proc.stdout.decode().splitlines()
    assert path == node_path
    if pwd.getpwuid(0).pw_shell.endswith("/bash"):
        assert level == "2"  # bash counted the level the hop set, which is what keeps it from reading ~/.bashrc


def test_nvidia_smi_over_the_hop_prints_four_rows(lab):
    proc = hop(
        PCT, "exec", "129", "--", "nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split(", ") for line in proc.stdout.decode().splitlines()]
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    assert all(0 < int(r[1]) < 100 for r in rows)


@pytest.mark.parametrize("text", HOSTILE)
def test_exec_delivers_hostile_arguments_byte_exact(lab, text):
    # Through ssh the remote shell parses the line once, so every argv element is quoted for it.
    import shlex

    remote = shlex.join([PCT, "exec", "129", "--keep-env", "0", "--", "printf", "%s", text])
    proc = hop(remote)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == text.encode()
    assert hop(PCT, "exec", "129", "--", "ls", "/tmp/pwned").returncode != 0


def test_exec_keep_env_controls_the_environment(lab):
    kept = hop("LEAKED=yes", PCT, "exec", "129", "--keep-env", "1", "--", "env").stdout.decode()
    clean = hop("LEAKED=yes", PCT, "exec", "129", "--keep-env", "0", "--", "env").stdout.decode()
    assert "LEAKED=yes" in kept
    assert "LEAKED=yes" not in clean
    assert "container=lxc" in clean


def test_commands_and_services_in_a_container_get_the_labs_environment(lab):
    # lab_host_container_environment's default: one OpenMP thread per process, whoever starts it - a command run
    # through pct exec (Ansible's tasks, lxc.environment) or a unit of the container's systemd (its DefaultEnvironment).
    # And Python's bytecode and vLLM's cache in the one tree on the build cache mount that every lab container shares.
    want = ["OMP_NUM_THREADS=1", "VLLM_CPU_OMP_THREADS_BIND=nobind", "PYTHONPYCACHEPREFIX=/srv/lab-cache/pycache",
            "VLLM_CACHE_ROOT=/srv/lab-cache/vllm"]
    clean = pct("exec", "129", "--keep-env", "0", "--", "env").stdout.splitlines()
    assert all(line in clean for line in want), clean
    units = pct("exec", "129", "--", "systemctl", "show-environment").stdout.splitlines()  # what every unit starts with
    assert all(line in units for line in want), units
    prefix = pct("exec", "129", "--keep-env", "0", "--", "python3", "-c", "import sys; print(sys.pycache_prefix)")
    assert prefix.stdout.strip() == "/srv/lab-cache/pycache"


def test_exec_returns_the_command_exit_code(lab):
    assert hop(PCT, "exec", "129", "--", "sh", "-c", "'exit 7'").returncode == 7


def test_push_pull_round_trip_with_perms_and_owner(lab, tmp_path):
    src = tmp_path / "payload with space.bin"
    data = os.urandom(3 * 1024 * 1024 + 17)
    src.write_bytes(data)
    dest = "/tmp/pushed file.bin"
    pct("push", "129", str(src), dest, "--perms", "640", "--user", "nobody", "--group", "nogroup")
    stat = pct("exec", "129", "--", "stat", "-c", "%a %U %G %s", dest).stdout.split()
    assert stat == ["640", "nobody", "nogroup", str(len(data))]
    back = tmp_path / "back.bin"
    pct("pull", "129", dest, str(back), "--perms", "0600", "--user", "0")
    assert back.read_bytes() == data
    assert oct(back.stat().st_mode & 0o777) == "0o600"
    # Empty files and hex modes.
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    pct("push", "129", str(empty), "/tmp/empty", "--perms", "0x1a4")
    assert pct("exec", "129", "--", "stat", "-c", "%a %s", "/tmp/empty").stdout.split() == ["644", "0"]


def test_push_never_writes_through_a_container_symlink_onto_the_host(lab, tmp_path):
    victim = tmp_path / "host-victim"
    victim.write_text("host data")
    # A symlink inside the container pointing at the same absolute path as a host file.
    pct("exec", "129", "--", "mkdir", "-p", str(tmp_path))
    pct("exec", "129", "--", "ln", "-sfn", str(victim), "/tmp/evil-link")
    src = tmp_path / "src"
    src.write_text("container data")
    pct("push", "129", str(src), "/tmp/evil-link")
    assert victim.read_text() == "host data"
    assert pct("exec", "129", "--", "cat", str(victim)).stdout == "container data"


def test_push_rejects_bad_owner_and_mode(lab, tmp_path):
    src = tmp_path / "f"
    src.write_text("x")
    proc = pct("push", "129", str(src), "/tmp/f", "--user", "no-such-user", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, "failed to get uid for: no-such-user")
    proc = pct("push", "129", str(src), "/tmp/f", "--perms", "9z", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, "invalid mode: '09z'")


def test_unknown_vmid_fails_like_proxmox(lab):
    for args in (["status", "999"], ["exec", "999", "--", "true"], ["config", "999"], ["start", "999"]):
        proc = pct(*args, check=False)
        assert proc.returncode == 255
        assert proc.stderr.strip() == "Configuration file 'nodes/pve-lab/lxc/999.conf' does not exist"


def test_invalid_vmid_and_unknown_options(lab):
    proc = pct("status", "12", check=False)
    assert proc.returncode == 255
    assert "vmid: invalid format - value does not look like a valid VM ID" in proc.stderr
    proc = pct("set", "129", "--bogus", "1", check=False)
    assert proc.returncode == 255
    assert "bogus: property is not defined in schema" in proc.stderr
    proc = pct("frobnicate", check=False)
    assert proc.returncode == 255
    assert "ERROR: unknown command 'pct frobnicate'" in proc.stderr


@pytest.fixture
def scratch_ct(lab):
    vmid = "191"
    pct("destroy", vmid, "--force", "1", check=False)
    pct("create", vmid, "local:vztmpl/debian-12-eagle3lab-v2_amd64.tar", "--hostname", "scratch", "--memory", "1024")
    yield vmid
    pct("destroy", vmid, "--force", "1", check=False)


def test_status_transitions_and_stopped_errors(scratch_ct, tmp_path):
    vmid = scratch_ct
    assert pct("status", vmid).stdout.strip() == "status: stopped"
    proc = pct("create", vmid, "local:vztmpl/debian-12-eagle3lab-v2_amd64.tar", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, f"CT {vmid} already exists on node 'pve-lab'")

    proc = pct("exec", vmid, "--", "true", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, f"container '{vmid}' not running!")
    src = tmp_path / "f"
    src.write_text("x")
    proc = pct("push", vmid, str(src), "/tmp/f", check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, "can only push files to a running CT")
    proc = pct("pull", vmid, "/etc/hostname", str(tmp_path / "h"), check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, "can only pull files from a running VM")
    proc = pct("stop", vmid, check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, f"CT {vmid} not running")

    pct("start", vmid)
    assert pct("status", vmid).stdout.strip() == "status: running"
    assert pct("exec", vmid, "--", "hostname").stdout.strip() == "scratch"
    proc = pct("start", vmid, check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, f"CT {vmid} already running")
    proc = pct("destroy", vmid, check=False)
    assert (proc.returncode, proc.stderr.strip()) == (255, f"unable to destroy CT {vmid} - container is running")

    pct("shutdown", vmid, "--timeout", "20", "--forceStop", "1")
    assert pct("status", vmid).stdout.strip() == "status: stopped"

    pct("set", vmid, "--memory", "2048", "--description", "line one\nline two")
    config = pct("config", vmid).stdout
    assert "memory: 2048\n" in config
    assert "description: line one%0Aline two\n" in config
    pct("set", vmid, "--delete", "description")
    assert "description" not in pct("config", vmid).stdout


def test_gpu_memory_follows_a_workload(lab, job_marker):
    before = smi(129, "index,memory.used,utilization.gpu,power.draw")
    assert all(int(r[1]) < 100 and r[2] == "0" for r in before)
    pids = lab_workload(129, job_marker, "--gpus", "0-3", "--mib", "30000", "--bystander")
    try:
        during = smi(129, "index,memory.used,utilization.gpu,power.draw")
        assert all(int(r[1]) >= 30000 for r in during), during
        assert all(int(r[2]) > 50 and float(r[3]) > float(b[3]) for r, b in zip(during, before, strict=True))
        apps = pct(
            "exec",
            "129",
            "--",
            "nvidia-smi",
            "--query-compute-apps=gpu_uuid,pid,used_memory",
            "--format=csv,noheader,nounits",
        ).stdout.splitlines()
        assert len(apps) == 4 and all(a.endswith(", 30000") for a in apps)
        # torchrun's picture: each worker in its own session, DataLoader children inheriting the GPU.
        ps = pct("exec", "129", "--", "ps", "-ww", "-eo", "pid=,sid=,args=").stdout
        workers = [line.split(None, 2) for line in ps.splitlines() if "--role worker" in line]
        assert len({w[1] for w in workers}) == 4 and len(workers) == 4 * 3
        # Terminating only the agent leaves the DataLoader orphans holding the memory.
        pct("exec", "129", "--", "kill", str(pids["agent"]))
        time.sleep(2)
        assert all(int(r[1]) >= 30000 for r in smi(129))
    finally:
        # Everything of this job but the bystander, which must still be alive afterwards.
        stop_marked(129, job_marker, pids["bystander"])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(int(r[1]) >= 100 for r in smi(129)):
        time.sleep(0.2)
    assert all(int(r[1]) < 100 for r in smi(129))
    # The bystander holds no GPU and is still alive.
    assert pct("exec", "129", "--", "kill", "-0", str(pids["bystander"]), check=False).returncode == 0
    pct("exec", "129", "--", "kill", str(pids["bystander"]))


def test_nvidia_smi_rejects_unknown_fields(lab):
    proc = pct("exec", "129", "--", "nvidia-smi", "--query-gpu=index,bogus", "--format=csv", check=False)
    assert proc.returncode == 2
    assert 'Field "bogus" is not a valid field to query.' in proc.stdout


def test_lab_up_rejects_a_taken_port(lab, tmp_path):
    # A listener the test owns on a free port; the lab's sshd is not running there.
    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    try:
        # A separate lab root and state dir: the running lab's sshd and keys stay untouched.
        proc = run_playbook(
            "lab.yml",
            "-e",
            f"lab_ssh_port={port}",
            "--tags",
            "lab_host_preflight,lab_host_sshd",
            "-e",
            f"lab_host_root={tmp_path}/root",
            "-e",
            f"eagle3_lab_state_dir={tmp_path}/state",
            check=False,
        )
    finally:
        sock.close()
    assert proc.returncode != 0
    assert f"Port {port} on 127.0.0.1 is already taken by another program" in proc.stdout


def test_lab_rejects_duplicate_vmids(lab, tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    lab_hosts:\n      hosts:\n        lab-host:\n          ansible_connection: local\n"
        "          ansible_python_interpreter: '{{ ansible_playbook_python }}'\n"
        "    containers:\n      hosts:\n        a: {pct_vmid: 150}\n        b: {pct_vmid: 150}\n"
    )
    proc = run_playbook("lab.yml", "-i", str(inv), "-e", "eagle3_lab_state_dir=/tmp/unused", check=False)
    assert proc.returncode != 0
    assert "a, b all name VMID 150: a VMID is one container in a Proxmox cluster" in " ".join(proc.stdout.split())


def test_lab_up_without_root_is_refused(lab, tmp_path):
    # The lab play's tasks run as an unprivileged user (become via su), as when a user without root runs it.
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    lab_hosts:\n      hosts:\n        lab-host:\n"
        "          ansible_connection: local\n          ansible_python_interpreter: /usr/bin/python3\n"
        "          ansible_become: true\n          ansible_become_method: su\n"
        "          ansible_become_user: nobody\n          ansible_become_flags: '-s /bin/sh'\n"
    )
    proc = run_playbook("lab.yml", "-i", str(inv), "--tags", "lab_host_preflight", check=False)
    assert proc.returncode != 0
    assert "The lab needs root on this machine" in proc.stdout, proc.stdout[-3000:]


def test_a_wheel_that_cannot_be_downloaded_is_named_and_nothing_is_stamped(tmp_path):
    # The download runs in the background while the template builds; its failure still stops the run, in one
    # sentence naming pip's reason and where the pins come from, and leaves no stamp that a rerun would trust.
    wheelhouse = tmp_path / "wheelhouse"
    proc = run_playbook("lab.yml", "--tags", "lab_host_wheelhouse", "-e",
                        f'{{"lab_host_wheelhouse": "{wheelhouse}", "lab_host_share": "{tmp_path / "share"}", '
                        '"lab_host_wheelhouse_requirements": [], '
                        '"lab_host_wheelhouse_packages": ["eagle3-ops-no-such-package==9.9"]}',
                        check=False)  # fmt: skip
    assert proc.returncode != 0
    text = " ".join(proc.stdout.split())
    assert (f"Downloading the containers' wheels into {wheelhouse} failed (ERROR: No matching distribution found for "
            "eagle3-ops-no-such-package==9.9): check this host's package index") in text, proc.stdout[-3000:]
    assert not (wheelhouse / ".stamp").exists()
