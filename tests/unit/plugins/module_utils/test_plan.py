"""_plan: the seeds' figures from Kimi-K2.5's config shape (4.6 TB of hidden states, a 16384-token start on a 96 GB
GPU, 10.8 h of training), packing, and the refusals (a disk 1 GB short, a GPU too small for the target, a budget
below the smallest rung)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.modules import module_utils

P = module_utils("_plan")
ROOT = Path(__file__).resolve().parents[4]
KIMI = json.loads((ROOT / "tests/data/targets/kimi-k2.5.config.json").read_text())
SEEDS_SAMPLES = 37312
GB96 = 96 * 1000**3


def seeds_counts() -> list[int]:
    """37,312 token counts (300..3999, mean ~2150) whose bf16 hidden states come to the seeds' 4.6 TB."""
    return [300 + (i * 7919) % 3700 for i in range(SEEDS_SAMPLES)]


def test_kimi_shape_from_its_config():
    t = P.Target.from_config(KIMI)
    assert (t.layers, t.hidden, t.vocab, t.routed_experts, t.dense_layers) == (61, 7168, 163840, 384, 1)
    assert t.mla and t.kv_bytes_per_token(2, 8) == 61 * (512 + 64) * 2  # the latent cache, whole on every rank
    assert abs(sum(t.params().values()) / 1e12 - 1.03) < 0.02  # "1 trillion parameters", 1.026T
    # int4 experts (0.5 byte + a bf16 scale per 32) and the rest in bf16
    assert 560e9 < t.weight_bytes() < 620e9
    dense = P.Target.from_config({"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                                  "num_key_value_heads": 2, "vocab_size": 1000, "intermediate_size": 512})
    assert dense.weight_bytes() == 2 * sum(dense.params().values()) and not dense.mla
    assert dense.kv_bytes_per_token(2, 1) == 2 * 2 * 2 * 64 * 2 and dense.kv_bytes_per_token(2, 4) == 2 * 2 * 1 * 64 * 2


def test_a_config_without_shapes_is_named():
    with pytest.raises(P.PlanError, match="no hidden_size"):
        P.Target.from_config({"num_attention_heads": 4})


def test_the_seeds_plan(tmp_path, monkeypatch):
    counts = seeds_counts()
    t = P.Target.from_config(KIMI)
    monkeypatch.setattr(P, "free_bytes", lambda path: (10 * P.TB, path))
    plan = P.Plan()
    P.plan_hidden_states(plan, t, samples=SEEDS_SAMPLES, mean_tokens=0, token_counts=counts, aux_layers=3,
                         store="file", path=str(tmp_path), shards=1, shared=True, margin=0.05)
    hs = plan.stages["hidden_states"]
    assert abs(hs["bytes"] / 4.6e12 - 1) < 0.10 and hs["verdict"] == "ok"
    assert abs(hs["fp8_bytes"] / hs["bytes"] - 0.5) < 0.01  # "about half the bytes"
    P.plan_training(plan, t, gpu_bytes=GB96, gpus_per_node=4, nodes=1, draft_vocab=32000, ttt_steps=5,
                    total_seq_len=None, max_seq_len=32768, min_seq_len=1024, epochs=5, val_ratio=0.05,
                    samples=SEEDS_SAMPLES, mean_tokens=0, token_counts=counts, tokens_per_second=2450,
                    throughput_source="declared")  # fmt: skip
    tr = plan.stages["training"]
    assert tr["start"] == 16384 and tr["ladder"][:3] == [16384, 12288, 8192]
    assert abs(tr["seconds"] / 3600 / 10.8 - 1) < 0.15  # the seeds' 10.8 h
    assert tr["steps_per_epoch"] == P.steps_per_epoch(counts[: int(SEEDS_SAMPLES * 0.95)], 16384, 4)
    assert 1150 < tr["steps_per_epoch"] < 1300  # ~76M tokens in steps of up to 4 x 16384
    assert not plan.refusals and "declared 2,450 tok/s/GPU" in tr["needs_text"]
    assert any(line.startswith("hidden_states") and "ok" in line for line in plan.table())


def test_the_memory_model_is_the_seeds_calibration():
    d = P.Draft.for_target(P.Target.from_config(KIMI), 32000, 5)
    assert abs(d.memory(8192) / 1e9 - 39.8) < 2  # 8192 tokens used 39.8 GB
    assert d.memory(16384) < GB96 * 0.85 < d.memory(24576)  # 16384 fit, 24576 did not
    assert P.start_budget(d, 192 * 1000**3) >= 32768 and P.start_budget(d, 192 * 1000**3, ceiling=32768) == 32768
    assert P.start_budget(d, 8 * 1000**3) is None
    assert P.ladder_from(20000, 8192) == [20000, 16384, 12288, 8192]


def test_a_disk_one_gb_short_is_refused(tmp_path, monkeypatch):
    t = P.Target.from_config(KIMI)
    counts = seeds_counts()[:1000]
    need = P.hidden_state_bytes(counts, 0, 0, t.hidden, 4, "file")
    for free, refused in ((int(need * 1.05) - 10**9, True), (int(need * 1.05) + 10**9, False)):
        monkeypatch.setattr(P, "free_bytes", lambda path, free=free: (free, path))
        plan = P.Plan()
        P.plan_hidden_states(plan, t, samples=1000, mean_tokens=0, token_counts=counts, aux_layers=3, store="file",
                             path=str(tmp_path / "hs"), shards=1, shared=True, margin=0.05)
        assert bool(plan.refusals) is refused
    monkeypatch.setattr(P, "free_bytes", lambda path: (need // 16, path))
    plan = P.Plan()
    P.plan_hidden_states(plan, t, samples=1000, mean_tokens=0, token_counts=counts, aux_layers=3, store="file",
                         path="/srv/x", shards=2, shared=False, margin=0.05, already=need // 16)
    [msg] = plan.refusals
    assert msg.startswith("Hidden states need ") and " at /srv/x but " in msg and "fp8 store" in msg
    assert "more trainers" in msg and "fp8 store needs" in msg and "and does not fit either" in msg
    assert plan.stages["hidden_states"]["needed"] == -(-need // 2) - need // 16


def test_free_space_is_measured_where_the_path_will_be(tmp_path):
    free, at = P.free_bytes(str(tmp_path / "not" / "yet"))
    assert at == str(tmp_path) and free > 0
    (tmp_path / "a").write_bytes(b"x" * 1000)
    assert P.bytes_under(str(tmp_path)) == 1000


def test_a_server_too_small_for_the_target_is_refused():
    t = P.Target.from_config(KIMI)
    for gib, refused in ((80, True), (141, False)):  # H100 80 GB, H200 141 GB
        plan = P.Plan()
        P.plan_serving(plan, t, gpu_bytes=gib * P.GIB, gpus=8, tp=8, mem_fraction=0.85, context=32768, concurrency=8,
                       kv_dtype_bytes=2, draft_bytes=2 * 10**9, host="srv1")
        assert bool(plan.refusals) is refused, plan.stages["serving"]
    assert plan.refusals == [] and plan.stages["serving"]["tp"] == 8
    plan = P.Plan()
    P.plan_serving(plan, t, gpu_bytes=80 * P.GIB, gpus=8, tp=8, mem_fraction=0.85, context=32768, concurrency=8,
                   kv_dtype_bytes=2, draft_bytes=2 * 10**9, host="srv1")
    assert plan.refusals[0].startswith("srv1's GPUs cannot hold what it would load: ")
    plan = P.Plan()
    P.plan_serving(plan, t, gpu_bytes=141 * P.GIB, gpus=4, tp=8, mem_fraction=0.85, context=4096, concurrency=1,
                   kv_dtype_bytes=2, draft_bytes=0, host="srv2")
    assert "tensor parallelism 8" in plan.refusals[0]


def test_a_gpu_below_the_smallest_rung_is_refused():
    plan = P.Plan()
    P.plan_training(plan, P.Target.from_config(KIMI), gpu_bytes=8 * P.GIB, gpus_per_node=1, nodes=1, draft_vocab=32000,
                    ttt_steps=5, total_seq_len=None, max_seq_len=32768, min_seq_len=1024, epochs=1, val_ratio=0.1,
                    samples=10, mean_tokens=100, token_counts=None, tokens_per_second=1, throughput_source="declared")
    assert plan.stages["training"]["verdict"] == "REFUSED" and "smallest budget (1024 tokens" in plan.refusals[0]


def test_steps_are_speculators_multipack_steps():
    # each step: the most next samples longest-first packing fits into one row of the budget per rank
    assert P.steps_per_epoch([10, 10, 10], 30, 1) == 1
    assert P.steps_per_epoch([20, 20, 10, 10], 30, 1) in (2, 3)  # the order decides: 20+10 | 20+10, or 20 | 20+10 | 10
    assert P.steps_per_epoch([20, 20, 10, 10], 30, 2) == 1  # 20+10 on each of two ranks
    assert P.steps_per_epoch([100, 5], 30, 1) == 2  # the long one truncated to a row of its own
    assert P.steps_per_epoch([10, 10, 10], 30, 4) == 0  # fewer samples than ranks: dropped
    assert P.steps_per_epoch([1000] * 37312, 4096, 1) == 37312 // 4  # four to a row
