"""The lab's pct: config file codec and PVE-style argument parsing (no root, no LXC needed)."""

from __future__ import annotations

import os

import pytest

from eagle3_ops.lab_host import pct, pct_config, pct_lxc


def test_config_round_trip_keeps_raw_lxc_lines_in_order_and_repeats():
    text = (
        "#GPU trainer%0Awith two lines\n"
        "arch: amd64\ncores: 4\nhostname: trainer\nmemory: 8192\n"
        "lxc.cgroup2.devices.allow: c 195:* rwm\n"
        "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file\n"
        "lxc.mount.entry: /dev/nvidia1 dev/nvidia1 none bind,optional,create=file\n"
    )
    conf = pct.CtConfig.parse(text)
    assert conf.description == "GPU trainer\nwith two lines"
    assert conf.options["cores"] == "4"
    assert [k for k, _ in conf.lxc] == ["lxc.cgroup2.devices.allow", "lxc.mount.entry", "lxc.mount.entry"]
    assert pct.CtConfig.parse(conf.render()) == conf


def test_snapshot_sections_are_not_read_as_current_config():
    conf = pct.CtConfig.parse("memory: 1024\n[snap1]\nmemory: 512\n")
    assert conf.options == {"memory": "1024"}


@pytest.mark.parametrize(
    ("argv", "pos", "opts", "extra"),
    [
        (["129", "--keep-env", "0", "--", "sh", "-c", "echo hi"], ["129"], {"keep-env": "0"}, ["sh", "-c", "echo hi"]),
        (["129", "--", "--keep-env"], ["129"], {}, ["--keep-env"]),
        (["129", "-keep-env", "1", "--", "true"], ["129"], {"keep-env": "1"}, ["true"]),
        (["129", "--keep-env=no", "--", "true"], ["129"], {"keep-env": "0"}, ["true"]),
        (["129", "ls", "-l"], ["129"], {}, ["ls", "-l"]),
    ],
)
def test_exec_argument_forms(argv, pos, opts, extra):
    assert pct.parse_args(pct.COMMANDS["exec"], argv) == (pos, opts, extra)


def test_set_accepts_indexed_options_and_types():
    pos, opts, _ = pct.parse_args(
        pct.COMMANDS["set"], ["129", "--memory", "2048", "-mp0", "/data,mp=/data", "--onboot", "yes"]
    )
    assert pos == ["129"] and opts == {"memory": "2048", "mp0": "/data,mp=/data", "onboot": "1"}


@pytest.mark.parametrize(
    ("cmd", "argv", "message"),
    [
        ("set", ["129", "--memory", "lots"], "memory: type check ('integer') failed - got 'lots'"),
        ("set", ["129", "--bogus", "1"], "bogus: property is not defined in schema"),
        ("push", ["129", "/a"], "destination: property is missing and it is not optional"),
        ("status", [], "vmid: property is missing and it is not optional"),
        ("set", ["129", "--memory"], "memory: missing value"),
    ],
)
def test_parameter_errors_read_like_proxmox(cmd, argv, message):
    with pytest.raises(pct.PctError) as err:
        pct.parse_args(pct.COMMANDS[cmd], argv)
    assert str(err.value).startswith("400 Parameter verification failed.\n")
    assert message in str(err.value)
    assert err.value.usage == pct.USAGE[cmd]


@pytest.mark.parametrize("text", ["99", "0129", "abc", "1000000000", "-1"])
def test_vmid_bounds(text):
    with pytest.raises(pct.PctError, match="does not look like a valid VM ID"):
        pct.parse_vmid(text, "usage")


def test_template_volume_ids(tmp_path, monkeypatch):
    monkeypatch.setattr(pct, "VZTMPL_DIR", str(tmp_path))
    (tmp_path / "t.tar").write_bytes(b"")
    assert pct.resolve_template("local:vztmpl/t.tar") == str(tmp_path / "t.tar")
    with pytest.raises(pct.PctError, match=r"volume 'local:vztmpl/missing\.tar' does not exist"):
        pct.resolve_template("local:vztmpl/missing.tar")
    with pytest.raises(pct.PctError, match="unable to parse volume ID"):
        pct.resolve_template("local:vztmpl/../../etc/passwd")


def test_unknown_container_message(tmp_path, monkeypatch):
    monkeypatch.setattr(pct_config, "LAB_ROOT", str(tmp_path))
    with pytest.raises(pct.PctError) as err:
        pct.load_config(555)
    assert str(err.value) == f"Configuration file 'nodes/{pct.NODE}/lxc/555.conf' does not exist"


def test_create_file_modes_and_owners(tmp_path):
    fd = pct.create_file(str(tmp_path / "f"), "640", "0", "0")
    os.close(fd)
    st = os.stat(tmp_path / "f")
    assert (st.st_mode & 0o777, st.st_uid, st.st_gid) == (0o640, 0, 0) or os.geteuid() != 0
    with pytest.raises(pct.PctError, match="invalid mode: '0rw'"):
        pct.create_file(str(tmp_path / "g"), "rw", None, None)
    assert not (tmp_path / "g").exists()


