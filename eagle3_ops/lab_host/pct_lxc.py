"""The lab pct's LXC side: where a container lives, its generated lxc config (mount points, GPU devices), its
init process, and running work inside its namespaces (push, pull). Standard library only."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable

try:  # a package module (tests, eagle3_ops), or loose files beside each other (the lab host's bin/)
    from .pct_config import CLONE_NEWNS, LAB_ROOT, LXC_PATH, NODE, CtConfig, PctError
except ImportError:  # pragma: no cover
    from pct_config import CLONE_NEWNS, LAB_ROOT, LXC_PATH, NODE, CtConfig, PctError  # type: ignore[no-redef]

# --------------------------------------------------------------------------------------------
# LXC plumbing
# --------------------------------------------------------------------------------------------


def ct_dir(vmid: int) -> str:
    return os.path.join(LXC_PATH, str(vmid))


def rootfs_dir(vmid: int) -> str:
    return os.path.join(ct_dir(vmid), "rootfs")


def upper_dir(vmid: int) -> str:
    """A container's own files when its rootfs is an overlay on its template's (what it wrote since its creation)."""
    return os.path.join(ct_dir(vmid), "delta0")


def lower_file(vmid: int) -> str:
    """Names the template rootfs under a container's overlay; absent for a container with a rootfs of its own."""
    return os.path.join(ct_dir(vmid), "template-rootfs")


