#!/usr/bin/env python3
"""Write each role's README.md from its meta/argument_specs.yml (the one place its options are documented) and from
the playbooks that use it. ``--check`` exits 1 when a README is not what its role gives (a test runs it).

Usage: python scripts/role_readmes.py [--check]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent


def text(value: Any) -> str:
    """An argument_specs description (a string or a list of them) as one paragraph, Ansible's markup made Markdown."""
    parts = value if isinstance(value, list) else [value] if value else []
    joined = " ".join(" ".join(str(p).split()) for p in parts)
    joined = re.sub(r"[CV]\(([^)]*)\)", r"`\1`", joined)
    return re.sub(r"[IB]\(([^)]*)\)", r"\1", joined)


def first_sentence(value: Any) -> str:
    whole = text(value)
    match = re.match(r"(.+?\.)\s", whole)
    return match.group(1) if match else whole


def _role_names(data: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(data, dict):
        for key, value in data.items():
            if key == "role" and isinstance(value, str):
                found.add(value)
            elif key in ("ansible.builtin.import_role", "ansible.builtin.include_role") and isinstance(value, dict):
                found.add(str(value.get("name", "")))
            elif key == "roles" and isinstance(value, list):
                found |= {v for v in value if isinstance(v, str)}
            found |= _role_names(value)
    elif isinstance(data, list):
        for value in data:
            found |= _role_names(value)
    return found


def roles_used(data: Any) -> set[str]:
    """The collection's roles a playbook or task file names (a play's roles:, import_role, include_role)."""
    return {name.removeprefix("eagle3.ops.") for name in _role_names(data) if name.startswith("eagle3.ops.")}


def plays_using(role: str) -> list[tuple[str, str, str]]:
    """(playbook, play name, hosts) of every play under playbooks/ that names the role."""
    found = []
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            if not isinstance(play, dict) or "hosts" not in play:
                continue
            if role in roles_used(play):
                found.append((path.name, str(play.get("name", "")), str(play["hosts"])))
    return found


def default(option: dict[str, Any]) -> str:
    if "default" not in option:
        return "required" if option.get("required") else "-"
    value = option["default"]
    shown = value if isinstance(value, str) else json.dumps(value)
    shown = shown.replace("\n", " ").replace("|", "/")
    return f"`{shown}`" if len(shown) <= 40 else "(see argument_specs)"


def readme(role_dir: Path) -> str:
    role = role_dir.name
    specs = (yaml.safe_load((role_dir / "meta" / "argument_specs.yml").read_text()) or {}).get("argument_specs") or {}
    main = specs.get("main") or next(iter(specs.values()), {})  # a role without main: its first entry point
    note = (
        "<!-- Written by scripts/role_readmes.py from meta/argument_specs.yml and meta/outputs.yml: edit those, "
        "then the script. -->"
    )
    out = [f"# eagle3.ops.{role}", "", note, "", text(main.get("short_description")), ""]
    if main.get("description"):
        out += [text(main["description"]), ""]
    out += ["## Entry points", "", "| entry point | what it does |", "| --- | --- |"]
    for name, spec in specs.items():
        use = "`roles: [eagle3.ops." + role + "]`" if name == "main" else f"`tasks_from: {name}`"
        out.append(f"| {name} ({use}) | {text(spec.get('short_description'))} |")
    out += ["", "## Options", "", f"Every option, with its type, choices and full description: `ansible-doc -t role "
            f"eagle3.ops.{role}` (from `meta/argument_specs.yml`).", ""]  # fmt: skip
    for name, spec in specs.items():
        options = spec.get("options") or {}
        # an entry point's own description (how and why it does what it does), under its heading
        about = [text(spec["description"]), ""] if name != "main" and spec.get("description") else []
        if not options:
            out += [f"### {name}", "", *about, "It takes no options.", ""] if about else []
            continue
        if name != "main" and options == main.get("options"):
            out += [f"### {name}", "", *about, "The options of main.", ""]
            continue
        out += [f"### {name}", "", *about, "| option | default | what it is |", "| --- | --- | --- |"]
        out += [f"| `{opt}` | {default(o)} | {first_sentence(o.get('description'))} |" for opt, o in options.items()]
        out.append("")
    outputs = (
        ((yaml.safe_load(path.read_text()) or {}).get("outputs") or {})
        if (path := role_dir / "meta" / "outputs.yml").exists()
        else {}
    )
    if outputs:
        out += [
            "## Outputs",
            "",
            "Facts this role sets for the roles and plays after it (`meta/outputs.yml`).",
            "",
            "| fact | what it is |",
            "| --- | --- |",
        ]
        out += [f"| `{name}` | {text(what)} |" for name, what in outputs.items()]
        out.append("")
    used = plays_using(role)
    if used:
        out += ["## Used by", "", "| playbook | play | hosts |", "| --- | --- | --- |"]
        out += [f"| `playbooks/{pb}` | {name} | `{hosts.replace('|', '/')}` |" for pb, name, hosts in used]
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="exit 1 when a README differs from what its role gives")
    args = ap.parse_args()
    stale = []
    for role_dir in sorted((ROOT / "roles").iterdir()):
        if not (role_dir / "meta" / "argument_specs.yml").exists():
            continue
        want, path = readme(role_dir), role_dir / "README.md"
        if args.check:
            if not path.exists() or path.read_text() != want:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.write_text(want)
    if stale:
        print(f"not what their roles give: {', '.join(stale)}: run python scripts/role_readmes.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
