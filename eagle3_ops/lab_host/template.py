"""Build and verify the lab's Debian container template (a tar of a rootfs, Proxmox ``vztmpl`` style).

Why not ``lxc-create -t debian``: that template installs the extra packages in a second apt step whose
failure it only prints ("Apt update failed, not downloading packages") while still exiting 0, so a
template without ``python3`` was published on machines missing ``distro-info``. Here the packages go in
with ``debootstrap --include``, which fails when one cannot be fetched, and the rootfs is checked
before it is packed: every requested package installed according to dpkg, and ``python3`` runs in it.
A cached template is checked the same way (from the tar's dpkg database) before it is reused.

Standard library only; runs on the lab host as root.

    template.py check TEMPLATE --packages a,b,c
    template.py build TEMPLATE --packages a,b,c [--release bookworm] [--mirror URL]

Both print one JSON object. Exit codes: 0 ok, 3 the cached template is missing or lacks packages
(``check`` only), 1 the build failed (the message names the missing packages and debootstrap's error).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

# Always in the template: systemd as the container's init (pct start boots it; roles use systemd units).
BASE_PACKAGES = ("init",)
DPKG_STATUS = "var/lib/dpkg/status"
PYTHON_PROBE = "import json, ssl, sys, venv; print(sys.version.split()[0])"
# Units that cannot work in an unprivileged-device container and only fail at every boot.
MASKED_UNITS = ("udev.service", "systemd-udevd.service", "systemd-udev-trigger.service")


class TemplateError(Exception):
    """A build step failed; the message is the one sentence the role shows."""


def installed_packages(status_text: str) -> set[str]:
    """Package names dpkg records as fully installed ("install ok installed") in a status database."""
    installed: set[str] = set()
    for stanza in status_text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line and not line[0].isspace() and ":" in line:
                key, _unused, value = line.partition(":")
                fields[key] = value.strip()
        if fields.get("Status") == "install ok installed" and "Package" in fields:
            installed.add(fields["Package"])
    return installed


def missing_packages(status_text: str, wanted: Iterable[str]) -> list[str]:
    have = installed_packages(status_text)
    # "python3:amd64" style names are accepted in the list; dpkg's Package field has no arch.
    return [p for p in wanted if p.split(":", 1)[0] not in have]


def read_tar_member(tar: Path, member: str) -> str | None:
    """One file of an uncompressed template tar (GNU tar: much faster than tarfile on ~15k members)."""
    for name in (f"./{member}", member):
        proc = subprocess.run(["tar", "-xOf", str(tar), name], capture_output=True, check=False)
        if proc.returncode == 0:
            return proc.stdout.decode("utf-8", "replace")
    return None


def root_mode(tar: Path) -> int | None:
    """Permission bits of the template's top directory ("./"), which become the container's "/"."""
    proc = subprocess.run(["tar", "-tvf", str(tar), "--no-recursion", "./"], capture_output=True, text=True,
                          check=False)
    line = proc.stdout.splitlines()[0] if proc.returncode == 0 and proc.stdout else ""
    if len(line) < 10 or line[0] != "d":
        return None
    bits = 0
    for i, ch in enumerate(line[1:10]):
        if ch != "-":
            bits |= 1 << (8 - i)
    return bits


# A complete check's verdict, kept on the tar itself (an extended attribute): it names the file's size, mtime and
# inode and the packages asked for, so a tar that was replaced or rewritten is read again, and a rerun of lab.yml
# does not scan ~200 MB three times to learn what it learnt last time. Where the filesystem has no user
# attributes, every check reads the tar.
CHECKED_XATTR = "user.eagle3.template-check"


def _identity(tar: Path, packages: list[str]) -> bytes:
    st = tar.stat()
    return json.dumps({"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino,
                       "packages": sorted(packages)}, sort_keys=True).encode()  # fmt: skip


def _checked_before(tar: Path, packages: list[str]) -> bool:
    try:
        return os.getxattr(tar, CHECKED_XATTR) == _identity(tar, packages)
    except OSError:
        return False


def _remember_check(tar: Path, packages: list[str]) -> None:
    try:
        os.setxattr(tar, CHECKED_XATTR, _identity(tar, packages))
    except OSError:
        pass  # no user attributes here: the next check reads the tar again


def check_template(tar: Path, packages: list[str]) -> dict[str, object]:
    """Whether a published template holds every package (and python3); never raises for a bad cache."""
    if not tar.is_file():
        return {"ok": False, "template": str(tar), "reason": "absent", "missing": list(packages)}
    if _checked_before(tar, packages):
        return {"ok": True, "template": str(tar), "reason": "complete", "missing": [], "checked_before": True}
    mode = root_mode(tar)
    if mode is None or mode & 0o005 != 0o005:
        shown = "unknown" if mode is None else oct(mode)
        return {"ok": False, "template": str(tar), "reason": f"its / has mode {shown}, closed to non-root users",
                "missing": []}
    status = read_tar_member(tar, DPKG_STATUS)
    if status is None:
        return {"ok": False, "template": str(tar), "reason": "no dpkg database in the tar", "missing": list(packages)}
    missing = missing_packages(status, packages)
    has_python = read_tar_member(tar, "usr/bin/python3") is not None or "python3" not in packages
    if missing or not has_python:
        return {"ok": False, "template": str(tar), "reason": "lacks packages", "missing": missing or ["python3"]}
    _remember_check(tar, packages)
    return {"ok": True, "template": str(tar), "reason": "complete", "missing": []}


def _tail(text: str, lines: int = 6) -> str:
    errors = [ln for ln in text.splitlines() if ln.startswith(("E:", "W:"))]
    chosen = errors[-lines:] or text.strip().splitlines()[-lines:]
    return " | ".join(chosen)


def debootstrap(stage: Path, release: str, mirror: str, packages: list[str]) -> None:
    if not shutil.which("debootstrap"):
        raise TemplateError("debootstrap is not installed on the lab host: run 'bash scripts/bootstrap.sh' "
                            "(or apt-get install debootstrap).")
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(packages)}", release, str(stage), mirror]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TemplateError(
            f"debootstrap of Debian {release} from {mirror} failed (rc {proc.returncode}) while including "
            f"{', '.join(packages)}: {_tail(proc.stdout + proc.stderr)}"
        )


def configure_for_lxc(stage: Path) -> None:
    """What a systemd rootfs needs to boot quietly as an LXC container (no udev, multi-user target)."""
    units = stage / "etc/systemd/system"
    units.mkdir(parents=True, exist_ok=True)
    for unit in MASKED_UNITS:
        link = units / unit
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to("/dev/null")
    default = units / "default.target"
    if default.is_symlink() or default.exists():
        default.unlink()
    default.symlink_to("/lib/systemd/system/multi-user.target")
    # The containers have no network: apt inside them is never used, and the caches only weigh the tar.
    for cache in (stage / "var/cache/apt/archives", stage / "var/lib/apt/lists"):
        if cache.is_dir():
            for path in cache.rglob("*"):
                if path.is_file() and path.name != "lock":
                    path.unlink()


def verify_rootfs(stage: Path, packages: list[str]) -> str:
    """Fail naming what is missing: dpkg's view of each package, and python3 actually running."""
    status_file = stage / DPKG_STATUS
    if not status_file.is_file():
        raise TemplateError(f"the staging rootfs {stage} has no dpkg database: debootstrap did not finish.")
    missing = missing_packages(status_file.read_text(errors="replace"), packages)
    if missing:
        raise TemplateError(
            f"the staging rootfs lacks {', '.join(missing)} after debootstrap: check the mirror and the "
            f"package names in lab_host_template_packages."
        )
    proc = subprocess.run(["chroot", str(stage), "/usr/bin/python3", "-c", PYTHON_PROBE],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise TemplateError(f"python3 does not run in the staging rootfs: {_tail(proc.stderr)}")
    return proc.stdout.strip()


def build_template(tar: Path, packages: list[str], release: str, mirror: str) -> dict[str, object]:
    """debootstrap → configure → verify → pack → publish by rename; nothing half-built is ever published."""
    wanted = list(dict.fromkeys([*BASE_PACKAGES, *packages]))
    tar.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{tar.name}.stage-{os.getpid()}-", dir=tar.parent))
    # mkdtemp makes 0700; the tar records "." with it and the container's / would shut out every other user.
    stage.chmod(0o755)
    part = tar.with_name(f".{tar.name}.part-{os.getpid()}-0")
    try:
        debootstrap(stage, release, mirror, wanted)
        configure_for_lxc(stage)
        python_version = verify_rootfs(stage, wanted)
        proc = subprocess.run(["tar", "--numeric-owner", "-C", str(stage), "-cf", str(part), "."],
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise TemplateError(f"packing the template into {part} failed: {_tail(proc.stderr)}")
        os.replace(part, tar)
    finally:
        remove_tree(stage)
        part.unlink(missing_ok=True)
    return {"ok": True, "template": str(tar), "packages": wanted, "python": python_version,
            "bytes": tar.stat().st_size}


def remove_tree(path: Path) -> None:
    """Remove a staging rootfs without ever crossing into a mount a killed debootstrap left inside it."""
    if not path.exists() and not path.is_symlink():
        return
    prefix = str(path.resolve()) + "/"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as fh:
            mounts = [line.split()[4] for line in fh]
    except OSError:
        mounts = []
    for target in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)
    if path.is_dir() and not path.is_symlink():
        subprocess.run(["rm", "-rf", "--one-file-system", "--", str(path)], capture_output=True, check=False)
    else:
        path.unlink(missing_ok=True)


def _owner_alive(name: str) -> bool:
    """The builder PID in a staging name (``.T.stage-PID-xxxx``, ``.T.part-PID-0``) still runs."""
    pid_text = re.split(r"\.(?:stage|part)-", name, maxsplit=1)[-1].split("-", 1)[0]
    if not pid_text.isdigit():
        return False
    if int(pid_text) == os.getpid():
        return True
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_stages(template: Path) -> list[str]:
    """Staging trees and partial tars of this template's builds whose builder is gone (killed mid-build)."""
    removed = []
    if template.parent.is_dir():
        for path in template.parent.iterdir():
            if not path.name.startswith((f".{template.name}.stage-", f".{template.name}.part-")):
                continue
            if _owner_alive(path.name):
                continue
            remove_tree(path)
            removed.append(path.name)
    return removed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    sub = ap.add_subparsers(dest="command", required=True)
    for name in ("check", "build"):
        p = sub.add_parser(name)
        p.add_argument("template", type=Path)
        p.add_argument("--packages", required=True, help="comma-separated Debian package names")
        p.add_argument("--release", default="bookworm")
        p.add_argument("--mirror", default="http://deb.debian.org/debian")
    args = ap.parse_args(argv)
    packages = [p for p in args.packages.split(",") if p]
    if args.command == "check":
        result = check_template(args.template, packages)
        print(json.dumps(result))
        return 0 if result["ok"] else 3
    args.template.parent.mkdir(parents=True, exist_ok=True)
    # One builder at a time in the template cache (two labs built at once share it): the second waits for the first
    # and keeps what it published, instead of a second debootstrap of the same tar. The lock is the cache directory's
    # own (flock on its descriptor), so no lock file is left beside the templates.
    lock = os.open(args.template.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the descriptor closes, or the process dies
        ready = check_template(args.template, packages)
        if ready["ok"]:
            print(json.dumps({**ready, "built_by_another": True}))
            return 0
        removed = remove_stale_stages(args.template)
        try:
            result = build_template(args.template, packages, args.release, args.mirror)
        except TemplateError as exc:
            print(json.dumps({"ok": False, "template": str(args.template), "msg": str(exc)}))
            print(f"template build failed: {exc}", file=sys.stderr)
            return 1
    finally:
        os.close(lock)
    result["removed_stale"] = removed
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
