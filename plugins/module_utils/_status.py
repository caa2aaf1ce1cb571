# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one status row reads on a host (eagle3.ops.eagle3_status): standard library only."""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
from typing import Any
from urllib.parse import urlsplit

from ansible_collections.eagle3.ops.plugins.module_utils._auth import ADMIN_KEY_SPEC, API_KEY_SPEC, bearer
from ansible_collections.eagle3.ops.plugins.module_utils._router import worker_rows
from ansible_collections.eagle3.ops.plugins.module_utils._serving import reported_accept_length
from ansible_collections.eagle3.ops.plugins.module_utils._smi import SMI_GPU_FIELDS, smi_argv, smi_rows

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "nvidia_smi": {"type": "list", "elements": "str", "default": ["nvidia-smi"]},
    "train_state": {"type": "path"},
    "python": {"type": "path"},
    "payload_dir": {"type": "path"},
    "server_url": {"type": "str", "default": ""},
    "router_url": {"type": "str", "default": ""},
    "timeout": {"type": "float", "default": 5},
    "served_record": {"type": "path"},
    "accept_drift_percent": {"type": "float", "default": 15.0},
    **API_KEY_SPEC,
    **ADMIN_KEY_SPEC,
}


class StatusReader:
    """The reads of a status row, each on its own: one that fails leaves its part empty."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params

    def gpus(self) -> list[dict[str, Any]] | None:
        argv = smi_argv(self.p["nvidia_smi"], SMI_GPU_FIELDS)
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=self.p["timeout"], check=False)
            if proc.returncode != 0:
                return [] if "No devices were found" in proc.stdout else None
            return smi_rows(proc.stdout, SMI_GPU_FIELDS)
        except (OSError, subprocess.TimeoutExpired, ValueError):
            return None

    def training(self) -> dict[str, Any] | None:
        state, python, payload = self.p["train_state"], self.p["python"], self.p["payload_dir"]
        if not (state and python and payload) or not os.path.isdir(state) or not os.path.exists(python):
            return None
        try:
            argv = [python, "-m", "training.monitor", "--state", state, "--no-record"]
            proc = subprocess.run(argv, cwd=payload, capture_output=True, text=True, timeout=self.p["timeout"] * 4,
                                  check=False)  # fmt: skip
            sample = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout else {}
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
            return None
        return sample if isinstance(sample, dict) and sample.get("attempt") is not None else None

    def serving(self) -> dict[str, Any] | None:
        if not self.p["server_url"]:
            return None
        base = self.p["server_url"].rstrip("/")
        info = self._json(base + "/get_server_info", self.p["api_key"])
        if not isinstance(info, dict):
            return None
        out = {"draft": info.get("speculative_draft_model_path"),
               "draft_tokens": info.get("speculative_num_draft_tokens"),
               "accept_length": reported_accept_length(info)}  # fmt: skip
        out.update(live_figures(self._text(base + "/metrics")))
        out["gate_accept_length"] = self.gate_figure(out["draft"])
        out["drift_warning"] = drift_warning(out, self.p["accept_drift_percent"])
        return out

    def gate_figure(self, draft: Any) -> float | None:
        """The accept length the server's gate measured when it was last deployed (sglang_service's record), when
        the record names the draft it serves now."""
        try:
            with open(self.p["served_record"] or "", encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            return None
        value = record.get("accept_length") if isinstance(record, dict) else None
        same = not draft or record.get("draft") in (None, draft)
        return float(value) if same and isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def _json(self, url: str, key: str | None) -> Any:
        raw = self._text(url, key)
        try:
            return None if raw is None else json.loads(raw)
        except ValueError:
            return None

    def _text(self, url: str, key: str | None = None) -> str | None:
        try:
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                return None
            # Most hosts of a fleet serve nothing: where nothing listens, no HTTP client is loaded (a third of the
            # read's time on the host).
            socket.create_connection((parts.hostname, port), timeout=self.p["timeout"]).close()
        except (OSError, ValueError):
            return None
        from urllib import error, request  # pylint: disable=import-outside-toplevel

        # The server and the router are the host's own (or the lab's bridge): never through a proxy of the environment.
        opener = request.build_opener(request.ProxyHandler({}))
        try:
            # http(s) only: _json checked the scheme above
            with opener.open(request.Request(url, headers=bearer(key)), timeout=self.p["timeout"]) as resp:  # noqa: S310
                return str(resp.read().decode("utf-8", "replace"))
        except (OSError, error.URLError, ValueError):
            return None

    def router(self) -> list[dict[str, Any]] | None:
        if not self.p["router_url"]:
            return None
        listed = self._json(self.p["router_url"].rstrip("/") + "/workers", self.p["admin_key"])
        if not isinstance(listed, dict):
            return None
        return worker_rows(listed.get("workers"))

    def read(self) -> dict[str, Any]:
        gpus = self.gpus()
        return {"changed": False, "gpus": gpus or [], "gpus_read": gpus is not None, "training": self.training(),
                "serving": self.serving(), "router": self.router()}  # fmt: skip


# SGLang's live gauges (its /metrics with --enable-metrics, open as /health is): the accept length and the generation
# throughput over the last log interval of decode forwards (sglang/srt/observability/metrics_collector.py).
_GAUGE = re.compile(r"^sglang:(spec_accept_length|gen_throughput)(?:\{[^}]*\})?\s+([-+0-9.eE]+|NaN)\s*$", re.M)


def live_figures(text: str | None) -> dict[str, float | None]:
    """``live_accept_length`` and ``tokens_per_s`` from a /metrics page; None where it says nothing, or 0 (no
    interval completed since the start: nothing measured yet)."""
    found: dict[str, float] = {}
    for name, value in _GAUGE.findall(text or ""):
        try:
            number = float(value)
        except ValueError:
            continue
        if not math.isnan(number) and number > 0:  # NaN and 0: nothing measured
            found[name] = number
    return {"live_accept_length": found.get("spec_accept_length"), "tokens_per_s": found.get("gen_throughput")}


def drift_warning(serving: dict[str, Any], percent: float) -> str | None:
    """The sentence when the live accept length is more than ``percent`` below the gate's figure at deploy time."""
    live, gate = serving.get("live_accept_length"), serving.get("gate_accept_length")
    if not isinstance(live, float) or not isinstance(gate, float) or gate <= 0 or live >= gate * (1 - percent / 100):
        return None
    return (f"accepts {live:.2f} tokens per step live, {100 * (1 - live / gate):.0f}% below the {gate:.2f} its gate "
            f"measured at deploy (eagle3_accept_drift_percent {percent:g}): the traffic may have drifted from the "
            "training data - retrain on recent prompts, or deploy the previous draft.")
