# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Templates compiled once per ansible-playbook run, not once per task.

ansible-core 2.19 compiles every template it renders (Jinja's ``Environment.from_string`` compiles each time: a
parse, Python code generation and ``compile``), and every task runs in a fork of the controller's main process,
whose caches die with it. The same role defaults, conditions and arguments are compiled again by every task that
uses them: a setting switch of ``deploy.yml`` on the lab compiled 996 templates, 186 of them distinct, in about
1.9 s of the controller's CPU.

``install`` makes Jinja's ``compile`` of a template source (a string) keep its code object, marshalled, in a
directory every fork of the run shares, keyed by everything the code depends on: the source, its name and file
name, the environment's lexer and code generation settings, whether Ansible escapes backslashes in this compile,
and the Python, Jinja and ansible-core releases. A later compile of the same key in any fork of the run loads it.
The directory is inside Ansible's own per-run temporary directory (``DEFAULT_LOCAL_TMP``, where ansible-core keeps
its AnsiballZ cache the same way), which Ansible removes when the run ends. Anything else (a compile for Jinja's
raw source, a template node, Ansible's template debugging) compiles as before; a compile error is never kept.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import sys
import tempfile
from types import CodeType
from typing import Any

import jinja2
from ansible import constants as C
from ansible.release import __version__ as ANSIBLE_VERSION
from jinja2.utils import internalcode

try:  # ansible-core's own environment and compile context (2.19): without them, nothing is installed
    from ansible._internal._templating._jinja_bits import AnsibleEnvironment, _TemplateCompileContext
except ImportError:  # pragma: no cover - another ansible-core
    AnsibleEnvironment = None  # type: ignore[assignment,misc]
    _TemplateCompileContext = None  # type: ignore[assignment,misc]

# Environment attributes that change what a source compiles to (the lexer's and the code generator's settings).
SETTINGS = ("block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
            "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
            "trim_blocks", "lstrip_blocks", "newline_sequence", "keep_trailing_newline", "optimized", "is_async",
            "autoescape")  # fmt: skip
RELEASES = f"{sys.version}|{jinja2.__version__}|{ANSIBLE_VERSION}"

_state: dict[str, Any] = {"dir": None, "original": None, "hits": 0, "misses": 0}
_memo: dict[str, CodeType] = {}


def _key(env: Any, source: str, name: str | None, filename: str | None) -> str:
    tcc = _TemplateCompileContext.current(optional=True) if _TemplateCompileContext is not None else None
    settings = tuple(repr(getattr(env, attr, None)) for attr in SETTINGS)
    parts = (RELEASES, type(env).__qualname__, settings, tuple(sorted(env.extensions)),
             bool(tcc and tcc.escape_backslashes), name, filename, str(source))  # fmt: skip
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).hexdigest()


def _load(path: str) -> CodeType | None:
    try:
        with open(path, "rb") as handle:
            code = marshal.load(handle)  # noqa: S302 -- this run's own 0700 directory, written by its own forks
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def _keep(path: str, code: CodeType) -> None:
    """Written beside its name and renamed over it: a fork reads a complete code object or none."""
    try:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
    except OSError:
        return  # the run's directory is gone (its end): compiled, not kept
    try:
        with os.fdopen(fd, "wb") as handle:
            marshal.dump(code, handle)
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


@internalcode
def _compile(self: Any, source: Any, name: str | None = None, filename: str | None = None, raw: bool = False,
             defer_init: bool = False) -> Any:  # fmt: skip
    original = _state["original"]
    directory = _state["dir"]
    if raw or defer_init or not isinstance(source, str) or directory is None or self._debuggable_template_source:
        return original(self, source, name, filename, raw, defer_init)
    key = _key(self, source, name, filename)
    code = _memo.get(key)
    if code is None:
        path = os.path.join(directory, key)
        code = _load(path)
        if code is None:
            code = original(self, source, name, filename, raw, defer_init)  # a compile error propagates, kept nowhere
            _keep(path, code)
            _state["misses"] += 1
        else:
            _state["hits"] += 1
        _memo[key] = code
    else:
        _state["hits"] += 1
    return code


def install(directory: str | None = None) -> str | None:
    """Share compiled templates between the forks of this run (call in the main process, before the first task):
    the directory used, or None where this ansible-core has no environment to install it on."""
    if AnsibleEnvironment is None:
        return None
    if directory is None:
        directory = os.path.join(str(C.DEFAULT_LOCAL_TMP), "eagle3-templates")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if _state["original"] is None:
        _state["original"] = AnsibleEnvironment.compile
        AnsibleEnvironment.compile = _compile  # type: ignore[method-assign]
    _state["dir"] = directory
    return directory


def stats() -> dict[str, int]:
    """Compiles loaded (from this process's memory or the run's directory) and compiled, in this process."""
    return {"hits": int(_state["hits"]), "misses": int(_state["misses"])}
