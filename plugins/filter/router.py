"""Filters for SGLang's router: the URL the router reaches a server at."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# sglang_serve's default port (roles/sglang_serve/defaults/main.yml), for servers that do not set their own.
DEFAULT_SERVER_PORT = 30000


def worker_url(address: Any, port: Any = DEFAULT_SERVER_PORT) -> str:
    """``http://ADDRESS:PORT`` (an IPv6 address in brackets) - a server as its router reaches it."""
    addr = str(address or "").strip()
    if not addr:
        raise ValueError("worker_url needs the server's address (eagle3_address or ansible_host)")
    if ":" in addr and not addr.startswith("["):
        addr = f"[{addr}]"
    return f"http://{addr}:{int(port)}"


def worker_urls(hosts: Iterable[str], hostvars: Mapping[str, Any]) -> list[str]:
    """The worker URL of each server: its ``eagle3_address`` (else ``ansible_host``) and ``sglang_serve_port``."""
    urls = []
    for host in hosts:
        hv = hostvars[host]
        address = hv.get("eagle3_address") or hv.get("ansible_host") or host
        urls.append(worker_url(address, hv.get("sglang_serve_port") or DEFAULT_SERVER_PORT))
    return urls


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"worker_url": worker_url, "worker_urls": worker_urls}
