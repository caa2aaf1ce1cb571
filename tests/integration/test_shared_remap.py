"""Two containers on the lab's shared storage (/srv/eagle3, as a fleet's NFS) remap one checkpoint at once: the
second waits for the first's lock and then finds nothing to do; the tensors are the original ones."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tests.conftest import LAB_ROOT, ROOT, ansible_env
from tests.unit.plugins.modules.test_safetensors_remap import drafter_tensors

pytestmark = [pytest.mark.lab, pytest.mark.xdist_group("lab")]

SHARE = LAB_ROOT / "share"
MOUNT = "/srv/eagle3"
PLAYBOOK = ROOT / "tests" / "integration" / "playbooks" / "remap.yml"


def _start(host: str, path: str, *extra: str) -> subprocess.Popen[str]:
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), str(PLAYBOOK), "-l", host, "-e", f"remap_path={path}",
           *extra]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, env=ansible_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)  # fmt: skip


def _result(proc: subprocess.Popen[str]) -> dict:
    out, _unused = proc.communicate(timeout=300)
    flat = " ".join(out.split())
    assert "REMAP " in flat, out[-3000:]
    text = flat.split("REMAP ", 1)[1]
    return json.JSONDecoder().raw_decode(text)[0]


DROP = ("-e", '{"remap_drop": ["^t2d$"]}')


@pytest.mark.parametrize(("point", "extra"), [("journal-written", ()), ("rewrite-data-copied", DROP)],
                         ids=["in_place", "rewrite"])  # fmt: skip
def test_two_containers_remapping_one_shared_checkpoint_are_serialised(lab, point, extra):
    tag = uuid.uuid4().hex[:8]
    directory = SHARE / "races" / tag
    directory.mkdir(parents=True)
    target = directory / "model.safetensors"
    original = drafter_tensors()
    save_file(original, str(target))
    target.chmod(0o644)
    gate = f"{MOUNT}/races/{tag}/gate"
    try:
        first = _start("ct129", f"{MOUNT}/races/{tag}/model.safetensors", "-e", f"remap_hold={point}:{gate}", *extra)
        deadline = time.monotonic() + 120
        while not (directory / "gate.reached").exists():
            assert first.poll() is None, first.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "the first container never reached its hold point"
            time.sleep(0.1)
        second = _start("ct130", f"{MOUNT}/races/{tag}/model.safetensors", *extra)
        time.sleep(4)  # long enough for the second container's run to reach the lock
        assert second.poll() is None, "the second container did not wait for the first's lock"
        (directory / "gate").touch()
        one, two = _result(first), _result(second)
        assert one["changed"] is True and not one.get("failed"), one.get("msg")
        assert two["changed"] is False and not two.get("failed"), two.get("msg")
        after = load_file(str(target))
        expected = {k.replace("layers.0.", "midlayer.", 1): v for k, v in original.items()
                    if not (extra and k == "t2d")}  # fmt: skip
        assert sorted(after) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_array_equal(after[name], value)
        leftovers = sorted(p.name for p in directory.iterdir() if p.name not in ("gate", "gate.reached"))
        assert leftovers == ["model.safetensors"]
    finally:
        for p in sorted(directory.iterdir()):
            p.unlink()
        directory.rmdir()
