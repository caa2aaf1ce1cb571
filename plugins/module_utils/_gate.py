# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A freshly started server's gates (the smoke requests, then the accept length its server info reports), shared by
the sglang_gate and sglang_service modules."""

from __future__ import annotations

import json
import time
import urllib.error
from typing import Any

from ansible.module_utils.urls import open_url
from ansible_collections.eagle3.ops.plugins.module_utils._auth import API_KEY_SPEC, bearer, refused
from ansible_collections.eagle3.ops.plugins.module_utils._serving import reported_accept_length

# The options of a server's gates (the sglang_gate and sglang_service modules): the smoke requests and where the
# server info is read.
GATE_SPEC: dict[str, dict[str, Any]] = {
    "prompts": {"type": "list", "elements": "str", "default": []},
    "api": {"type": "str", "choices": ["chat", "generate"], "default": "chat"},
    "max_tokens": {"type": "int", "default": 64, "no_log": False},  # a count, not a secret
    "timeout": {"type": "float", "default": 300},
    "info_paths": {"type": "list", "elements": "str", "default": ["get_server_info", "server_info"]},
    **API_KEY_SPEC,
}


class GateError(Exception):
    pass


def request(url: str, timeout: float, body: dict[str, Any] | None = None, key: str | None = None) -> Any:
    """GET (or POST ``body`` as JSON) one URL of a server, with its API key when set, and return its JSON answer."""
    data = None if body is None else json.dumps(body)
    headers = bearer(key, {} if body is None else {"Content-Type": "application/json"})
    with open_url(url, method="GET" if body is None else "POST", data=data, headers=headers, timeout=timeout) as resp:
        return json.loads(resp.read().decode("utf-8", "replace"))


def answers(url: str, timeout: float) -> bool:
    """Whether a GET of ``url`` answers 200 (SGLang's /health answers 200 with no body)."""
    try:
        with open_url(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


class Gate:
    """The smoke requests and the server info of one server."""

    def __init__(self, params: dict[str, Any]) -> None:
        self.p = params
        self.base = params["url"].rstrip("/")
        self.chat = params["api"] == "chat"
        self.endpoint = "/v1/chat/completions" if self.chat else "/generate"

    def smoke(self) -> list[dict[str, Any]]:
        prompts, where = self.p["prompts"], f"{self.base}{self.endpoint}"
        done: list[dict[str, Any]] = []
        for i, prompt in enumerate(prompts, 1):
            started = time.monotonic()
            try:
                answer = request(where, self.p["timeout"], self.body(prompt), self.p["api_key"])
            except urllib.error.HTTPError as exc:
                why = refused(exc.code, f"the smoke request {i} of {len(prompts)} to {where}", self.p["api_key"], "API")
                detail = exc.read().decode("utf-8", "replace")[:300] if exc.fp else ""
                raise GateError(why or f"the smoke request {i} of {len(prompts)} to {where} answered HTTP "
                                f"{exc.code} {detail}".rstrip()) from exc  # fmt: skip
            except (OSError, urllib.error.URLError, ValueError) as exc:
                raise GateError(f"the smoke request {i} of {len(prompts)} to {where} failed: {exc}") from exc
            text, tokens = self.reply(answer, self.chat)
            if not isinstance(text, str):
                raise GateError(f"the smoke request {i} of {len(prompts)} to {where} answered without a "
                                f"generated text: {json.dumps(answer)[:300]}")  # fmt: skip
            done.append({"prompt": prompt, "chars": len(text), "tokens": tokens,
                         "seconds": round(time.monotonic() - started, 3)})  # fmt: skip
        return done

    def body(self, prompt: str) -> dict[str, Any]:
        """One smoke request (greedy). A chat model may answer a bare text with its end token at once (it never saw
        one outside its template): through the chat API the server applies the model's template, as a client does."""
        most = self.p["max_tokens"]
        if self.chat:
            return {"messages": [{"role": "user", "content": prompt}], "max_tokens": most, "temperature": 0}
        return {"text": prompt, "sampling_params": {"max_new_tokens": most, "temperature": 0}}

    @staticmethod
    def reply(answer: Any, chat: bool) -> tuple[Any, int | None]:
        """The generated text and its token count (None where the server does not say) of one smoke answer:
        SGLang's ``/generate`` (``text``, ``meta_info.completion_tokens``) or its OpenAI chat API
        (``choices[0].message.content``, ``usage.completion_tokens``)."""
        if not isinstance(answer, dict):
            return None, None
        if chat:
            choices = answer.get("choices")
            first = choices[0] if isinstance(choices, list) and choices else None
            message = first.get("message") if isinstance(first, dict) else None
            text = message.get("content") if isinstance(message, dict) else None
            counts = answer.get("usage")
        else:
            text, counts = answer.get("text"), answer.get("meta_info")
        tokens = counts.get("completion_tokens") if isinstance(counts, dict) else None
        return text, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None

    def too_short(self, smoke: list[dict[str, Any]]) -> str | None:
        """Why no accept length can be read, when the smoke requests ran no speculative step: every reply was
        at most one token (the first token comes from the prefill, no draft is verified before the second)."""

        def verified(s: dict[str, Any]) -> bool:  # a second token, or (no count given) some text
            return s["tokens"] > 1 if s["tokens"] is not None else bool(s["chars"])

        if not smoke or any(verified(s) for s in smoke):
            return None
        fix = "." if self.chat else ", through its chat template (api: chat) for a chat model."
        return (f"The {len(smoke)} smoke request(s) through {self.endpoint} got at most one token each, so no draft "
                "was verified and the accept length cannot be read (the draft is not to blame): send smoke prompts the "
                f"target answers at length{fix}")  # fmt: skip

    def info(self) -> tuple[dict[str, Any], str | None]:
        for path in self.p["info_paths"]:
            try:
                got = request(f"{self.base}/{path.lstrip('/')}", self.p["timeout"], key=self.p["api_key"])
            except (OSError, urllib.error.URLError, ValueError):
                continue
            if isinstance(got, dict):
                return got, path
        return {}, None

    @staticmethod
    def accept_length(info: dict[str, Any]) -> float | None:
        value = reported_accept_length(info)
        return float(value) if isinstance(value, (int, float)) else None

    def run(self, check_mode: bool) -> dict[str, Any]:
        if check_mode:
            return {"changed": False, "smoke": [], "info": {}, "info_path": None, "accept_length": None}
        smoke = self.smoke()
        info, path = self.info()
        return {"changed": False, "smoke": smoke, "info": info, "info_path": path,
                "accept_length": self.accept_length(info)}  # fmt: skip


def wait_healthy(url: str, timeout: float, interval: float) -> float | None:
    """Seconds until ``url``/health answered 200, or None after ``timeout`` (polled every ``interval`` seconds)."""
    started = time.monotonic()
    deadline = started + timeout
    health = f"{url.rstrip('/')}/health"
    while True:
        if answers(health, min(10.0, max(1.0, deadline - time.monotonic()))):
            return round(time.monotonic() - started, 2)
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def accept_refusal(checks: Gate, result: dict[str, Any], least: float | None, context: str, hint: str) -> str | None:
    """The accept-length gate on a server that answered its smoke requests: None when it passes (or none is set),
    else the sentence - replies of one token each (nothing was verified, so the length says nothing of the draft),
    or the length the server reports against the floor, and ``hint``."""
    got = result.get("accept_length")
    if least is None or (got is not None and got > least):
        return None
    short = checks.too_short(result.get("smoke") or [])
    if short:
        return short
    where = f" {context}" if context else ""
    return f"The server accepts {'no' if got is None else got} tokens per step{where} (gate: above {least}): {hint}"
