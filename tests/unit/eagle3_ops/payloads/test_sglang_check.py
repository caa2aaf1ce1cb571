"""The SGLang check payload's pure parts: the sgl_kernel stand-in and bench_serving's prompt file."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest

from eagle3_ops.payloads.sglang_check import bench_serving, cpu_shims


@pytest.fixture
def no_kernel():
    saved = list(sys.meta_path)
    yield
    sys.meta_path[:] = saved
    for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
        del sys.modules[name]


def test_the_kernel_stand_in_imports_but_refuses_to_compute(no_kernel):
    assert cpu_shims.sgl_kernel_stand_in() is True  # no sgl_kernel in this environment
    kernel = importlib.import_module("sgl_kernel")
    from_sub = importlib.import_module("sgl_kernel.elementwise")
    assert repr(kernel.scalar_types.uint4b8) == "<unavailable sgl_kernel.scalar_types.uint4b8>"
    with pytest.raises(RuntimeError, match=r"sgl_kernel.rmsnorm has no CPU build"):
        kernel.rmsnorm(1, 2)
    with pytest.raises(RuntimeError, match=r"sgl_kernel.silu_and_mul has no CPU build"):
        from_sub.silu_and_mul()
    with pytest.raises(AttributeError):
        kernel.__wrapped__  # noqa: B018 - dunder lookups must fail, or inspect/pickle get confused
    assert cpu_shims.sgl_kernel_stand_in() is True and sum(
        isinstance(f, cpu_shims._NoKernelFinder) for f in sys.meta_path) == 1  # fmt: skip


def test_prompts_become_a_sharegpt_file(tmp_path):
    prompts = tmp_path / "p.jsonl"
    chat = {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "How?"}]}
    prompts.write_text(json.dumps({"id": "a", "prompt": "Why?"}) + "\n\n" + json.dumps(chat) + "\n")
    path = Path(bench_serving.sharegpt_file(str(prompts)))
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    finally:
        path.unlink()
    assert [r["conversations"][0]["value"] for r in rows] == ["Why?", "How?"]
    assert all(r["conversations"][1]["from"] == "gpt" for r in rows) and rows[0]["id"] == "a"


def test_a_prompt_row_without_text_is_named(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": 1, "messages": []}) + "\n")
    with pytest.raises(SystemExit, match="line 1 has neither 'prompt' nor a user message"):
        bench_serving.sharegpt_file(str(prompts))


def test_each_concurrency_level_is_one_run_of_bench_serving_in_one_process(monkeypatch, tmp_path):
    runs: list[list[str]] = []
    monkeypatch.setattr(bench_serving, "run_bench_serving", lambda args: runs.append(args) or 0)
    prefix = str(tmp_path / "out-")
    assert bench_serving.main(["--concurrency=1", "--concurrency", "4", "--output-prefix", prefix, "--",
                               "--backend", "sglang"]) == 0  # fmt: skip
    assert runs == [["--backend", "sglang", "--max-concurrency", "1", "--output-file", f"{prefix}1.jsonl"],
                    ["--backend", "sglang", "--max-concurrency", "4", "--output-file", f"{prefix}4.jsonl"]]  # fmt: skip
    # a level that fails stops the rest, with its exit code
    runs.clear()
    monkeypatch.setattr(bench_serving, "run_bench_serving", lambda args: runs.append(args) or 3)
    assert bench_serving.main(["--concurrency=1", "--concurrency=4", "--output-prefix", prefix, "--"]) == 3
    assert len(runs) == 1
    # without levels: one run with the arguments as given
    runs.clear()
    assert bench_serving.main(["--", "--max-concurrency", "2"]) == 3 and runs == [["--max-concurrency", "2"]]
    with pytest.raises(SystemExit):
        bench_serving.main(["--concurrency=1", "--"])  # no --output-prefix
