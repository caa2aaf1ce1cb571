"""A ``pct``-compatible CLI for the local lab: Proxmox's container tool over plain LXC.

Implements the subset of ``pct`` that eagle3-ops uses -- list, status, start, stop, shutdown, create,
destroy, config, set, exec, push, pull -- with Proxmox's argument forms, messages and exit codes:
a failed command prints one line on stderr and exits 255, as PVE::CLIHandler does.

Container state lives where Proxmox keeps it, scaled down to a lab root:
``$EAGLE3_LAB_ROOT/pve/nodes/<node>/lxc/<vmid>.conf`` is the source of truth (the file that takes raw
``lxc.*`` lines), and ``/var/lib/lxc/<vmid>/config`` is generated from it at every start, like
pve-container does. Standard library only: this file and its three modules (pct_config: options and config
files; pct_lxc: the LXC side; pct_args: PVE-style arguments) are installed on the lab host, run as ``pct``.
"""


from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys

try:  # a package module (tests, eagle3_ops), or loose files beside each other (the lab host's bin/)
    from .pct_config import (
        CREATE_ONLY,
        LAB_ROOT,
        LXC_PATH,
        NODE,
        VZTMPL_DIR,
        CtConfig,
        PctError,
        _escape,
        _param_error,
        conf_dir,
        conf_path,
        config_lock,
        load_config,
        node_of,
        write_config,
    )
except ImportError:  # pragma: no cover
    from pct_config import (  # type: ignore[no-redef]
        CREATE_ONLY,
        LAB_ROOT,
        LXC_PATH,
        NODE,
        VZTMPL_DIR,
        CtConfig,
        PctError,
        _escape,
        _param_error,
        conf_dir,
        conf_path,
        config_lock,
        load_config,
        node_of,
        write_config,
    )
try:  # a package module (tests, eagle3_ops), or loose files beside each other (the lab host's bin/)
    from .pct_lxc import (
        _copy_fd,
        _in_container,
        create_file,
        ct_dir,
        init_pid,
        is_running,
        make_rootfs,
        render_lxc_config,
        setup_guest,
    )
except ImportError:  # pragma: no cover
    from pct_lxc import (  # type: ignore[no-redef]
        _copy_fd,
        _in_container,
        create_file,
        ct_dir,
        init_pid,
        is_running,
        make_rootfs,
        render_lxc_config,
        setup_guest,
    )
try:  # a package module (tests, eagle3_ops), or loose files beside each other (the lab host's bin/)
    from .pct_args import Command, parse_args, parse_vmid
except ImportError:  # pragma: no cover
    from pct_args import Command, parse_args, parse_vmid  # type: ignore[no-redef]

# --------------------------------------------------------------------------------------------
# subcommands
# --------------------------------------------------------------------------------------------


def all_vmids() -> list[int]:
    try:
        names = os.listdir(conf_dir())
    except FileNotFoundError:
        return []
    return sorted(int(n[:-5]) for n in names if re.fullmatch(r"\d+\.conf", n))


