"""provision.yml and the proxmox_ct inventory plugin against the lab's Proxmox API."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import LAB_API_PORT, LAB_PORT, LAB_ROOT, LAB_STATE, ROOT, pct, pve_schema, recap, run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]
VMIDS = ("171", "172", "173")
TEMPLATE = "local:vztmpl/debian-12-eagle3lab-v2_amd64.tar"


def inventory(
    tmp_path: Path, hosts: dict[str, dict], name: str = "hosts", drop: tuple[str, ...] = (), *,
    state: Path = LAB_STATE, root: Path = LAB_ROOT, port: int = LAB_PORT, api_port: int = LAB_API_PORT, **group_vars
) -> Path:
    """An inventory of HOSTS on a lab (the one-node test lab's unless told: its state, root, hop and API ports)."""
    data = {
        "all": {
            "vars": {
                "lab_ssh_port": port,
                "eagle3_lab_state_dir": str(state),
                "ansible_ssh_private_key_file": str(state / "id_ed25519"),
                "ansible_ssh_common_args": (
                    f"-o UserKnownHostsFile={state / 'known_hosts'} -o StrictHostKeyChecking=yes"
                ),
                "proxmox_api_host": "127.0.0.1",
                "proxmox_api_port": api_port,
                "proxmox_api_user": "root@pam",
                "proxmox_api_token_id": "eagle3",
                "proxmox_api_token_secret": (state / "pve-token").read_text(),
                "proxmox_api_validate_certs": str(state / "pve-ca.pem"),
                "proxmox_ct_template": TEMPLATE,
                "proxmox_ct_conf_dir": str(root / "pve/nodes/pve-lab/lxc"),
                "proxmox_ct_gpu_device_dir": str(root / "dev"),
                "proxmox_ct_cores": 1,
                "proxmox_ct_memory": 1024,
                **group_vars,
            },
            "children": {
                "hypervisors": {
                    "hosts": {
                        "pve-lab": {
                            "ansible_host": "127.0.0.1",
                            "ansible_port": port,
                            "ansible_user": "root",
                            "proxmox_node": "pve-lab",
                            "ansible_python_interpreter": "/usr/bin/python3",
                        }
                    }
                },
                "containers": {
                    "vars": {
                        "ansible_connection": "eagle3.ops.pct",
                        "ansible_host": "127.0.0.1",
                        "ansible_port": port,
                        "ansible_user": "root",
                        "pct_node": "pve-lab",
                        "ansible_python_interpreter": "/usr/bin/python3",
                    },
                    "hosts": hosts,
                },
            },
        }
    }
    for key in drop:
        data["all"]["vars"].pop(key)
    path = tmp_path / f"{name}.yml"
    path.write_text(yaml.safe_dump(data))
    return path


TRAINER = {"pct_vmid": 171, "proxmox_ct_tags": ["trainer"], "proxmox_ct_gpus": [0, 1]}
SERVER = {"pct_vmid": 172, "proxmox_ct_tags": ["server"], "proxmox_ct_gpus": [2]}


@pytest.fixture(scope="module")
def fleet(lab, tmp_path_factory):
    for vmid in VMIDS:
        pct("destroy", vmid, "--force", "1", check=False)
    tmp = tmp_path_factory.mktemp("fleet")
    inv = inventory(tmp, {"trainer-171": TRAINER, "server-172": SERVER})
    first = run_playbook("provision.yml", "-i", str(inv))
    yield {"inv": inv, "first": first, "tmp": tmp}
    for vmid in VMIDS:
        pct("destroy", vmid, "--force", "1", check=False)


def test_provision_from_nothing_with_raw_gpu_lines(fleet):
    counts = recap(fleet["first"].stdout)
    assert counts["trainer-171"]["failed"] == 0 and counts["server-172"]["failed"] == 0
    assert "GPUs [0, 1] via raw lxc lines on pve-lab" in fleet["first"].stdout
    listing = pct("list").stdout
    assert re.search(r"^171\s+running\s+trainer-171", listing, re.M)
    assert re.search(r"^172\s+running\s+server-172", listing, re.M)
    config = pct("config", "171").stdout
    assert f"lxc.mount.entry: {LAB_ROOT}/dev/nvidia1 dev/nvidia1 none bind,optional,create=file" in config
    assert "lxc.cgroup2.devices.allow: c 195:* rwm" in config
    assert "tags: trainer" in config
    assert pct("exec", "171", "--", "test", "-c", "/dev/nvidia1").returncode == 0
    assert pct("exec", "172", "--", "test", "-e", "/dev/nvidia0", check=False).returncode != 0


def test_second_run_changes_nothing(fleet):
    again = run_playbook("provision.yml", "-i", str(fleet["inv"]))
    counts = recap(again.stdout)
    assert counts["trainer-171"]["changed"] == 0 and counts["server-172"]["changed"] == 0


def init_pid(vmid: str) -> str:
    return next(line for line in pct("status", vmid, "--verbose").stdout.splitlines() if line.startswith("pid:"))


def test_memory_change_is_applied_without_a_restart(fleet):
    before = init_pid("171")
    proc = run_playbook("provision.yml", "-i", str(fleet["inv"]), "-l", "trainer-171", "-e", "proxmox_ct_memory=2048")
    assert recap(proc.stdout)["trainer-171"]["changed"] >= 1
    assert "memory: 2048" in pct("config", "171").stdout
    assert init_pid("171") == before  # memory applies live: no restart


def test_gpu_passthrough_by_devn_with_a_root_password(fleet):
    password = (LAB_STATE / "pve-root-password").read_text()
    inv = inventory(
        fleet["tmp"],
        {"server-172": {**SERVER, "proxmox_ct_gpus": [3]}},
        name="password",
        drop=("proxmox_api_token_id", "proxmox_api_token_secret"),
        proxmox_api_password=password,
    )
    proc = run_playbook("provision.yml", "-i", str(inv), "-e", "proxmox_ct_restart=true")
    assert "GPUs [3] via devN entries (API)" in proc.stdout
    config = pct("config", "172").stdout
    assert f"dev0: {LAB_ROOT}/dev/nvidia3" in config
    assert "dev/nvidia2 " not in config  # the raw line for the old GPU is gone
    assert pct("exec", "172", "--", "test", "-c", "/dev/nvidia3").returncode == 0
    assert password not in proc.stdout


def test_devn_with_an_api_token_is_refused_clearly(fleet):
    proc = run_playbook(
        "provision.yml", "-i", str(fleet["inv"]), "-l", "server-172", "-e", "proxmox_ct_gpu_mode=dev", check=False
    )
    assert proc.returncode != 0
    assert "permission denied" in proc.stdout.lower() and "root@pam" in proc.stdout


@pytest.mark.parametrize(
    ("host", "extra", "needle"),
    [
        (
            {"pct_vmid": 173, "proxmox_ct_template": "local:vztmpl/nope.tar"},
            [],
            "task vzcreate for 173 failed: volume 'local:vztmpl/nope.tar' does not exist (log:",
        ),
        ({"pct_vmid": 173, "pct_node": "nope"}, [], "Node 'nope' is not in the cluster (nodes: pve-lab)"),
        ({"pct_vmid": 129}, [], "VMID 129 on pve-lab is 'trainer', not 'bad-host'"),
        ({"pct_vmid": 173, "proxmox_ct_memory": 8}, [], "memory: value must have a minimum value of 16"),
        ({"pct_vmid": 173}, ["-e", "proxmox_api_token_secret=wrong"], "401 authentication failure"),
    ],
)
def test_bad_input_gives_clear_errors(fleet, host, extra, needle):
    inv = inventory(fleet["tmp"], {"bad-host": host}, name="bad")
    proc = run_playbook("provision.yml", "-i", str(inv), *extra, check=False)
    assert proc.returncode != 0
    assert needle in re.sub(r"\s+", " ", proc.stdout), proc.stdout[-3000:]
    assert "wrong" not in proc.stdout or "401" in proc.stdout
    assert pct("status", "173", check=False).returncode == 255  # nothing half-made


def test_dynamic_inventory_reaches_the_containers(fleet, tmp_path):
    cfg = tmp_path / "lab.proxmox_ct.yml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "plugin": "eagle3.ops.proxmox_ct",
                "url": f"https://127.0.0.1:{LAB_API_PORT}",
                "user": "root@pam",
                "token_id": "eagle3",
                "token_secret": (LAB_STATE / "pve-token").read_text(),
                "validate_certs": str(LAB_STATE / "pve-ca.pem"),
                "tag_groups": {"trainer": "trainers", "server": "servers"},
                "hypervisor_port": LAB_PORT,
                "compose": {
                    "ansible_python_interpreter": "'/usr/bin/python3'",
                    "ansible_ssh_private_key_file": repr(str(LAB_STATE / "id_ed25519")),
                    "ansible_ssh_common_args": repr(f"-o UserKnownHostsFile={LAB_STATE / 'known_hosts'}"),
                },
            }
        )
    )
    listing = run_playbook_inventory(cfg)
    trainer = listing["_meta"]["hostvars"]["trainer-171"]

    def plain(value):  # API data is untrusted, so ansible-inventory wraps strings as unsafe
        return value["__ansible_unsafe"] if isinstance(value, dict) and "__ansible_unsafe" in value else value

    assert plain(trainer["ansible_host"]) == "127.0.0.1" and plain(trainer["ansible_connection"]) == "eagle3.ops.pct"
    assert trainer["proxmox_gpu_count"] == 2 and trainer["pct_vmid"] == 171
    assert "trainer-171" in listing["trainers"]["hosts"]
    proc = run_playbook("cleanup.yml", "-i", str(cfg), "-l", "trainers")
    assert "trainer-171: holders=0" in proc.stdout


