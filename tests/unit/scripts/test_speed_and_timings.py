"""scripts/speed.py (the machine's speed factor .ci/run prints), scripts/cpu_split.py (where the tests' CPU went, which
.ci/run prints too) and scripts/timings.py (docs/timings.md from the benchmarks' records): loaded as the files they
are."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

from tests.modules import ROOT


def script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"eagle3_script_{name}", ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_speed_factor_is_time_over_the_reference_and_leaves_no_file(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch):  # fmt: skip
    speed = script("speed")
    monkeypatch.setattr(speed, "CPU_LOOPS", 1000)
    monkeypatch.setattr(speed, "HASH_BYTES", 1 << 20)
    monkeypatch.setattr(speed, "DISK_BYTES", 2 << 20)
    monkeypatch.setattr(speed, "SMALL_FILES", 3)
    monkeypatch.setattr(speed, "REFERENCE", {"cpu": 0.5, "disk": 0.25})
    got = speed.measure(str(tmp_path), runs=1)
    assert got["cpu_factor"] == round(got["cpu_s"] / 0.5, 2) and got["disk_factor"] == round(got["disk_s"] / 0.25, 2)
    assert got["cpu_s"] > 0 and got["disk_s"] > 0 and got["cores"] >= 1
    assert list(tmp_path.iterdir()) == []


def test_timings_renders_newest_first_with_short_cells(tmp_path: Path):
    timings = script("timings")
    runs = (("2026-12-01 10:00", "aaa", 0.123), ("2026-12-02 10:00", "bbb", 12.34))
    rows = [{"bench": "bench_x", "date": d, "checkout": c, "cores": 2, "cpu": "cpu", "note": "n|o",
             "rows": [{"K": 1, "s": v}]} for d, c, v in runs]  # fmt: skip
    (tmp_path / "bench_x.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = timings.render(tmp_path)
    lines = [line for line in text.splitlines() if line.startswith("| 2026")]
    assert lines == ["| 2026-12-02 10:00 | bbb | 2 | 1 | 12.3 | n/o |",
                     "| 2026-12-01 10:00 | aaa | 2 | 1 | 0.12 | n/o |"]


def test_timings_names_a_broken_record(tmp_path: Path):
    (tmp_path / "bench_x.jsonl").write_text("{not json\n")
    with pytest.raises(SystemExit, match=r"bench_x.jsonl:1 is not JSON"):
        script("timings").render(tmp_path)


def test_the_cpu_split_counts_containers_started_later_and_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    split = script("cpu_split")
    (tmp_path / "cpuacct.usage").write_text("0")
    monkeypatch.setattr(split, "V1", tmp_path)
    machine = iter([100.0, 130.0, 160.0, 190.0])
    monkeypatch.setattr(split, "machine_seconds", lambda: next(machine))

    def usage(**seconds: float) -> None:
        for old in tmp_path.glob("lxc.payload.*"):
            (old / "cpuacct.usage").unlink()
            old.rmdir()
        for name, value in seconds.items():
            (tmp_path / f"lxc.payload.{name}").mkdir()
            (tmp_path / f"lxc.payload.{name}" / "cpuacct.usage").write_text(str(int(value * 1e9)))

    usage(a=50)  # running before: only what it uses from now counts
    sampler = split.Sampler()
    usage(a=55, b=4)  # b started since: all of it
    sampler.sample()
    usage(a=60, b=1)  # b started again (its counter went down): its new run adds
    sampler.sample()
    usage(b=3)  # a destroyed: what it had stays counted
    sampler.sample()
    result = sampler.result()
    assert result["machine_cpu_s"] == 90.0
    assert result["containers_cpu_s"] == {"a": 10.0, "b": 7.0}
    result["wall_s"], result["cores"] = 60.0, 2
    assert split.show(result) == ("CPU during the tests: 75 % busy of 2 cores over 1.0 min; 1.5 CPU-min in all: the "
                                  "containers 0.3 (19 %), the controller side (Ansible, pytest, hops) 1.2")  # fmt: skip
    assert split.show({"wall_s": 1.0, "cores": 2, "machine_cpu_s": None, "containers_cpu_s": {}}).endswith(
        "not measured (no /proc/stat)")
