#!/usr/bin/python
# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_report
short_description: Write a speculative-decoding benchmark report (JSON, markdown table, PNG plot)
description:
  - Takes the points a benchmark sweep measured (the role C(eagle3.ops.spec_bench) records them) and writes
    C(bench.json), C(bench.md) and C(bench.png) into O(dest).
  - Each speculative point's speedup is its output throughput over the baseline of the same engine at the same
    concurrency, measured in the same sweep; a point without such a baseline has none.
  - The plot shows the speedup (a dashed line at 1.0 is no speculation) and the accept length, from 0 and from 1.
  - Each file is written whole to a temporary file beside it and renamed; a failure leaves no partial file.
  - "Runs on the controller (C(delegate_to: localhost)); the plot needs matplotlib in that Python."
version_added: "0.1.0"
author: eagle3-ops contributors (@eagle3-ops)
options:
  points:
    description: The measured points, one per configuration and concurrency.
    type: list
    elements: dict
    required: true
  meta:
    description: What was measured (target, draft, engine, client, hosts, date), shown above the table.
    type: dict
    default: {}
  dest:
    description: Directory of the report; created when missing.
    type: path
    required: true
  plot:
    description: Whether to draw C(bench.png).
    type: bool
    default: true
extends_documentation_fragment:
  - eagle3.ops.attributes
attributes:
  check_mode: {support: full}
  diff_mode: {support: none}
  idempotent: {support: full}
"""

EXAMPLES = r"""
- name: Write the report
  eagle3.ops.bench_report:
    points: "{{ spec_bench_points }}"
    meta: {target: /srv/models/target}
    dest: reports/bench-20261201T120000Z
  delegate_to: localhost
"""

RETURN = r"""
paths:
  description: The files of the report.
  returned: always
  type: dict
  sample: {json: reports/bench-x/bench.json, md: reports/bench-x/bench.md, png: reports/bench-x/bench.png}
markdown:
  description: The table, as written to C(bench.md).
  returned: always
  type: str
"""

import json
import os
import tempfile
from collections.abc import Callable
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.eagle3.ops.plugins.module_utils._bench import check_points, markdown, plot, speedups


class BenchReport:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.dest: str = module.params["dest"]

    def _write(self, name: str, write: Callable[[str], None]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=self.dest)
        os.close(fd)
        try:
            write(tmp)
            os.chmod(tmp, 0o644)
            os.replace(tmp, os.path.join(self.dest, name))
        except BaseException:
            os.unlink(tmp)
            raise

    def run(self) -> dict[str, Any]:
        p = self.module.params
        problems = check_points(p["points"])
        if problems:
            self.module.fail_json(msg="; ".join(problems) + ".")
        points = speedups(p["points"])
        table = markdown(points, p["meta"])
        paths = {k: os.path.join(self.dest, f"bench.{k}") for k in ("json", "md", "png")}
        if not p["plot"]:
            paths.pop("png")
        body = json.dumps({"meta": p["meta"], "points": points}, indent=1) + "\n"
        # The same points again change nothing (the plot is redrawn only with its data or when missing).
        stale = _read(paths["json"]) != body or _read(paths["md"]) != table or (
            p["plot"] and not os.path.exists(paths["png"]))
        if self.module.check_mode or not stale:
            return {"changed": stale, "paths": paths, "markdown": table}
        try:
            os.makedirs(self.dest, exist_ok=True)
            if p["plot"]:
                self._write("bench.png", lambda t: plot(points, t, f"EAGLE-3: {p['meta'].get('target', '')}",
                                                        p["meta"].get("chosen")))  # fmt: skip
            self._write("bench.md", lambda t: _text(t, table))
            self._write("bench.json", lambda t: _text(t, body))
        except ImportError as exc:
            self.module.fail_json(msg=f"Cannot draw {paths['png']}: {exc}; install matplotlib in the controller's "
                                      "Python or set plot: false.")  # fmt: skip
        except OSError as exc:
            self.module.fail_json(msg=f"Cannot write the report into {self.dest}: {exc}; fix its permissions "
                                      "or free space and rerun.")  # fmt: skip
        return {"changed": True, "paths": paths, "markdown": table}


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return None


def _text(path: str, body: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(body)


def main() -> None:
    module = AnsibleModule(
        argument_spec={"points": {"type": "list", "elements": "dict", "required": True},
                       "meta": {"type": "dict", "default": {}},
                       "dest": {"type": "path", "required": True},
                       "plot": {"type": "bool", "default": True}},
        supports_check_mode=True,
    )  # fmt: skip
    module.exit_json(**BenchReport(module).run())


if __name__ == "__main__":
    main()
