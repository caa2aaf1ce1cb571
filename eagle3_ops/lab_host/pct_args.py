"""The lab pct's argument parsing in PVE's style: positional arguments, then -opt/--opt value pairs, checked
against the option types PVE publishes. Standard library only."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

try:  # a package module (tests, eagle3_ops), or loose files beside each other (the lab host's bin/)
    from .pct_config import INDEXED_OPTIONS, OPTION_TYPES, PctError, _param_error
except ImportError:  # pragma: no cover
    from pct_config import INDEXED_OPTIONS, OPTION_TYPES, PctError, _param_error  # type: ignore[no-redef]

# --------------------------------------------------------------------------------------------
# argument parsing in PVE's style: positional args, then -opt/--opt value pairs
# --------------------------------------------------------------------------------------------


@dataclass
class Command:
    name: str
    positional: list[str]
    usage: str
    handler: Callable[[list[str], dict[str, str], list[str]], int]
    options: dict[str, str] = field(default_factory=dict)  # name -> type
    extra_args: bool = False


def parse_args(cmd: Command, argv: list[str]) -> tuple[list[str], dict[str, str], list[str]]:
    pos: list[str] = []
    opts: dict[str, str] = {}
    extra: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--" and cmd.extra_args:
            extra = argv[i + 1 :]
            break
        if arg.startswith("-") and len(arg) > 1 and not arg.lstrip("-").isdigit():
            name = arg.lstrip("-")
            value: str | None = None
            if "=" in name:
                name, value = name.split("=", 1)
            otype = _option_type(cmd, name)
            if otype is None:
                raise _param_error(
                    name,
                    "property is not defined in schema and the schema does not allow additional properties",
                    cmd.usage,
                )
            if value is None:
                nxt = argv[i + 1] if i + 1 < len(argv) else None
                if otype == "boolean" and (
                    nxt is None or nxt not in ("0", "1", "yes", "no", "true", "false", "on", "off")
                ):
                    value = "1"
                elif nxt is None:
                    raise _param_error(name, "missing value", cmd.usage)
                else:
                    value = nxt
                    i += 1
            if name in opts and name != "delete":
                raise _param_error(name, "duplicate parameter", cmd.usage)
            opts[name] = _check_type(name, otype, value, cmd.usage)
        elif cmd.extra_args and len(pos) == len(cmd.positional):
            extra = argv[i:]
            break
        else:
            pos.append(arg)
        i += 1
    if len(pos) < len(cmd.positional):
        missing = cmd.positional[len(pos)]
        raise _param_error(missing, "property is missing and it is not optional", cmd.usage)
    if len(pos) > len(cmd.positional):
        raise PctError("400 too many arguments", cmd.usage)
    return pos, opts, extra


def _option_type(cmd: Command, name: str) -> str | None:
    if name in cmd.options:
        return cmd.options[name]
    if cmd.options.get("*") == "ct-options":
        if name in OPTION_TYPES:
            return OPTION_TYPES[name]
        m = re.fullmatch(r"([a-z]+)(\d+)", name)
        if m and m.group(1) in INDEXED_OPTIONS and int(m.group(2)) < 256:
            return "string"
    return None


def _check_type(name: str, otype: str, value: str, usage: str) -> str:
    if otype == "integer" and not re.fullmatch(r"-?\d+", value):
        raise _param_error(name, f"type check ('integer') failed - got '{value}'", usage)
    if otype == "number" and not re.fullmatch(r"-?\d+(\.\d+)?", value):
        raise _param_error(name, f"type check ('number') failed - got '{value}'", usage)
    if otype == "boolean":
        table = {"1": "1", "yes": "1", "true": "1", "on": "1", "0": "0", "no": "0", "false": "0", "off": "0"}
        if value.lower() not in table:
            raise _param_error(name, f"type check ('boolean') failed - got '{value}'", usage)
        return table[value.lower()]
    return value


def parse_vmid(text: str, usage: str) -> int:
    if not re.fullmatch(r"[1-9]\d*", text) or not 100 <= int(text) <= 999_999_999:
        raise _param_error("vmid", "invalid format - value does not look like a valid VM ID", usage)
    return int(text)
