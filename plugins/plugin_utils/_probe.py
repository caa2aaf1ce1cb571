# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A read-only module's work run on its host as one short Python script, without ansible's module wrapper.

A module call costs the host a Python that unpacks ansible's wrapper and imports ansible.module_utils.basic (about
0.25 s of CPU in a lab container, against 0.02 s for a bare interpreter): paid once per container by a fleet-wide
run, on top of the connection itself. For a read whose code is standard library only (its module_utils), the action
plugin checks the arguments on the controller and sends the module_utils' sources and the arguments as one script on
the command's standard input - the same single round trip as a pipelined module - to the host's Python, run isolated
and without site (``-I -S``: the standard library alone, none of the host's environment variables or .pth files).
When the host's Python is not known or the connection cannot take a script on its input (no pipelining, become), or
the script does not answer, the action runs the module as usual, so the result and the failures are the module's.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from collections.abc import Sequence
from typing import Any, ClassVar

from ansible import constants as C
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

MODULE_UTILS = "ansible_collections.eagle3.ops.plugins.module_utils"
MARK = "EAGLE3_PROBE_RESULT "
_AUTO = ("auto", "auto_legacy", "auto_silent", "auto_legacy_silent")
_sources: dict[str, str] = {}

# The script: the module_utils as modules under their collection names (in order, each may import the ones before
# it), then the entry's answer as one marked line of JSON.
_BOOT = """import json, os, sys, types
SOURCES = json.loads({sources!r})
PARAMS = json.loads({params!r})
for name in {paths!r}:  # 'path' options expanded on this host, as AnsibleModule's 'path' type does
    value = PARAMS.get(name)
    if isinstance(value, list):
        PARAMS[name] = [os.path.expanduser(os.path.expandvars(v)) for v in value]
    elif value:
        PARAMS[name] = os.path.expanduser(os.path.expandvars(value))
base = {base!r}
parts = base.split(".")
for i in range(1, len(parts) + 1):
    pkg = types.ModuleType(".".join(parts[:i]))
    pkg.__path__ = []
    sys.modules.setdefault(pkg.__name__, pkg)
for short, source in SOURCES:
    mod = types.ModuleType(base + "." + short)
    mod.__file__ = "<eagle3 probe " + short + ">"
    sys.modules[mod.__name__] = mod
    exec(compile(source, mod.__file__, "exec"), mod.__dict__)
answer = sys.modules[base + "." + {module!r}].{entry}(PARAMS)
sys.stdout.write("\\n" + {mark!r} + json.dumps(answer) + "\\n")
"""


def source(short: str) -> str:
    """The text of one of the collection's module_utils (read once per controller process)."""
    if short not in _sources:
        spec = importlib.util.find_spec(f"{MODULE_UTILS}.{short}")
        if spec is None or not spec.origin:
            raise ImportError(f"{MODULE_UTILS}.{short} is not installed with the collection")
        with open(spec.origin, encoding="utf-8") as handle:
            _sources[short] = handle.read()
    return _sources[short]


def path_options(spec: dict[str, Any]) -> list[str]:
    """The options AnsibleModule expands as paths ('path', or a list of 'path' elements)."""
    return [name for name, option in spec.items() if "path" in (option.get("type"), option.get("elements"))]


def script(modules: Sequence[str], module: str, entry: str, params: dict[str, Any], paths: Sequence[str] = ()) -> str:
    """The Python program that loads ``modules`` (module_utils names, dependencies first), expands the ``paths``
    options on the host and prints ``module.entry(params)`` as one marked JSON line."""
    sources = json.dumps([[short, source(short)] for short in modules])
    return _BOOT.format(sources=sources, params=json.dumps(params), paths=list(paths), base=MODULE_UTILS, module=module,
                        entry=entry, mark=MARK)  # fmt: skip


def _unexpanded(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec with 'path' read as 'str': a path is expanded where it is read (the host's ~ is not the
    controller's), by the script (``path_options``)."""
    out = {}
    for name, option in spec.items():
        option = dict(option)
        if option.get("type") == "path":
            option["type"] = "str"
        if option.get("elements") == "path":
            option["elements"] = "str"
        out[name] = option
    return out


def validated(spec: dict[str, Any], args: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """The arguments as the module would see them (defaults, types; paths as written), or None and the module's own
    error message."""
    result = ArgumentSpecValidator(_unexpanded(spec)).validate(dict(args))
    if result.error_messages:
        return None, "; ".join(result.error_messages)
    return result.validated_parameters, ""


def interpreter(task_vars: dict[str, Any], templar: Any) -> str | None:
    """The host's Python as a module would run it: ansible_python_interpreter, interpreter_python, or the one
    discovered earlier in the run; ``python3`` on the host's PATH when discovery is asked for but has not run."""
    raw = C.config.get_config_value("INTERPRETER_PYTHON", variables=task_vars)
    try:
        value = str(templar.template(raw) or "").strip()
    except Exception:  # a value that cannot be templated here: the module path reports it
        return None
    if not value or value in _AUTO:
        return str(task_vars.get("ansible_facts", {}).get("discovered_interpreter_python") or "python3")
    return value


def usable(connection: Any) -> bool:
    """Whether the connection can take the script on the command's input, as it takes a pipelined module."""
    return bool(getattr(connection, "has_pipelining", False)) and not getattr(connection, "become", None)


def run(action: Any, task_vars: dict[str, Any], modules: Sequence[str], module: str, entry: str,
        params: dict[str, Any], paths: Sequence[str] = ()) -> dict[str, Any] | None:  # fmt: skip
    """``module.entry(params)`` computed on the action's host by one script, or None when it could not run there
    (the caller then runs the module). A connection failure propagates: the host is unreachable either way."""
    python = interpreter(task_vars, action._templar)
    if not python or not usable(action._connection):
        return None
    program = script(modules, module, entry, params, paths)
    try:
        # An interpreter may carry arguments (/usr/bin/env python3). -I -S: the script needs the standard library alone,
        # and a distribution's site (its .pth files, sitecustomize) was a sixth of a dry run's CPU in a lab container.
        command = shlex.join([*shlex.split(python), "-I", "-S", "-"])
    except ValueError:
        return None
    res = action._low_level_execute_command(command, sudoable=False, in_data=program.encode())
    if res.get("rc") != 0:
        return None
    for line in reversed(str(res.get("stdout", "")).splitlines()):
        if line.startswith(MARK):
            try:
                answer = json.loads(line[len(MARK):])
            except ValueError:
                return None
            return answer if isinstance(answer, dict) else None
    return None


class ProbeAction(ActionBase):
    """An action plugin whose module's work runs on the host as one script where it can (``probe_wanted``), and as
    the module otherwise. A subclass names the module, its argument spec, the module_utils the script needs
    (dependencies first) and the entry point (module_utils name, function taking the arguments)."""

    TRANSFERS_FILES = False
    MODULE = ""
    SPEC: ClassVar[dict[str, Any]] = {}
    MODULES: tuple[str, ...] = ()
    ENTRY = ("", "")

    def probe_wanted(self) -> bool:
        return True

    def probe_modules(self, params: dict[str, Any]) -> tuple[str, ...]:
        """The module_utils this call's script needs (dependencies first); a subclass may leave out what the
        arguments do not use."""
        return self.MODULES

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        answer = None
        if self.probe_wanted():
            params, error = validated(self.SPEC, self._task.args)
            if params is None:
                result.update(failed=True, msg=f"{self.MODULE.rsplit('.', 1)[-1]}: {error}")
                return result
            answer = run(self, task_vars, self.probe_modules(params), self.ENTRY[0], self.ENTRY[1], params,
                         path_options(self.SPEC))
        if answer is None:
            answer = self._execute_module(module_name=self.MODULE, module_args=self._task.args, task_vars=task_vars)
        result.update(answer)
        return result
