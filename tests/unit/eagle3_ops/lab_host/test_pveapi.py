"""The lab's Proxmox API on its own (a real HTTPS server over a lab root of config files, no LXC needed for
reads), and the proxmox_ct module against it in check mode: what it would change, what it refuses."""

from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from eagle3_ops.lab_host import pveapi
from tests.modules import ROOT, run_module

PVEAPI = ROOT / "eagle3_ops" / "lab_host" / "pveapi.py"
TOKEN = ("root@pam!eagle3", "s3cret-token")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api(tmp_path: Path, request):
    """The API over a lab root of config files; request.param names the nodes."""
    yield from _serve(tmp_path, getattr(request, "param", ["pve-lab"]), {})


def _serve(tmp_path: Path, nodes: list[str], hops: dict[str, str]):
    """Serve the API (hops: node -> the pid file of its hop, online while it names a live sshd)."""
    root = tmp_path / "lab"
    conf_dir = root / "pve" / "nodes" / "pve-lab" / "lxc"
    conf_dir.mkdir(parents=True)
    (conf_dir / "129.conf").write_text("hostname: ct129\nmemory: 1024\ncores: 2\nswap: 0\n"
                                       "rootfs: local:129/vm-129-disk-0.raw,size=8G\n")  # fmt: skip
    for i, node in enumerate(nodes[1:]):
        other = root / "pve" / "nodes" / node / "lxc"
        other.mkdir(parents=True)
        (other / f"{141 + i}.conf").write_text(f"hostname: trainer-{node}\nmemory: 2048\ncores: 2\n")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)  # fmt: skip
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({TOKEN[0]: TOKEN[1]}))
    port = _free_port()
    env = dict(os.environ, EAGLE3_LAB_ROOT=str(root), EAGLE3_LAB_NODE="pve-lab", EAGLE3_LAB_NODES=",".join(nodes),
               EAGLE3_LAB_LXC_PATH=str(tmp_path / "lxc"))  # fmt: skip
    proc = subprocess.Popen([sys.executable, str(PVEAPI), "--port", str(port), "--cert", str(cert), "--key", str(key),
                             "--tokens", str(tokens), *(f"--hop={n}={f}" for n, f in hops.items())],
                            env=env)  # fmt: skip
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            break
        except OSError:
            time.sleep(0.1)
    yield {"port": port, "cert": str(cert), "conf": conf_dir / "129.conf", "root": root}
    proc.kill()
    proc.wait()


def _get(api, path: str, token: tuple[str, str] = TOKEN) -> tuple[int, dict]:
    return _request(api, "GET", path, None, token)


def _request(api, method: str, path: str, params: dict[str, str] | None,
             token: tuple[str, str] = TOKEN) -> tuple[int, dict]:  # fmt: skip
    """One call to the test's API (form-encoded params), as (HTTP status, body), errors included."""
    headers = {"Authorization": f"PVEAPIToken={token[0]}={token[1]}"}
    if params is not None:
        headers["Content-Type"] = "application/x-www-form-urlencoded"
    req = urllib.request.Request(f"https://127.0.0.1:{api['port']}/api2/json{path}", method=method, headers=headers,
                                 data=urllib.parse.urlencode(params).encode() if params is not None else None)
    ctx = ssl.create_default_context(cafile=api["cert"])
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as resp:  # noqa: S310 -- the test's own server
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_reads_answer_in_pve_envelopes(api):
    status, body = _get(api, "/nodes")
    assert status == 200 and body["data"][0]["node"] == "pve-lab"
    status, body = _get(api, "/nodes/pve-lab/lxc/129/config")
    assert status == 200 and body["data"]["memory"] == 1024 and len(body["data"]["digest"]) == 40
    status, body = _get(api, "/cluster/resources")
    assert status == 200 and [(r["vmid"], r["node"], r["status"]) for r in body["data"] if r.get("type") == "lxc"] == [
        (129, "pve-lab", "stopped")]


def test_refusals_are_pve_errors(api):
    assert _get(api, "/nodes", token=(TOKEN[0], "wrong"))[0] == 401
    status, body = _get(api, "/nodes/pve-lab/qemu")
    assert status == 501 and "not implemented" in body["message"]
    status, body = _get(api, "/nodes/elsewhere/lxc/129/config")
    assert status == 500 and "hostname lookup 'elsewhere' failed" in body["message"]
    log = [json.loads(line) for line in (api["root"] / "pve" / "api-requests.jsonl").read_text().splitlines()]
    asked = {"method": "GET", "path": "/nodes/{node}/lxc/{vmid}/config", "params": {"node": "elsewhere", "vmid": "129"}}
    assert asked in log


