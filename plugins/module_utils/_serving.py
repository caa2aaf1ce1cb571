# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's server info (``/get_server_info``) and SGLang's own verdicts on a command line and a draft, as the
modules read them."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

# sglang_service's option ``judge``: the payload's ``sglang_check.judge serve`` call and the words its refusal uses.
JUDGE_SPEC: dict[str, dict[str, Any]] = {
    "argv": {"type": "list", "elements": "str", "required": True},
    "chdir": {"type": "path", "required": True},
    "python": {"type": "str", "required": True},
    "release": {"type": "str", "default": ""},
}
# The draft architecture SGLang's EAGLE-3 loader serves (sglang/srt/models/llama_eagle3.py, EntryClass).
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"


def model_refusal(host: str, target: str | None, draft: str | None) -> str | None:
    """None when the target's config.json exists and the draft (when one is served) is an EAGLE-3 draft in SGLang's
    layout, else the sentence that says which is not and the fix."""
    fix = f" on {host}: export the speculators checkpoint with eagle3_export (deploy.yml does) or fix the path."
    if target and not os.path.isfile(os.path.join(target, "config.json")):
        return f"The target {target}/config.json is missing{fix}"
    if not draft:
        return None
    try:
        with open(os.path.join(draft, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return f"The draft {draft}/config.json is missing{fix}"
    except (OSError, ValueError) as exc:
        return f"The draft {draft}/config.json cannot be read ({exc}){fix}"
    found = config.get("architectures") if isinstance(config, dict) else None
    if not isinstance(found, list) or EAGLE3_ARCHITECTURE not in found:
        return f"The draft {draft} is not in SGLang layout (architectures {found or []}){fix}"
    return None


def reported_accept_length(info: dict[str, Any]) -> Any:
    """``internal_states[0].avg_spec_accept_length`` as the server reports it, or None when it reports none."""
    states = info.get("internal_states") or [{}]
    first = states[0] if isinstance(states, list) and isinstance(states[0], dict) else {}
    return first.get("avg_spec_accept_length")


def judge_verdict(stdout: str) -> dict[str, Any]:
    """The JSON object on the judge's last line of output, or an empty dict when there is none."""
    lines = (stdout or "").strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        return {}
    try:
        got = json.loads(lines[-1])
    except ValueError:
        return {}
    return got if isinstance(got, dict) else {}


def judge_refusal(rc: int, verdict: dict[str, Any], stderr: str, judge: dict[str, Any], host: str,
                  draft: str | None) -> str | None:
    """None when SGLang accepted the command line and the draft (``rc`` 0), else the one sentence that says what SGLang
    refused (``rc`` 1: it would run the command line differently or not at all, or its loader would load the draft
    incompletely) or why it could not judge (any other ``rc``), and the fix."""
    if rc == 0:
        return None
    failed = verdict.get("failed")
    release = verdict.get("sglang") or judge["release"]
    if rc == 1 and failed == "args":
        args: dict[str, Any] = verdict["args"] if isinstance(verdict.get("args"), dict) else {}
        how = "would run this command line differently" if args.get("stage") == "compare" else \
            "would not run this command line"  # fmt: skip
        return (f"SGLang {release} on {host} {how}: {args.get('error', args)}; fix draft_tokens, speculative_topk or "
                "speculative_steps (or sglang_serve_extra_args) so that SGLang runs what was asked.")
    if rc == 1 and failed == "load":
        load: dict[str, Any] = verdict["load"] if isinstance(verdict.get("load"), dict) else {}
        problems = "; ".join(load.get("problems") or [])
        return (f"SGLang {release} on {host} loads {draft} incompletely: {problems}; export the speculators "
                f"checkpoint for this SGLang release (eagle3_export with sglang_version {release}).")  # fmt: skip
    part = verdict.get(failed) if failed else None
    why = part.get("error") if isinstance(part, dict) else None
    if not why:
        lines = (stderr or "").strip().splitlines()
        why = lines[-1] if lines else f"exit {rc}"
    return (f"SGLang on {host} could not judge the {failed or 'command line and draft'}: {why}; check the SGLang "
            f"environment ({judge['python']}) or set sglang_serve_check_args and sglang_serve_check_draft_load to "
            "false to serve without the judge.")


def run_judge(judge: dict[str, Any], host: str, draft: str | None) -> tuple[dict[str, Any], str | None]:
    """Ask SGLang (the payload's ``sglang_check.judge serve`` in ``judge['chdir']``): its verdict and the refusal
    (None when it accepted). A judge that cannot start is a refusal of its own, naming the environment."""
    try:
        proc = subprocess.run(judge["argv"], cwd=judge["chdir"], capture_output=True, text=True, check=False)
    except OSError as exc:
        why = f"{exc.strerror or exc}: {exc.filename or judge['argv'][0]}"
        return {}, judge_refusal(127, {}, why, judge, host, draft)
    verdict = judge_verdict(proc.stdout)
    return verdict, judge_refusal(proc.returncode, verdict, proc.stderr, judge, host, draft)
