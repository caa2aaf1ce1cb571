# Copyright: eagle3-ops contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""SGLang's router (smg): its view of the servers, as the modules report it."""

from __future__ import annotations

from typing import Any


def worker_rows(workers: Any) -> list[dict[str, Any]]:
    """One row per worker of smg's ``GET /workers`` answer: url, healthy, status, load."""
    return [{"url": w.get("url"), "healthy": w.get("is_healthy"), "status": w.get("status"), "load": w.get("load")}
            for w in workers or [] if isinstance(w, dict)]  # fmt: skip


def worker_named(workers: Any, url: str) -> dict[str, Any] | None:
    """The worker of smg's ``/workers`` list (or of worker_rows) whose URL is ``url`` (trailing slashes aside)."""
    want = url.rstrip("/")
    return next((w for w in workers or [] if isinstance(w, dict) and str(w.get("url", "")).rstrip("/") == want), None)