def extract(template: str, dest: str) -> None:
    # GNU tar keeps owners, modes, devices and xattrs of the rootfs; it is several times faster than tarfile on the
    # ~11k files of a Debian rootfs.
    proc = subprocess.run(
        ["tar", "-xpf", template, "-C", dest, "--numeric-owner"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise PctError(f"unable to extract '{template}': {proc.stderr.strip()}")


def overlay_supported() -> bool:
    """Whether the kernel mounts overlayfs (loaded now, or loadable: the module is asked for once)."""

    def listed() -> bool:
        with contextlib.suppress(OSError), open("/proc/filesystems", encoding="utf-8") as fh:
            return any(line.split()[-1:] == ["overlay"] for line in fh)
        return False

    if listed():
        return True
    with contextlib.suppress(OSError):  # no modprobe: what /proc/filesystems says stands
        subprocess.run(["modprobe", "-q", "overlay"], capture_output=True, check=False)
    return listed()


def template_rootfs(template: str) -> str:
    """The template's rootfs, extracted once per template file (its size and mtime name the copy: a rebuilt template
    gets a new one) and shared read-only by the containers made from it as the lower layer of their overlays.

    Extracting a 200 MB rootfs costs seconds of kernel time on every create; the lab's containers differ from their
    template only in what they write. The copy appears whole or not at all: it is extracted beside its final name and
    renamed; of two creates that extract at once, the first rename wins and the other copy is removed."""
    st = os.stat(template)
    base = os.path.join(LAB_ROOT, "rootfs")
    lower = os.path.join(base, f"{os.path.basename(template)}.{st.st_size}.{st.st_mtime_ns}")
    if os.path.isdir(lower):
        return lower
    os.makedirs(base, exist_ok=True)
    stage = tempfile.mkdtemp(prefix=f".{os.path.basename(lower)}.", dir=base)
    # mkdtemp makes 0700: an archive without a "./" entry would leave the guest's / shutting out every other user
    os.chmod(stage, 0o755)  # noqa: S103 -- the guest's root directory
    try:
        extract(template, stage)
        try:
            os.rename(stage, lower)
        except OSError:
            if not os.path.isdir(lower):
                raise
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return lower


def make_rootfs(vmid: int, template: str) -> None:
    """A new container's rootfs: an overlay on the template's extracted rootfs where the kernel has overlayfs (the
    container's writes go to its own upper layer), else the template extracted into the container's directory."""
    if overlay_supported():
        lower = template_rootfs(template)
        os.makedirs(upper_dir(vmid))
        os.chmod(upper_dir(vmid), os.stat(lower).st_mode & 0o7777)
        with open(lower_file(vmid), "w", encoding="utf-8") as fh:
            fh.write(lower + "\n")
        return
    os.makedirs(rootfs_dir(vmid))
    extract(template, rootfs_dir(vmid))


def template_lower(vmid: int) -> str | None:
    """The template rootfs under a container's overlay, or None for a container with a rootfs of its own."""
    with contextlib.suppress(FileNotFoundError), open(lower_file(vmid), encoding="utf-8") as fh:
        return fh.read().strip()
    return None


def rootfs_path(vmid: int) -> str:
    """lxc.rootfs.path: ``overlay:<template rootfs>:<upper>`` (LXC puts its work directory beside the upper one) or
    ``dir:<rootfs>``."""
    lower = template_lower(vmid)
    return f"overlay:{lower}:{upper_dir(vmid)}" if lower else f"dir:{rootfs_dir(vmid)}"


def guest_root(vmid: int) -> str:
    """Where host-side writes to a stopped container's files go: its upper layer, or its own rootfs."""
    return upper_dir(vmid) if template_lower(vmid) else rootfs_dir(vmid)


def init_pid(vmid: int) -> int | None:
    """PID of the container's init on the host, or None when it is not running."""
    proc = subprocess.run(
        ["lxc-info", "-P", LXC_PATH, "-n", str(vmid), "-p", "-H"],
        capture_output=True,
        text=True,
        check=False,
    )
    text = proc.stdout.strip()
    return int(text) if proc.returncode == 0 and text.isdigit() else None


def is_running(vmid: int) -> bool:
    return init_pid(vmid) is not None


def render_lxc_config(vmid: int, conf: CtConfig) -> str:
    """The LXC config pve-container would generate at start, for a privileged dir-backed container."""
    hostname = conf.options.get("hostname", f"CT{vmid}")
    lines = [
        "# generated by the eagle3-ops lab pct from "
        f"nodes/{NODE}/lxc/{vmid}.conf at every start; edit that file instead",
        # Proxmox includes debian.common.conf, which Debian ships in lxc-templates; the lab needs only what
        # it derives from: common.conf (package lxc itself) and its one Debian line (consoles not in /dev/lxc).
        "lxc.include = /usr/share/lxc/config/common.conf",
        "lxc.tty.dir =",
        f"lxc.arch = {'amd64' if conf.options.get('arch', 'amd64') == 'amd64' else conf.options['arch']}",
        f"lxc.uts.name = {hostname}",
        f"lxc.rootfs.path = {rootfs_path(vmid)}",
        *net_lines(conf),
        "lxc.apparmor.profile = unconfined",
        "lxc.tty.max = 2",
        "lxc.pty.max = 1024",
    ]
    lines += mount_point_lines(vmid, conf)
    lines += [f"{k} = {v}" for k, v in conf.lxc]
    return "\n".join(lines) + "\n"


def net_lines(conf: CtConfig) -> list[str]:
    """net0..netN as pve-container renders them (veth on a bridge, static address, optional gateway). Without a
    netN the container has loopback only: the hypervisor path (pct exec) is how eagle3-ops reaches it anyway; the
    lab gives containers that talk to each other (rendezvous, router) a bridge of its own with no route out."""
    lines: list[str] = []
    nets = sorted((int(k[3:]), v) for k, v in conf.options.items() if re.fullmatch(r"net\d+", k))
    for index, (_n, value) in enumerate(nets):
        fields = dict(part.split("=", 1) for part in value.split(",") if "=" in part)
        lines += [f"lxc.net.{index}.type = veth", f"lxc.net.{index}.name = {fields.get('name', f'eth{index}')}",
                  f"lxc.net.{index}.flags = up"]  # fmt: skip
        if fields.get("bridge"):
            lines.append(f"lxc.net.{index}.link = {fields['bridge']}")
        if fields.get("hwaddr"):
            lines.append(f"lxc.net.{index}.hwaddr = {fields['hwaddr']}")
        if fields.get("ip") not in (None, "dhcp", "manual"):
            lines.append(f"lxc.net.{index}.ipv4.address = {fields['ip']}")
        if fields.get("gw"):
            lines.append(f"lxc.net.{index}.ipv4.gateway = {fields['gw']}")
    return lines or ["lxc.net.0.type = empty"]


def _field(text: str, bare_key: str) -> tuple[str, str]:
    """One ``key=value`` field of a Proxmox property string; a bare value is the property's default key."""
    key, sep, value = text.partition("=")
    return (key, value) if sep else (bare_key, text)


def mount_point_lines(vmid: int, conf: CtConfig) -> list[str]:
    """LXC lines for mpN (bind mounts / lab volumes) and devN (device passthrough).

    mpN: ``/host/dir,mp=/path[,ro=1]`` binds a host directory; ``STORAGE:SIZE,mp=/path`` gets a lab
    volume directory under the lab root. devN: ``[path=]/dev/x[,uid=,gid=,mode=]`` binds the device
    node. Real PVE mounts devN at the same path inside; the lab's emulated GPU nodes live outside
    /dev, so the lab binds them to ``/dev/<name>``.
    """
    lines = []
    for key in sorted(conf.options):
        value = conf.options[key]
        if re.fullmatch(r"mp\d+", key):
            fields = dict(_field(f, "volume") for f in value.split(","))
            volume, target = fields.get("volume", ""), fields.get("mp", "")
            if not target.startswith("/"):
                continue
            if not volume.startswith("/"):
                volume = os.path.join(LAB_ROOT, "volumes", f"vm-{vmid}-{key}")
                os.makedirs(volume, exist_ok=True)
            opts = "bind,create=dir" + (",ro" if fields.get("ro") in ("1", "true") else "")
            lines.append(f"lxc.mount.entry = {volume} {target.lstrip('/')} none {opts} 0 0")
        elif re.fullmatch(r"dev\d+", key):
            fields = dict(_field(f, "path") for f in value.split(","))
            path = fields.get("path", "")
            if path.startswith("/"):
                lines.append(f"lxc.mount.entry = {path} dev/{os.path.basename(path)} none bind,optional,create=file")
    return lines


def setup_guest(vmid: int, conf: CtConfig) -> None:
    """What pve-container's setup does at start for the parts the lab uses: hostname and hosts."""
    root = guest_root(vmid)
    hostname = conf.options.get("hostname", f"CT{vmid}")
    etc = os.path.join(root, "etc")
    os.makedirs(etc, exist_ok=True)  # an upper layer has an etc/ only once something there was written
    # Refuse to follow symlinks the guest may have planted: these writes happen host-side.
    for name, content in (
        ("hostname", f"{hostname}\n"),
        ("hosts", f"127.0.0.1 localhost\n127.0.1.1 {hostname}\n::1 localhost ip6-localhost ip6-loopback\n"),
    ):
        path = os.path.join(etc, name)
        if os.path.islink(path):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(content)


def _libc_setns(fd: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNS) != 0:
        raise PctError("failed to enter the container's mount namespace")


def _lookup_id(db: str, name: str, what: str) -> int:
    if name.isdigit():
        return int(name)
    with contextlib.suppress(FileNotFoundError), open(db, encoding="utf-8") as fh:
        for line in fh:
            parts = line.rstrip("\n").split(":")
            if len(parts) > 2 and parts[0] == name:
                return int(parts[2])
    raise PctError(f"failed to get {what} for: {name}")


def create_file(path: str, perms: str | None, user: str | None, group: str | None) -> int:
    """Open ``path`` for writing like pve-container's create_file: explicit perms, owner by name or id.

    Names resolve in the namespace we are in (the container's, for push). O_NOFOLLOW is not used on
    purpose: inside the container's mount namespace a symlink can only point inside the container.
    """
    uid = _lookup_id("/etc/passwd", user, "uid") if user is not None else -1
    gid = _lookup_id("/etc/group", group, "gid") if group is not None else -1
    mode: int | None = None
    if perms is not None:
        text = perms if perms.startswith("0") else "0" + perms
        try:
            mode = int(text, 16) if text.lower().startswith("0x") else int(text, 8)
        except ValueError:
            raise PctError(f"invalid mode: '{text}'") from None
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except FileExistsError:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            raise PctError(f"failed to create file: {path}: {exc.strerror}") from None
    except OSError as exc:
        raise PctError(f"failed to create file: {path}: {exc.strerror}") from None
    if mode is not None:
        os.fchmod(fd, mode)
    if uid != -1 or gid != -1:
        try:
            os.fchown(fd, uid, gid)
        except OSError as exc:
            raise PctError(f"failed to change file owner: {exc.strerror}") from None
    return fd


def _copy_fd(src: int, dst: int) -> None:
    """Kernel-side copy, constant memory; falls back to read/write for pipes and special files."""
    offset = 0
    try:
        while True:
            sent = os.sendfile(dst, src, offset, 1 << 24)
            if sent == 0:
                return
            offset += sent
    except OSError:
        if offset:
            raise
    while chunk := os.read(src, 1 << 20):
        os.write(dst, chunk)


def _in_container(vmid: int, work: Callable[[], None]) -> int:
    """Run ``work`` in a forked child that entered the container's mount namespace."""
    pid = init_pid(vmid)
    if pid is None:
        raise PctError(f"container '{vmid}' not running!")
    ns_fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
    child = os.fork()
    if child == 0:
        code = 0
        try:
            _libc_setns(ns_fd)
            os.close(ns_fd)
            os.chdir("/")
            work()
        except PctError as exc:
            print(exc, file=sys.stderr)
            code = 255
        except OSError as exc:
            print(f"{exc.strerror}: {exc.filename}" if exc.filename else str(exc), file=sys.stderr)
            code = 255
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    os.close(ns_fd)
    _unused, status = os.waitpid(child, 0)
    return os.waitstatus_to_exitcode(status)
