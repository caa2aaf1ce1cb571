"""Every role's molecule scenario (converge, idempotence, verify) on a real lab container - of the one-node test lab
(tests/lab), in the worker that runs its tests: the scenarios' containers are of the one-node shape (node pve-lab, no
bridge), and the fleet lab's worker is the suite's longest chain. The serving roles' scenarios
(sglang_serve, spec_bench) share one container - same platform, no destroy in their sequence - which this module
removes after them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    LAB_API_PORT,
    LAB_LXC_PATH,
    LAB_PORT,
    LAB_ROOT,
    LAB_STATE,
    PCT,
    ROOT,
    ansible_env,
)

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]
SCENARIOS = sorted(ROOT.glob("roles/*/molecule/default/molecule.yml"))


def _shared_vmids() -> set[int]:
    """Platforms of scenarios whose sequence leaves their container for the next scenario."""
    import yaml

    out = set()
    for path in SCENARIOS:
        conf = yaml.safe_load(path.read_text())
        if "destroy" not in (conf.get("scenario") or {}).get("test_sequence", ["destroy"]):
            out |= {int(p["vmid"]) for p in conf["platforms"]}
    return out


@pytest.fixture(scope="module", autouse=True)
def _remove_shared_containers():
    yield
    for vmid in sorted(_shared_vmids()):
        if (LAB_ROOT / "pve" / "nodes" / "pve-lab" / "lxc" / f"{vmid}.conf").exists():
            subprocess.run([PCT, "destroy", str(vmid), "--force", "1"], capture_output=True, timeout=300,
                           check=False)  # fmt: skip
        shutil.rmtree(LAB_ROOT / "gpu" / str(vmid), ignore_errors=True)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.parents[2].name)
def test_molecule_scenario(lab, scenario: Path, tmp_path):
    role_dir = scenario.parents[2]
    molecule = Path(sys.executable).parent / "molecule"
    env = ansible_env(ANSIBLE_FORCE_COLOR="0", NO_COLOR="1", PY_COLORS="0")
    env.pop("ANSIBLE_CONFIG", None)  # the shared base config sets it for the role
    env.pop("ANSIBLE_INVENTORY", None)  # molecule writes its own
    env.update(
        # Molecule's state of this run only: a state left by an earlier run (a scenario that keeps its container for
        # the next one) would make molecule skip create and prepare for a container the lab no longer has.
        MOLECULE_EPHEMERAL_DIRECTORY=str(tmp_path / "molecule"),
        EAGLE3_LAB_STATE_DIR=str(LAB_STATE),
        EAGLE3_LAB_SSH_PORT=str(LAB_PORT),
        EAGLE3_LAB_API_PORT=str(LAB_API_PORT),
        EAGLE3_LAB_ROOT=str(LAB_ROOT),
        EAGLE3_LAB_LXC_PATH=str(LAB_LXC_PATH),
        EAGLE3_LAB_PCT=PCT,
    )
    base_configs = ["-c", str(ROOT / ".config" / "molecule" / "config.yml"),
                    "-c", str(ROOT / "tests" / "molecule" / "test-lab.yml")]
    proc = subprocess.run([str(molecule), *base_configs, "test"], cwd=role_dir, env=env, capture_output=True,
                          text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
