"""module_utils/_router.py: smg's /workers answer as rows, and one worker found by its URL."""

from __future__ import annotations

from tests.modules import module_utils

router = module_utils("_router")
WORKERS = [{"url": "http://10.0.0.5:30000/", "is_healthy": True, "status": "ready", "load": 2, "extra": 1},
           "not a worker", {"url": "http://10.0.0.6:30000", "is_healthy": False}]  # fmt: skip


def test_worker_rows_keep_what_the_status_shows():
    assert router.worker_rows(WORKERS) == [
        {"url": "http://10.0.0.5:30000/", "healthy": True, "status": "ready", "load": 2},
        {"url": "http://10.0.0.6:30000", "healthy": False, "status": None, "load": None},
    ]
    assert router.worker_rows(None) == []


def test_worker_named_ignores_trailing_slashes_and_finds_nothing_else():
    assert router.worker_named(WORKERS, "http://10.0.0.5:30000")["load"] == 2
    assert router.worker_named(WORKERS, "http://10.0.0.6:30000/")["is_healthy"] is False
    assert router.worker_named(WORKERS, "http://10.0.0.7:30000") is None
    assert router.worker_named(None, "http://10.0.0.5:30000") is None
