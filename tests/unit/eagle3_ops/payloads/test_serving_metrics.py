"""The reference engine's live gauges are SGLang's: sglang:spec_accept_length and sglang:gen_throughput over one log
interval of decode forwards (--decode-log-interval, 40 by default), published when the interval ends and counted
afresh after it (sglang/srt/managers/scheduler_components/metrics_reporter.py), read back by eagle3_status's parser.
Run in SGLang's environment (the engine imports torch)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.modules import ROOT, module_utils

SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"

SCRIPT = r"""
import json
from serving.engine import Stats
s = Stats(log_interval=40)
out = {"before": dict(s.gauges)}
# 30 verify forwards accepting 2 drafts each (3 tokens per forward), then 20 accepting none: the interval closes at 50
s.count_interval(generated=90, steps=30, accepted=60, seconds=1.0, now=101.0)
out["open"] = dict(s.gauges)
s.count_interval(generated=20, steps=20, accepted=0, seconds=1.0, now=102.0)
out["first"] = dict(s.gauges)
# the next interval counts afresh: 40 forwards at 1 token each
s.count_interval(generated=40, steps=40, accepted=0, seconds=4.0, now=106.0)
out["second"] = dict(s.gauges)
# without a draft, a decode step is a forward and the accept length is 0, as SGLang's gauge without speculation
plain = Stats(log_interval=40)
plain.count_interval(generated=50, steps=0, accepted=0, seconds=2.0, now=2.0)
out["plain"] = dict(plain.gauges)
print(json.dumps(out))
"""


def test_the_gauges_cover_one_interval_then_start_afresh():
    if not SGLANG_PYTHON.exists():
        pytest.fail(f"{SGLANG_PYTHON} is missing: run scripts/bootstrap.sh")
    proc = subprocess.run([str(SGLANG_PYTHON), "-c", SCRIPT], cwd=ROOT / "eagle3_ops" / "payloads",
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == {} and got["open"] == {}  # nothing published before an interval ends
    assert got["first"] == {"gen_throughput": 110 / 2.0, "spec_accept_length": (90 + 20) / 50}
    assert got["second"] == {"gen_throughput": 40 / 4.0, "spec_accept_length": 1.0}
    assert got["plain"] == {"gen_throughput": 25.0, "spec_accept_length": 0.0}


def test_eagle3_status_reads_the_engines_page():
    status = module_utils("_status")
    page = ('# TYPE sglang:spec_accept_length gauge\n'
            'sglang:spec_accept_length{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 2.2\n'
            'sglang:gen_throughput{model_name="m",engine_type="unified",tp_rank="0",pp_rank="0"} 55.0\n')
    assert status.live_figures(page) == {"live_accept_length": 2.2, "tokens_per_s": 55.0}


COLLECTOR = r"""
import json, sys
from sglang_check import cpu_shims
cpu_shims.torchvision_operator_schemas()  # what the payload's judge does before importing SGLang on a CPU host
from prometheus_client import REGISTRY, generate_latest
from sglang.srt import runtime_context
from sglang.srt.server_args import ServerArgs
from sglang.srt.observability.metrics_collector import TokenizerMetricsCollector
# the tokenizer process's config, as SGLang's entry publishes it (a config-only target: nothing is loaded)
runtime_context.publish(ServerArgs(model_path=sys.argv[1], device="cpu", enable_metrics=True), role="tokenizer")
labels = {"model_name": "m"}
c = TokenizerMetricsCollector(labels=labels)
# SGLang's tokenizer manager, per finished request: 24 tokens in 10 verify forwards, then 30 in 10 (streamed)
c.observe_one_finished_request(labels, 12, 24, 0, 0.5, False, spec_verify_ct=10, is_streaming=False)
c.observe_one_finished_request(labels, 12, 30, 0, 0.5, False, spec_verify_ct=10, is_streaming=True)
print(json.dumps(generate_latest(REGISTRY).decode()))
"""


def test_the_canary_reads_sglangs_own_counters_and_the_reference_engine_writes_the_same(tmp_path):
    """SGLang 0.5.23's TokenizerMetricsCollector, as its tokenizer manager calls it, produces the page the canary
    parses: tokens per verify forward over the requests counted. The reference engine's page names them alike."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4,
        "vocab_size": 512, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6,
        "torch_dtype": "float32"}))  # fmt: skip
    proc = subprocess.run([str(SGLANG_PYTHON), "-c", COLLECTOR, str(tmp_path)], cwd=ROOT / "eagle3_ops" / "payloads",
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = json.loads(proc.stdout.strip().splitlines()[-1])
    canary = module_utils("_canary")
    got = canary.counters(page)
    assert got == {"num_requests_total": 2.0, "generation_tokens_total": 54.0, "spec_verify_calls_total": 20.0}
    assert canary.accept_length(got) == 2.7
    server = (ROOT / "eagle3_ops" / "payloads" / "serving" / "server.py").read_text()
    for name in canary.COUNTERS:
        assert f'("{name}"' in server, name