def cmd_list(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    rows = []
    for vmid in all_vmids():
        conf = load_config(vmid)
        state = "running" if is_running(vmid) else "stopped"
        rows.append((vmid, state, conf.options.get("lock", ""), conf.options.get("hostname", "")))
    if rows:
        fmt = "%-10s %-10s %-12s %-20s"
        print((fmt % ("VMID", "Status", "Lock", "Name")).rstrip())
        for row in rows:
            print((fmt % row).rstrip())
    return 0


def cmd_status(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["status"])
    conf = load_config(vmid)
    pid = init_pid(vmid)
    if opts.get("verbose") == "1":
        stat = {
            "status": "running" if pid else "stopped",
            "vmid": str(vmid),
            "name": conf.options.get("hostname", ""),
            "cpus": conf.options.get("cores", "1"),
            "maxmem": str(int(conf.options.get("memory", "512")) * 1024 * 1024),
            "maxswap": str(int(conf.options.get("swap", "512")) * 1024 * 1024),
            "type": "lxc",
        }
        if pid:
            stat["pid"] = str(pid)
        for key in sorted(stat):
            print(f"{key}: {stat[key]}")
    else:
        print(f"status: {'running' if pid else 'stopped'}")
    return 0


def _start(vmid: int, conf: CtConfig) -> None:
    with open(os.path.join(ct_dir(vmid), "config"), "w", encoding="utf-8") as fh:
        fh.write(render_lxc_config(vmid, conf))
    setup_guest(vmid, conf)
    log = os.path.join(LAB_ROOT, "log", f"lxc-{vmid}.log")
    os.makedirs(os.path.dirname(log), exist_ok=True)
    proc = subprocess.run(
        ["lxc-start", "-P", LXC_PATH, "-n", str(vmid), "-d", "-o", log, "-l", "WARN"],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0 or not _wait_state(vmid, "RUNNING", 30):
        detail = (proc.stderr.strip().splitlines() or ["see " + log])[-1]
        raise PctError(f"startup for container '{vmid}' failed: {detail}")


def _wait_state(vmid: int, state: str, timeout: float) -> bool:
    proc = subprocess.run(
        ["lxc-wait", "-P", LXC_PATH, "-n", str(vmid), "-s", state, "-t", str(int(timeout))],
        capture_output=True,
        check=False,
    )
    return proc.returncode == 0


def cmd_start(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["start"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if is_running(vmid):
            raise PctError(f"CT {vmid} already running")
        _start(vmid, conf)
    return 0


def _stop(vmid: int, timeout: int | None) -> None:
    """lxc-stop: a clean shutdown within timeout when one is given, otherwise an immediate kill."""
    args = ["lxc-stop", "-P", LXC_PATH, "-n", str(vmid)]
    args += ["-t", str(timeout)] if timeout is not None else ["-k"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if is_running(vmid):
        raise PctError(f"stopping CT {vmid} failed: {proc.stderr.strip() or 'still running'}")


def cmd_stop(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["stop"])
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError(f"CT {vmid} not running")
        _stop(vmid, None)
    return 0


def cmd_shutdown(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["shutdown"])
    timeout = int(opts.get("timeout", "60"))
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError(f"CT {vmid} not running")
        args = ["lxc-stop", "-P", LXC_PATH, "-n", str(vmid), "-t", str(timeout)]
        subprocess.run(args, capture_output=True, check=False)
        if is_running(vmid):
            if opts.get("forceStop") == "1":
                _stop(vmid, None)
            else:
                raise PctError(f"shutdown of CT {vmid} timed out after {timeout}s (use --forceStop 1)")
    return 0


def resolve_template(volid: str) -> str:
    if volid.startswith("/"):
        path = volid
    else:
        storage, _unused, rest = volid.partition(":")
        kind, _unused, name = rest.partition("/")
        if storage != "local" or kind != "vztmpl" or not name or "/" in name:
            raise PctError(f"unable to parse volume ID '{volid}'")
        path = os.path.join(VZTMPL_DIR, name)
    if not os.path.isfile(path):
        raise PctError(f"volume '{volid}' does not exist")
    return path


def cmd_create(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["create"])
    with config_lock(vmid):
        # VMIDs are unique across the cluster (every node's containers live under one LXC path here).
        owner = node_of(vmid)
        if owner or os.path.exists(ct_dir(vmid)):
            raise PctError(f"CT {vmid} already exists on node '{owner or NODE}'")
        template = resolve_template(pos[1])
        conf = CtConfig()
        conf.description = opts.pop("description", "")
        start = opts.pop("start", "0") == "1"
        conf.options.update(
            {"arch": "amd64", "ostype": "debian", "memory": "512", "swap": "512", "hostname": f"CT{vmid}"}
        )
        conf.options.update(opts)
        conf.options.setdefault("rootfs", f"lab:subvol-{vmid}-disk-0,size=8G")
        os.makedirs(conf_dir(), exist_ok=True)
        try:
            os.makedirs(ct_dir(vmid))
            print(f"extracting archive '{template}'")
            make_rootfs(vmid, template)
            print("Detected container architecture: amd64")
            write_config(vmid, conf)
        except BaseException:
            shutil.rmtree(ct_dir(vmid), ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(conf_path(vmid))
            raise
        if start:
            _start(vmid, conf)
    return 0


def cmd_destroy(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["destroy"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if conf.options.get("protection") == "1":
            raise PctError(f"can't remove CT {vmid} - protection mode enabled")
        if is_running(vmid):
            if opts.get("force") != "1":
                raise PctError(f"unable to destroy CT {vmid} - container is running")
            _stop(vmid, None)
        if os.path.exists(ct_dir(vmid)):
            shutil.rmtree(ct_dir(vmid))
        os.unlink(conf_path(vmid))
    return 0


def cmd_config(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["config"])
    conf = load_config(vmid)
    options = dict(conf.options)
    if conf.description:
        options["description"] = conf.description
    for key in sorted(options):
        value = options[key]
        if key == "description":
            value = _escape(value)
        print(f"{key}: {value}")
    for key, value in conf.lxc:
        print(f"{key}: {value}")
    return 0


def cmd_set(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["set"])
    delete = [d for d in re.split(r"[,;\s]+", opts.pop("delete", "")) if d]
    for key in list(opts) + delete:
        if key in CREATE_ONLY:
            raise _param_error(key, "unable to modify read-only option", USAGE["set"])
    with config_lock(vmid):
        conf = load_config(vmid)
        if conf.options.get("lock"):
            raise PctError(f"CT {vmid} is locked ({conf.options['lock']})")
        if "description" in opts:
            conf.description = opts.pop("description")
        conf.options.update(opts)
        for key in delete:
            if key == "description":
                conf.description = ""
            conf.options.pop(key, None)
        write_config(vmid, conf)
    return 0


def cmd_exec(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["exec"])
    load_config(vmid)
    if not is_running(vmid):
        raise PctError(f"container '{vmid}' not running!")
    if not extra:
        raise PctError("missing command")
    keep_env = opts.get("keep-env", "1") == "1"
    args = ["lxc-attach", "-P", LXC_PATH, "-n", str(vmid), "--keep-env" if keep_env else "--clear-env", "--", *extra]
    sys.stdout.flush()
    os.execvp(args[0], args)  # noqa: S606 -- pct exec replaces itself with lxc-attach, as Proxmox does
    return 0  # not reached


def cmd_push(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["push"])
    src_path, dest = pos[1], pos[2]
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError("can only push files to a running CT")
        try:
            src = os.open(src_path, os.O_RDONLY)
        except OSError:
            raise PctError(f"failed to open {src_path} for reading") from None

        def work() -> None:
            dst = create_file(dest, opts.get("perms"), opts.get("user"), opts.get("group"))
            _copy_fd(src, dst)
            os.close(dst)

        try:
            return _in_container(vmid, work)
        finally:
            os.close(src)


def cmd_pull(pos: list[str], opts: dict[str, str], extra: list[str]) -> int:
    vmid = parse_vmid(pos[0], USAGE["pull"])
    path, dest = pos[1], pos[2]
    with config_lock(vmid):
        load_config(vmid)
        if not is_running(vmid):
            raise PctError("can only pull files from a running VM")
        dst = create_file(dest, opts.get("perms"), opts.get("user"), opts.get("group"))

        def work() -> None:
            try:
                src = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise PctError(f"failed to open {path}: {exc.strerror}") from None
            _copy_fd(src, dst)

        try:
            return _in_container(vmid, work)
        finally:
            os.close(dst)


USAGE = {
    "list": "pct list",
    "status": "pct status <vmid> [OPTIONS]",
    "start": "pct start <vmid> [OPTIONS]",
    "stop": "pct stop <vmid> [OPTIONS]",
    "shutdown": "pct shutdown <vmid> [OPTIONS]",
    "create": "pct create <vmid> <ostemplate> [OPTIONS]",
    "destroy": "pct destroy <vmid> [OPTIONS]",
    "config": "pct config <vmid> [OPTIONS]",
    "set": "pct set <vmid> [OPTIONS]",
    "exec": "pct exec <vmid> [<extra-args>] [OPTIONS]",
    "push": "pct push <vmid> <file> <destination> [OPTIONS]",
    "pull": "pct pull <vmid> <path> <destination> [OPTIONS]",
}
_FILE_OPTS = {"user": "string", "group": "string", "perms": "string"}
COMMANDS = {
    "list": Command("list", [], USAGE["list"], cmd_list),
    "status": Command("status", ["vmid"], USAGE["status"], cmd_status, {"verbose": "boolean"}),
    "start": Command("start", ["vmid"], USAGE["start"], cmd_start, {"skiplock": "boolean", "debug": "boolean"}),
    "stop": Command("stop", ["vmid"], USAGE["stop"], cmd_stop, {"skiplock": "boolean", "overrule-shutdown": "boolean"}),
    "shutdown": Command(
        "shutdown", ["vmid"], USAGE["shutdown"], cmd_shutdown, {"timeout": "integer", "forceStop": "boolean"}
    ),
    "create": Command(
        "create",
        ["vmid", "ostemplate"],
        USAGE["create"],
        cmd_create,
        {"*": "ct-options", "start": "boolean", "storage": "string", "password": "string"},
    ),
    "destroy": Command(
        "destroy",
        ["vmid"],
        USAGE["destroy"],
        cmd_destroy,
        {"force": "boolean", "purge": "boolean", "destroy-unreferenced-disks": "boolean"},
    ),
    "config": Command("config", ["vmid"], USAGE["config"], cmd_config, {"current": "boolean", "snapshot": "string"}),
    "set": Command(
        "set",
        ["vmid"],
        USAGE["set"],
        cmd_set,
        {"*": "ct-options", "delete": "string", "digest": "string", "revert": "string"},
    ),
    "exec": Command("exec", ["vmid"], USAGE["exec"], cmd_exec, {"keep-env": "boolean"}, extra_args=True),
    "push": Command("push", ["vmid", "file", "destination"], USAGE["push"], cmd_push, dict(_FILE_OPTS)),
    "pull": Command("pull", ["vmid", "path", "destination"], USAGE["pull"], cmd_pull, dict(_FILE_OPTS)),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("help", "-h", "--help"):
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]")
        for usage in USAGE.values():
            print(f"       {usage}")
        return 0 if argv else 255
    name = argv.pop(0)
    cmd = COMMANDS.get(name)
    if cmd is None:
        print(f"ERROR: unknown command 'pct {name}'", file=sys.stderr)
        print("USAGE: pct <COMMAND> [ARGS] [OPTIONS]", file=sys.stderr)
        return 255
    if os.geteuid() != 0:
        print("only root can run this command", file=sys.stderr)
        return 255
    try:
        pos, opts, extra = parse_args(cmd, argv)
        return cmd.handler(pos, opts, extra)
    except PctError as exc:
        print(str(exc).rstrip("\n"), file=sys.stderr)
        if exc.usage:
            print(f"\n{exc.usage}", file=sys.stderr)
        return 255
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 141


if __name__ == "__main__":
    sys.exit(main())
