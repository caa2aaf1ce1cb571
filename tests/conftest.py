"""Shared fixtures: the repository, the lab (brought up once per session), and runners."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from eagle3_ops.recap import recap  # the tests import it from here too
from tests.modules import init_collection_loader

# One OpenMP thread in the test processes and what they start on the controller (SGLang's judge, the reference
# engine's checks, the trainer's unit tests), as in the lab's containers: the workers run beside each other on few
# cores, and PyTorch's default of a spinning thread per core makes two such processes several times slower together
# than one after the other (benchmarks/bench_threads.py). A value the caller set is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("EAGLE3_SHARED_DIR") or ROOT.parent / "shared")
PVE_SCHEMA = SHARED / "reference" / "pve-9.1.3-api-schema.json"


def flat(text: str) -> str:
    """Ansible's output with its line wrapping undone."""
    return " ".join(text.split())


def pve_schema() -> dict:
    """The published PVE 9.1.3 API schema (../shared, or EAGLE3_SHARED_DIR). Missing, the test skips saying why -
    and fails instead under EAGLE3_REQUIRE_SHARED=1, which .ci/run sets, so CI never passes without it."""
    import json

    if not PVE_SCHEMA.exists():
        why = (f"{PVE_SCHEMA} is missing: the PVE API schema tests need ../shared beside the checkout "
               "(or EAGLE3_SHARED_DIR)")  # fmt: skip
        if os.environ.get("EAGLE3_REQUIRE_SHARED") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return json.loads(PVE_SCHEMA.read_text())
# The tests run against a lab of their own (tests/lab: the lab inventory with its state moved aside), so
# the test command never touches the user's lab, its trained drafter or its served model.
TEST_INVENTORY = ROOT / "tests" / "lab"
LAB_STATE = ROOT / ".lab-test"
LAB_PORT = 10122
LAB_API_PORT = 8106
LAB_ROOT = Path("/var/lib/eagle3-lab-test")
LAB_LXC_PATH = LAB_ROOT / "lxc"
PCT = str(LAB_ROOT / "sbin" / "pct")
# The fleet tests' own lab (tests/lab-fleet/group_vars/all/10-fleet-test-lab.yml): two nodes, hops on FLEET_PORT and
# the next port, its own root, keys, pct and bridge; the molecule scenarios run on it too.
FLEET_INVENTORY = ROOT / "tests" / "lab-fleet"
FLEET_STATE = ROOT / ".lab-fleet-test"
FLEET_ROOT = Path("/var/lib/eagle3-lab-fleettest")
FLEET_LXC_PATH = FLEET_ROOT / "lxc"
FLEET_PCT = str(FLEET_ROOT / "sbin" / "pct")
FLEET_PORT = 10132
FLEET_API_PORT = 8116


# Ansible's controller scratch (ansible-local-<pid>, normally ~/.ansible/tmp) in a directory of the test run's own:
# the tests kill Ansible processes on purpose (a module crashed mid-rewrite, a play whose node dies), and a killed
# process cannot remove its scratch. Made by the first process (xdist's workers inherit it) and removed by it at the
# end; a value the caller set is kept, and left alone.
_OWN_LOCAL_TEMP = None if os.environ.get("ANSIBLE_LOCAL_TEMP") else tempfile.mkdtemp(prefix="eagle3-tests-ansible-")
if _OWN_LOCAL_TEMP:
    os.environ["ANSIBLE_LOCAL_TEMP"] = _OWN_LOCAL_TEMP

# In-process imports of eagle3.ops (module_utils in module tests, plugins through the loaders) go through
# ansible's own collection loader, as in a play.
init_collection_loader()

# The user's lab (inventory/lab): the tests check they leave it as they found it.
USER_LAB_ROOT = Path("/var/lib/eagle3-lab")


def serving_keys(inventory: Path = TEST_INVENTORY) -> dict[str, str]:
    """The serving plane's keys (api, admin) that a deploy generated for ``inventory``'s lab (eagle3_common's keys),
    in the lab's state directory (eagle3_keys_file in its group_vars)."""
    import yaml

    state = FLEET_STATE if inventory == FLEET_INVENTORY else LAB_STATE
    return yaml.safe_load((state / "eagle3-keys.yml").read_text())


def record_figure(name: str, **values: object) -> None:
    """A measured figure the notes quote (artifacts/test/figures.jsonl, one JSON object a line): what the test saw."""
    out = ROOT / "artifacts" / "test" / "figures.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps({"figure": name, "at": time.strftime("%Y-%m-%dT%H:%M:%S"), **values}) + "\n")