def test_create_and_set_options_exist_in_the_pve_schema():

    from tests.conftest import pve_schema

    schema = pve_schema()
    index = {}

    def walk(nodes):
        for n in nodes:
            index[n["path"]] = n.get("info", {})
            walk(n.get("children") or [])

    walk(schema)
    create = index["/nodes/{node}/lxc"]["POST"]["parameters"]["properties"]
    update = index["/nodes/{node}/lxc/{vmid}/config"]["PUT"]["parameters"]["properties"]
    for name, kind in pct_config.OPTION_TYPES.items():
        assert name in create, f"pct create --{name} is not a PVE option"
        assert create[name]["type"] == kind, f"--{name} is {create[name]['type']} in PVE, {kind} in the lab"
        assert name in update or name in pct.CREATE_ONLY
    for prefix in pct_config.INDEXED_OPTIONS:
        assert f"{prefix}[n]" in create


def _template(path, names: dict[str, bytes]) -> str:
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, data in names.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return str(path)


@pytest.fixture
def overlay_lab(tmp_path, monkeypatch):
    """pct_lxc with its lab root and LXC path under tmp_path, on a kernel with overlayfs."""
    monkeypatch.setattr(pct_lxc, "LAB_ROOT", str(tmp_path / "lab"))
    monkeypatch.setattr(pct_lxc, "LXC_PATH", str(tmp_path / "lxc"))
    monkeypatch.setattr(pct_lxc, "overlay_supported", lambda: True)
    return tmp_path


def test_a_template_is_extracted_once_and_each_container_gets_an_overlay_on_it(overlay_lab, monkeypatch):
    tmp_path = overlay_lab
    extracted: list[str] = []
    real_extract = pct_lxc.extract
    monkeypatch.setattr(pct_lxc, "extract", lambda t, d: (extracted.append(t), real_extract(t, d)))
    template = _template(tmp_path / "t.tar", {"etc/os-release": b"ID=debian\n"})
    for vmid in (101, 102):
        os.makedirs(pct_lxc.ct_dir(vmid))
        pct_lxc.make_rootfs(vmid, template)
    assert extracted == [template]  # once for both containers
    (lower,) = (tmp_path / "lab" / "rootfs").iterdir()
    assert (lower / "etc" / "os-release").read_bytes() == b"ID=debian\n"
    # an archive without a "./" entry: the guest's / is 0755, not mkdtemp's 0700
    upper = tmp_path / "lxc" / "101" / "delta0"
    assert (lower.stat().st_mode & 0o777, upper.stat().st_mode & 0o777) == (0o755, 0o755)
    conf = pct_lxc.render_lxc_config(101, pct_config.CtConfig())
    assert f"lxc.rootfs.path = overlay:{lower}:{tmp_path}/lxc/101/delta0\n" in conf
    # host-side writes at start go to the container's own layer; the template's copy is never written
    pct_lxc.setup_guest(101, pct_config.CtConfig(options={"hostname": "t101"}))
    assert (tmp_path / "lxc" / "101" / "delta0" / "etc" / "hostname").read_text() == "t101\n"
    assert sorted(p.name for p in (lower / "etc").iterdir()) == ["os-release"]
    # a rebuilt template (another size or mtime) gets a copy of its own; the old one stays under its containers
    template = _template(tmp_path / "t.tar", {"etc/os-release": b"ID=debian\nVERSION_ID=12\n"})
    os.makedirs(pct_lxc.ct_dir(103))
    pct_lxc.make_rootfs(103, template)
    assert len(list((tmp_path / "lab" / "rootfs").iterdir())) == 2 and lower.is_dir()


def test_a_failed_extraction_leaves_no_template_copy_and_without_overlayfs_a_container_has_its_own(
        overlay_lab, monkeypatch):  # fmt: skip
    tmp_path = overlay_lab
    broken = tmp_path / "broken.tar"
    broken.write_bytes(b"not a tar archive" * 100)
    os.makedirs(pct_lxc.ct_dir(101))
    with pytest.raises(pct.PctError, match=r"unable to extract '.*broken\.tar'"):
        pct_lxc.make_rootfs(101, str(broken))
    assert list((tmp_path / "lab" / "rootfs").iterdir()) == []
    monkeypatch.setattr(pct_lxc, "overlay_supported", lambda: False)
    pct_lxc.make_rootfs(101, _template(tmp_path / "t.tar", {"etc/os-release": b"ID=debian\n"}))
    assert (tmp_path / "lxc" / "101" / "rootfs" / "etc" / "os-release").is_file()
    assert "lxc.rootfs.path = dir:" in pct_lxc.render_lxc_config(101, pct_config.CtConfig())