def test_parameter_checks_follow_pve():
    with pytest.raises(pveapi.ApiError) as err:
        pveapi.validate({"memory": "8", "vmid": "12", "bogus": "1"}, pveapi.CT_OPTIONS | {"vmid"},
                        {"vmid", "ostemplate"})
    assert err.value.status == 400 and set(err.value.errors) == {"memory", "vmid", "bogus", "ostemplate"}
    pveapi.check_root_only({"dev0": "/dev/nvidia0"}, "root@pam", token=False)  # a root ticket may
    with pytest.raises(pveapi.ApiError, match="device passthrough"):
        pveapi.check_root_only({"dev0": "/dev/nvidia0"}, "root@pam", token=True)
    with pytest.raises(pveapi.ApiError, match="bind mount mp0"):
        pveapi.check_root_only({"mp0": "/srv/eagle3,mp=/srv/eagle3"}, "root@pam", token=True)
    assert pveapi.upid("pve-lab", "vzstart", "129", "root@pam").startswith("UPID:pve-lab:")


def test_every_route_is_in_the_published_schema():
    from tests.conftest import pve_schema

    index: dict[str, dict] = {}

    def walk(nodes):
        for n in nodes:
            index[n["path"]] = n.get("info", {})
            walk(n.get("children") or [])

    walk(pve_schema())
    for method, _regex, template, _handler in pveapi.Api().routes:
        assert method in index.get(template, {}), f"{method} {template} is not in PVE 9.1.3's API"
        # PVE proxies exactly these to the node they name (the lab's 595 for an offline node follows it)
        proxied = index[template][method].get("proxyto") == "node"
        assert proxied == template.startswith("/nodes/{node}/"), f"{method} {template}: proxyto differs"


def _ct(api, capsys, **args):
    base = {"api_host": "127.0.0.1", "api_port": api["port"], "api_token_id": "eagle3", "api_token_secret": TOKEN[1],
            "validate_certs": api["cert"], "node": "pve-lab", "vmid": 129, "state": "present"}  # fmt: skip
    return run_module("proxmox_ct", {**base, **args}, check=True, diff=True, capsys=capsys)


def test_proxmox_ct_check_mode_shows_the_change_and_writes_nothing(api, capsys):
    before = api["conf"].read_text()
    result = _ct(api, capsys, hostname="ct129", memory=2048, cores=2)
    assert result["changed"] and result["updated"] == ["memory"] and not result.get("failed")
    assert result["diff"] == {"before": "memory: 1024\n", "after": "memory: 2048\n"}
    assert api["conf"].read_text() == before
    assert _ct(api, capsys, hostname="ct129", memory=1024)["changed"] is False


def test_proxmox_ct_refusals_are_one_sentence(api, capsys):
    result = _ct(api, capsys, node="pve-other", memory=2048)
    assert result["failed"] and result["msg"].startswith("Node 'pve-other' is not in the cluster (nodes: pve-lab)")
    result = _ct(api, capsys, hostname="someone-else")
    assert result["failed"] and "is 'ct129', not 'someone-else'" in result["msg"]
    result = _ct(api, capsys, api_token_secret="wrong")  # noqa: S106 -- a wrong secret on purpose
    assert result["failed"] and "\n" not in result["msg"] and "401" in result["msg"]
    result = _ct(api, capsys, mounts=[{"mp": "/srv/x"}])
    assert result["failed"] and result["msg"] == "Mount point /srv/x needs exactly one of host_path or volume."


@pytest.mark.parametrize("api", [["pve-lab", "pve-b"]], indirect=True, ids=["two nodes"])
def test_a_cluster_answers_for_every_node(api, capsys):
    status, body = _get(api, "/nodes")
    assert [n["node"] for n in body["data"]] == ["pve-lab", "pve-b"]
    status, body = _get(api, "/cluster/resources?type=vm")
    assert status == 200 and sorted((r["vmid"], r["node"]) for r in body["data"]) == [(129, "pve-lab"), (141, "pve-b")]
    status, body = _get(api, "/nodes/pve-b/lxc")
    assert [c["vmid"] for c in body["data"]] == [141]
    status, body = _get(api, "/nodes/pve-lab/lxc/141/config")  # asked of the wrong node, as PVE answers
    assert status == 500 and "nodes/pve-lab/lxc/141.conf' does not exist" in body["message"]
    _status, body = _get(api, "/cluster/status")
    assert [e.get("name") for e in body["data"] if e["type"] == "node"] == ["pve-lab", "pve-b"]
    # proxmox_ct refuses a VMID that the cluster has on another node, naming it
    result = _ct(api, capsys, vmid=141, hostname="trainer-pve-b")
    assert result["failed"]
    assert result["msg"] == "VMID 141 is already used by trainer-pve-b on node pve-b: pick another."
    result = _ct(api, capsys, vmid=141, node="pve-b", hostname="trainer-pve-b", memory=2048)
    assert not result.get("failed") and result["changed"] is False