def ansible_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "ANSIBLE_INVENTORY": str(TEST_INVENTORY),
            "ANSIBLE_FORCE_COLOR": "0",
            "ANSIBLE_NOCOLOR": "1",
            "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
        }
    )
    env.update(extra)
    return env


def run_playbook(
    playbook: str | Path, *args: str, check: bool = True, env: dict[str, str] | None = None, timeout: int = 1200,
) -> subprocess.CompletedProcess[str]:
    """ansible-playbook from the repository root, as a user runs it; JSON-lines-free plain output. The one-node lab
    and the fleet's lab are built at once in two workers, as two users' labs may be: lab_host serialises the writers
    of what they share (the template, the wheelhouse, dpkg)."""
    cmd = [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), *args]
    started = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env or ansible_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    keep = os.environ.get("EAGLE3_TEST_PLAYBOOK_LOG")  # a file: every playbook's command, time and output
    if keep:
        with open(keep, "a", encoding="utf-8") as log:
            log.write(f"\n=== {os.environ.get('PYTEST_CURRENT_TEST', '')}\n=== {' '.join(cmd)}\n"
                      f"=== rc {proc.returncode} in {time.monotonic() - started:.1f} s\n{proc.stdout}")  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
        )
    return proc


def hop(*remote: str, input_bytes: bytes | None = None, timeout: int = 120) -> subprocess.CompletedProcess[bytes]:
    """Run a command on the lab hypervisor through its ssh hop, host key checked."""
    cmd = [
        "ssh",
        "-p",
        str(LAB_PORT),
        "-i",
        str(LAB_STATE / "id_ed25519"),
        "-o",
        f"UserKnownHostsFile={LAB_STATE / 'known_hosts'}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "root@127.0.0.1",
        *remote,
    ]
    return subprocess.run(cmd, input=input_bytes, capture_output=True, timeout=timeout, check=False)