def run_playbook_inventory(cfg: Path) -> dict:
    import subprocess
    import sys

    from tests.conftest import ansible_env

    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(cfg), "--list"],
        cwd=ROOT,
        env=ansible_env(),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out)


def test_every_api_request_matches_the_published_schema(fleet):
    schema = pve_schema()
    index: dict[str, dict] = {}

    def walk(nodes):
        for n in nodes:
            index[n["path"]] = n.get("info", {})
            walk(n.get("children") or [])

    walk(schema)
    log = (LAB_ROOT / "pve/api-requests.jsonl").read_text().splitlines()
    assert log, "the lab API logged no request"
    seen = set()
    for line in log:
        req = json.loads(line)
        info = index.get(req["path"])
        assert info is not None, f"{req['path']} is not a PVE API path"
        assert req["method"] in info, f"{req['method']} {req['path']} is not in the schema"
        props = info[req["method"]].get("parameters", {}).get("properties", {})
        for name, value in req["params"].items():
            key = name if name in props else re.sub(r"\d+$", "[n]", name)
            assert key in props, f"{req['method']} {req['path']}: parameter {name} is not in the schema"
            spec = props[key]
            if value == "<secret>":
                continue
            if spec.get("type") == "integer":
                assert re.fullmatch(r"-?\d+", str(value)), f"{name}={value!r} is not an integer"
            elif spec.get("type") == "boolean":
                assert str(value) in ("0", "1", "true", "false"), f"{name}={value!r} is not a boolean"
            if "enum" in spec:
                assert value in spec["enum"], f"{name}={value!r} is not one of {spec['enum']}"
        seen.add((req["method"], req["path"]))
    assert ("POST", "/nodes/{node}/lxc") in seen and ("PUT", "/nodes/{node}/lxc/{vmid}/config") in seen
    assert ("GET", "/nodes/{node}/tasks/{upid}/status") in seen