@pytest.fixture
def hop(tmp_path: Path):
    """A stand-in for node pve-b's hop: a process whose command line names sshd, and its pid file."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "sshd-stand-in"])
    pidfile = tmp_path / "sshd-pve-b.pid"
    pidfile.write_text(f"{proc.pid}\n")
    yield {"proc": proc, "pidfile": pidfile}
    proc.kill()
    proc.wait()


@pytest.fixture
def fleet_api(tmp_path: Path, hop):
    yield from _serve(tmp_path, ["pve-lab", "pve-b"], {"pve-b": str(hop["pidfile"])})


def test_a_node_whose_hop_died_is_offline_as_a_pve_cluster_shows_it(fleet_api, hop, capsys):
    """While the hop runs the node is online; once it is gone, PVE's picture of a dead node: offline in the lists,
    its guests still listed (the shared configuration) with the state unknown, and every call PVE proxies to it
    answered 595; proxmox_ct refuses to act on it, before any change."""
    _status, body = _get(fleet_api, "/cluster/status")
    assert [(e["name"], e["online"]) for e in body["data"] if e["type"] == "node"] == [("pve-lab", 1), ("pve-b", 1)]
    assert _get(fleet_api, "/nodes/pve-b/lxc/141/config")[0] == 200
    hop["proc"].kill()
    hop["proc"].wait()
    _status, body = _get(fleet_api, "/cluster/status")
    assert [(e["name"], e["online"]) for e in body["data"] if e["type"] == "node"] == [("pve-lab", 1), ("pve-b", 0)]
    assert body["data"][0]["quorate"] == 0  # one of two votes
    _status, body = _get(fleet_api, "/nodes")
    assert [(n["node"], n["status"]) for n in body["data"]] == [("pve-lab", "online"), ("pve-b", "offline")]
    _status, body = _get(fleet_api, "/cluster/resources")
    assert {r["id"]: r["status"] for r in body["data"]} == {"node/pve-lab": "online", "node/pve-b": "offline",
                                                            "lxc/129": "stopped", "lxc/141": "unknown"}  # fmt: skip
    assert next(r for r in body["data"] if r["id"] == "lxc/141")["name"] == "trainer-pve-b"
    for path in ("/nodes/pve-b/lxc/141/config", "/nodes/pve-b/lxc", "/nodes/pve-b/lxc/141/status/current"):
        status, body = _get(fleet_api, path)
        assert (status, body["message"]) == (595, "No route to host"), path
    assert _get(fleet_api, "/nodes/pve-lab/lxc/129/config")[0] == 200  # the other node answers
    result = _ct(fleet_api, capsys, vmid=141, node="pve-b", hostname="trainer-pve-b", memory=4096)
    assert result["failed"] and result["msg"] == (
        "Node 'pve-b' is offline in the cluster, so nothing on it can be read or changed: bring it back, or choose "
        "an online node (pve-lab).")
    assert "memory: 2048" in (fleet_api["root"] / "pve" / "nodes" / "pve-b" / "lxc" / "141.conf").read_text()
    # One node of two: no quorum, so PVE refuses changes on the node still up too (its cluster file system is
    # read-only), and the module says why in one sentence.
    status, body = _request(fleet_api, "PUT", "/nodes/pve-lab/lxc/129/config", {"memory": "2048"})
    assert (status, body["message"]) == (500, "cluster not ready - no quorum?")
    assert "memory: 1024" in fleet_api["conf"].read_text()
    result = run_module("proxmox_ct", {"api_host": "127.0.0.1", "api_port": fleet_api["port"], "api_token_id": "eagle3",
                                       "api_token_secret": TOKEN[1], "validate_certs": fleet_api["cert"],
                                       "node": "pve-lab", "vmid": 129, "state": "present", "hostname": "ct129",
                                       "memory": 2048}, capsys=capsys)  # fmt: skip
    assert result["failed"] and "the cluster has no quorum" in result["msg"] and "\n" not in result["msg"]
    assert "memory: 1024" in fleet_api["conf"].read_text()
