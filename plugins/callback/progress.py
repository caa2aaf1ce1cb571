# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The default stdout callback, with long waits shown as progress instead of "FAILED - RETRYING" lines."""

from __future__ import annotations

DOCUMENTATION = r"""
name: progress
type: stdout
short_description: Default output, with retries of long waits shown as one progress line per host
description:
  - Everything the default callback prints, except that a task retried with C(until) (the roles' waits for
    regeneration, hidden-state extraction, training and server health) does not print
    C(FAILED - RETRYING ... (34560 retries left)) at every poll. Instead each poll gives a progress line
    (training epoch, step, tokens/s and power; regeneration and extraction counts; elapsed time otherwise),
    printed when it changes. On a terminal the line is updated in place.
  - With C(-vv) or more the default retry messages, with their results, are printed as before.
  - After the recap of a run that read the fleet's status (C(status.yml), whose C(set_stats) keeps the
    C(eagle3_status) records), the status table that C(eagle3-ops status) prints, with a row for each host that
    could not be reached or whose read failed, and each host's Proxmox node (C(pct_node)) where the inventory names
    one.
  - After the recap, the wall time of the run per role (time from each task's start to the next one's, summed by
    the outermost role the task runs under - a shared role's task file counts for the role that called it -; tasks
    of the play itself count as C(play)), largest first, to show where a run spends its time; then the five
    tasks that took longest (a task file run several times sums its runs), with their roles.
author: eagle3-ops contributors (@eagle3-ops)
version_added: "0.1.0"
extends_documentation_fragment:
  - ansible.builtin.default_callback
  - ansible.builtin.result_format_callback
requirements:
  - set as stdout callback in ansible.cfg (stdout_callback = eagle3.ops.progress)
"""

import sys
import time

from ansible.plugins.callback.default import CallbackModule as DefaultCallback
from ansible_collections.eagle3.ops.plugins.plugin_utils._progress import render_status, status_table_rows, wait_line


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "eagle3.ops.progress"

    def __init__(self) -> None:
        super().__init__()
        self._wait_started: dict[tuple[str, str], float] = {}
        self._last_line: dict[str, str] = {}
        self._line_open = False  # a progress line on a terminal awaits its newline
        self._tty = sys.stdout.isatty()
        self._role_seconds: dict[str, float] = {}
        self._task_seconds: dict[str, float] = {}
        self._current: tuple[str, str, float] | None = None  # (role of the running task, the task, its start)
        self._run_started = time.monotonic()

    def _clock(self, role: str | None, task: str = "") -> None:
        """Close the running task's time (charged to it and to its role) and start the next one's."""
        now = time.monotonic()
        if self._current is not None:
            name, label, started = self._current
            self._role_seconds[name] = self._role_seconds.get(name, 0.0) + now - started
            self._task_seconds[label] = self._task_seconds.get(label, 0.0) + now - started
        self._current = (role, task, now) if role is not None else None

    def _start(self, task) -> None:
        """Clock a task's start: its time counts for the outermost role it runs under, and for itself (named as
        Ansible names it, under that role where it is another role's task file)."""
        role, name = self._role_of(task), task.get_name()
        self._clock(role, name if role == "play" or name.startswith(role + " : ") else f"{role} > {name}")

    @staticmethod
    def _role_of(task) -> str:
        """The outermost role the task runs under: a shared role's task file (eagle3_common's unit waits,
        pinned_venv) counts for the stage that called it."""
        name, node, seen = "play", task, 0
        while node is not None and seen < 64:
            role = getattr(node, "_role", None)
            if role is not None:
                name = role.get_name()
            node, seen = getattr(node, "_parent", None), seen + 1
        return name

    def _close_line(self) -> None:
        if self._line_open:
            sys.stdout.write("\n")
            sys.stdout.flush()
            self._line_open = False

    def v2_runner_retry(self, result) -> None:
        if self._run_is_verbose(result, verbosity=1):  # -vv (verbosity 2) and more
            super().v2_runner_retry(result)
            return
        host = result.host.get_name()
        task = result.task_name or str(result.task)
        key = (host, task)
        started = self._wait_started.setdefault(key, time.monotonic())
        shown = wait_line(str(result.result.get("stdout", "") or ""))
        if shown is None:
            minutes = int((time.monotonic() - started) // 60)
            shown = f"waiting ({minutes} min)" if minutes else "waiting"
        line = f"  [{host}] {task}: {shown}"
        if self._tty:
            sys.stdout.write("\r\x1b[K" + line)
            sys.stdout.flush()
            self._line_open = True
        elif self._last_line.get(host) != line:
            self._display.display(line)
        self._last_line[host] = line

    # Any other output first ends a progress line left open on the terminal.
    def v2_runner_on_ok(self, result) -> None:
        self._close_line()
        super().v2_runner_on_ok(result)

    def v2_runner_on_failed(self, result, ignore_errors: bool = False) -> None:
        self._close_line()
        super().v2_runner_on_failed(result, ignore_errors=ignore_errors)

    def v2_runner_on_unreachable(self, result) -> None:
        self._close_line()
        super().v2_runner_on_unreachable(result)

    def v2_playbook_on_task_start(self, task, is_conditional) -> None:
        self._close_line()
        self._start(task)
        super().v2_playbook_on_task_start(task, is_conditional)

    def v2_playbook_on_handler_task_start(self, task) -> None:
        self._close_line()
        self._start(task)
        super().v2_playbook_on_handler_task_start(task)

    def v2_playbook_on_stats(self, stats) -> None:
        self._close_line()
        self._clock(None)
        super().v2_playbook_on_stats(stats)
        custom = (getattr(stats, "custom", None) or {}).get("_run", {})
        records = custom.get("eagle3_status")
        if isinstance(records, list):
            self._display.display("FLEET STATUS")
            self._display.display(render_status(status_table_rows(
                records, [h for h, n in stats.dark.items() if n], [h for h, n in stats.failures.items() if n],
                custom.get("eagle3_status_nodes") or {})))
            self._display.display("")
        if self._role_seconds:
            total = time.monotonic() - self._run_started
            self._display.display(f"TIME PER ROLE (wall, {total:.1f} s in all)")
            for name, seconds in sorted(self._role_seconds.items(), key=lambda item: -item[1]):
                self._display.display(f"  {name:<40} {seconds:7.1f} s  {seconds / total:5.1%}" if total else name)
            self._display.display("SLOWEST TASKS")
            for name, seconds in sorted(self._task_seconds.items(), key=lambda item: -item[1])[:5]:
                self._display.display(f"  {seconds:7.1f} s  {name}")