def pct(*args: str, check: bool = True, timeout: int = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([PCT, *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"pct {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


TRAINER_PYTHON = "/opt/eagle3-ops/venv/bin/python"  # the payload runtime (gpu_runtime), on trainers
SERVER_PYTHON = "/opt/eagle3-ops/sglang/bin/python"  # SGLang's environment, a server's only Python runtime


def payload(vmid: int, *argv: str, env: tuple[str, ...] = (), timeout: int = 900, python: str = TRAINER_PYTHON) -> str:
    """A payload run by hand in a lab container, with the payloads on the path (``pct exec`` brings only the
    container's own environment: the lab's lxc.environment lines, one OpenMP thread per process)."""
    return pct("exec", str(vmid), "--", "env", "PYTHONPATH=/opt/eagle3-ops/payloads", *env,
               python, *argv, timeout=timeout).stdout  # fmt: skip


def smi(vmid: int, query: str = "index,memory.used") -> list[list[str]]:
    out = pct("exec", str(vmid), "--", "nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits").stdout
    return [line.split(", ") for line in out.splitlines()]


# Kills, inside a container, exactly the processes whose environment carries one test's marker (every process
# of a job inherits it from the launch), instead of matching command lines.
_KILL_MARKED = """
import os, signal, sys
marker = ("EAGLE3_TEST_JOB=" + sys.argv[1]).encode()
spared = {os.getpid(), *(int(pid) for pid in sys.argv[2:])}
for entry in os.listdir("/proc"):
    if entry.isdigit() and int(entry) not in spared:
        try:
            with open("/proc/" + entry + "/environ", "rb") as fh:
                if marker in fh.read().split(b"\\0"):
                    os.kill(int(entry), signal.SIGKILL)
        except OSError:
            pass
"""


def lab_workload(vmid: int | str, marker: str, *args: str) -> dict[str, int]:
    """Start lab-workload in a container with this test's marker in the environment of all its processes."""
    out = pct("exec", str(vmid), "--", "env", f"EAGLE3_TEST_JOB={marker}", "lab-workload", *args).stdout
    return json.loads(out)


def stop_marked(vmid: int | str, marker: str, *spare: int) -> None:
    """SIGKILL this test's processes in the container, but the PIDs in spare."""
    pct("exec", str(vmid), "--", "python3", "-c", _KILL_MARKED, marker, *map(str, spare), check=False)


@pytest.fixture
def job_marker() -> str:
    import uuid

    return uuid.uuid4().hex


def lab_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the lab needs root"
    if not shutil.which("lxc-start"):
        return "LXC is not installed (apt-get install lxc)"
    return None


@pytest.fixture(scope="session")
def lab() -> Iterator[dict[str, object]]:
    """The test suite's own lab, up (idempotently) for the whole session; taken down by test_zz_lab_down."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    started = time.monotonic()
    proc = run_playbook("lab.yml")
    _BRINGUP_PENDING.append(time.monotonic() - started)
    yield {"recap": recap(proc.stdout), "output": proc.stdout}


@pytest.fixture(scope="session")
def trained(lab) -> subprocess.CompletedProcess[str]:
    """The main job's training (train.yml) in the test lab, once per session: test_pipeline reads what each stage
    said, test_deploy serves the drafter. Forced past the fingerprint, so that every stage says what it found even
    when an earlier session of the same lab trained already."""
    proc = run_playbook(ROOT / "train.yml", "-e", "eagle3_force=true", timeout=1800)
    assert recap(proc.stdout)["ct129"]["failed"] == 0, proc.stdout[-3000:]
    return proc


def close_ssh_masters(ports) -> None:
    """Ansible's ControlPersist masters would keep a session to a stopped hop alive; a new run opens new ones. Only
    those of PORTS: the other lab's tests use theirs at the same time (ansible names a master after a hash of host,
    port and user)."""
    import hashlib

    cp = os.path.expanduser("~/.ansible/cp")
    for port in ports:
        name = hashlib.sha1(f"127.0.0.1-{port}-root".encode()).hexdigest()[:10]  # noqa: S324 -- ansible's own naming
        if os.path.exists(os.path.join(cp, name)):
            subprocess.run(["ssh", "-o", f"ControlPath={os.path.join(cp, name)}", "-O", "exit", "x"],
                           capture_output=True, timeout=10, check=False)  # fmt: skip


@pytest.fixture(scope="session")
def fleet_lab() -> Iterator[dict[str, object]]:
    """The fleet tests' own lab (tests/lab-fleet), up for the session of the worker that runs its tests, and taken
    down when that session ends."""
    reason = lab_unavailable()
    if reason:
        pytest.skip(reason)
    env = ansible_env(ANSIBLE_INVENTORY=str(FLEET_INVENTORY))
    started = time.monotonic()
    proc = run_playbook("lab.yml", env=env, timeout=1500)
    _BRINGUP_PENDING.append(time.monotonic() - started)
    yield {"recap": recap(proc.stdout), "output": proc.stdout}
    close_ssh_masters([FLEET_PORT, FLEET_PORT + 1])
    down = run_playbook("lab.yml", "-e", "lab_state=absent", env=env, timeout=900, check=False)
    assert down.returncode == 0 and not FLEET_ROOT.exists(), down.stdout[-4000:]


def user_lab_snapshot() -> dict[str, object]:
    """What the tests must leave as they found it: the user's lab containers, pct, hop and shared storage."""
    snap: dict[str, object] = {"root": USER_LAB_ROOT.exists()}
    if not USER_LAB_ROOT.exists():
        return snap
    confs = USER_LAB_ROOT / "pve" / "nodes"
    snap["containers"] = sorted(str(p.relative_to(confs)) for p in confs.glob("*/lxc/*.conf"))
    running = subprocess.run(["lxc-ls", "-P", "/var/lib/lxc", "--running", "-1"], capture_output=True, text=True,
                             check=False)
    snap["running"] = sorted(running.stdout.split())
    pid = USER_LAB_ROOT / "sshd" / "sshd.pid"
    snap["sshd"] = pid.read_text().strip() if pid.exists() else None
    share = USER_LAB_ROOT / "share"
    snap["share"] = sorted(
        (str(p.relative_to(share)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in share.rglob("*") if p.is_file() and not p.is_symlink()
    ) if share.exists() else []
    return snap


_USER_LAB_AT_START: dict[str, object] = {}
# A lab fixture's bring-up time (seconds it appends to _BRINGUP_PENDING), as a user property of the test whose setup
# brought the lab up, so that the controller under pytest-xdist sees it too.
BRINGUP = "eagle3_lab_bringup_s"
_BRINGUP_PENDING: list[float] = []
# Seconds per stage of the test command (the time of its tests; under pytest-xdist two run at once), printed at
# the end and written for .ci/run's summary.
_STAGE_SECONDS: dict[str, float] = {"unit": 0.0, "sglang": 0.0, "lab": 0.0, "pipeline": 0.0, "fleet": 0.0}
_SESSION_STARTED = [time.monotonic()]


def pytest_unconfigure(config: pytest.Config) -> None:
    if _OWN_LOCAL_TEMP:
        shutil.rmtree(_OWN_LOCAL_TEMP, ignore_errors=True)


def pytest_sessionstart(session: pytest.Session) -> None:
    _USER_LAB_AT_START.update(user_lab_snapshot())


# The test command runs in three pytest-xdist workers (-n 3; pyproject.toml adds --dist loadgroup and
# --no-loadscope-reorder): each lab's test files carry its xdist_group mark ("lab": the one-node test lab, tests/lab;
# "fleet": the fleet lab, tests/lab-fleet, which the molecule scenarios use too), so one worker runs each lab's tests
# in order, and the third takes what needs no lab (SGLang's judging, the unit tests) while the two labs' tests run.
# Collection checks that each test's lab agrees with its file's mark. (pytest-xdist's loadgroup needs a pytest before
# 9.2, which derives node ids from structured ids that xdist's group suffix does not reach: pytest-xdist#1386.)
LAB_GROUPS = ("lab", "fleet")


def lab_group(item: pytest.Item) -> str | None:
    """The lab whose worker runs this test: "lab", "fleet", or None (any worker)."""
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name"))


def _lab_used(item: pytest.Item) -> str | None:
    if "fleet_lab" in item.fixturenames:
        return "fleet"
    if "lab" in item.fixturenames or item.get_closest_marker("lab_teardown"):
        return "lab"
    return None


def _order(item: pytest.Item) -> tuple[int, bool]:
    """The one-node lab's tests first (its lab_teardown tests last of them); then, with three workers or more, the
    fleet lab's, which the second worker starts at once (its tests are the longest chain), and SGLang's judging in the
    third; with two, SGLang's judging before the fleet's, which the second worker runs while the one-node lab comes up;
    then the rest, which a worker takes once its lab's tests are done. Every worker
    sorts alike (pytest-xdist runs only when they collect the same order): each reads the one worker count."""
    group = lab_group(item)
    fleet_first = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) >= 3
    judging = item.path.name == "test_sglang_judge.py"
    ranks = {"lab": 0, "fleet": 1 if fleet_first else 2, None: (2 if fleet_first else 1) if judging else 3}
    rank = ranks[group]
    return rank, item.get_closest_marker("lab_teardown") is not None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used, group = _lab_used(item), lab_group(item)
        if group not in (None, *LAB_GROUPS):
            raise pytest.UsageError(f"{item.nodeid} is in the xdist group {group!r}: the groups are the labs "
                                    f"{LAB_GROUPS}")  # fmt: skip
        if used and used != group:
            raise pytest.UsageError(f"{item.nodeid} uses the {used} lab, but its file runs with the {group or 'no'} "
                                    f"lab's tests: mark the file pytest.mark.xdist_group({used!r})")  # fmt: skip
    items.sort(key=_order)


def _stage_of(report: pytest.TestReport) -> str:
    """The stage a test's time counts to: unit, SGLang's judging, the fleet lab's, the pipeline's (files marked
    pipeline: they train or serve for real) or the one-node lab's."""
    path = Path(report.nodeid.split("::")[0])
    if "unit" in path.parts:
        return "unit"
    if path.name.startswith("test_sglang"):
        return "sglang"  # SGLang itself judging, in .venv-sglang
    if "pipeline" in report.keywords:
        return "pipeline"
    return "fleet" if path.name == "test_fleet.py" else "lab"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item):
    yield
    while _BRINGUP_PENDING:
        item.user_properties.append((BRINGUP, _BRINGUP_PENDING.pop()))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Each phase's time to its stage (in the controller, for the reports of every worker); a lab's bring-up, in the
    setup of whichever test first asks for it, counts as "lab". With EAGLE3_TEST_TIMELINE set, each phase is also a
    line of that file - worker, start and stop (epoch seconds), phase, test - to see when each worker was busy."""
    bringup = sum(value for key, value in report.user_properties if key == BRINGUP) if report.when == "setup" else 0.0
    _STAGE_SECONDS[_stage_of(report)] += report.duration - bringup
    _STAGE_SECONDS["lab"] += bringup
    timeline = os.environ.get("EAGLE3_TEST_TIMELINE")
    if timeline and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller's copy of each worker's report
        worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", "main")
        with open(timeline, "a", encoding="utf-8") as out:
            out.write(f"{worker} {report.start:.1f} {report.stop:.1f} {report.when} {report.nodeid}\n")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: the controller sums every worker's reports
    total = sum(_STAGE_SECONDS.values())
    wall = time.monotonic() - _SESSION_STARTED[0]
    lines = [f"{stage:<9} {seconds / 60:6.1f} min" for stage, seconds in _STAGE_SECONDS.items()]
    terminalreporter.write_sep("-", f"test stages (test time {total / 60:.1f} min, wall time {wall / 60:.1f} min)")
    for line in lines:
        terminalreporter.write_line(line)
    out = os.environ.get("EAGLE3_STAGE_TIMES")
    if out:
        Path(out).write_text(json.dumps(_STAGE_SECONDS))


@pytest.fixture
def json_loads():
    return json.loads
