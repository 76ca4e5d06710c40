"""Resolve `tools.search.server_addr` into base URLs.

Accepted: "host:port", "http://host:port", a list of those, or a path to a file or directory written by the
retrieval server's `--save-address-to` (each file holds an address as plain text, or JSON with `url`/`addr`
or `host`+`port`; a directory contributes every file in it, sorted by name).

On a cluster (`urls_for_node`): a loopback address names a server on the launcher's node; a client on another
node (whose IP is not a loopback address) never uses it, and a server on the client's own node comes first.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit


def normalize_url(address: str) -> str:
    address = address.strip().rstrip("/")
    if not address:
        raise ValueError("empty search server address")
    if not address.startswith(("http://", "https://")):
        address = "http://" + address
    return address


def _addresses_in_file(path: Path) -> list[str]:
    text = path.read_text().strip()
    if not text:
        return []
    if text.startswith("{") or text.startswith("["):
        data = json.loads(text)
        items = data if isinstance(data, list) else [data]
        found = []
        for item in items:
            if isinstance(item, str):
                found.append(item)
            elif "url" in item or "addr" in item:
                found.append(item.get("url") or item["addr"])
            elif "host" in item and "port" in item:
                found.append(f"{item['host']}:{item['port']}")
            else:
                raise ValueError(f"{path}: address JSON needs 'url', 'addr' or 'host'+'port', got {item}")
        return found
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _is_address_file(path: Path) -> bool:
    """Skip hidden, temporary and log files that may sit next to the address files."""
    return path.is_file() and not path.name.startswith(".") and path.suffix not in (".tmp", ".log", ".lock")


def _looks_like_path(value: str) -> bool:
    return "/" in value and not value.startswith(("http://", "https://")) or Path(value).exists()


def resolve_server_urls(server_addr: Any) -> list[str]:
    """Return the list of base URLs (no trailing slash); raise ValueError with the fix if there are none."""
    if server_addr is None:
        raise ValueError("tools.search.server_addr is not set (backend local needs a retrieval server address)")
    entries = [server_addr] if isinstance(server_addr, (str, Path)) else list(server_addr)
    if not isinstance(entries, Sequence):
        raise ValueError(f"tools.search.server_addr must be a string, a list or a path, got {server_addr!r}")
    urls: list[str] = []
    for entry in entries:
        entry = str(entry)
        if _looks_like_path(entry):
            path = Path(entry)
            if path.is_dir():
                for file in sorted(p for p in path.iterdir() if _is_address_file(p)):
                    urls.extend(normalize_url(a) for a in _addresses_in_file(file))
            elif path.is_file():
                urls.extend(normalize_url(a) for a in _addresses_in_file(path))
            else:
                raise ValueError(
                    f"tools.search.server_addr {entry!r} looks like a path but does not exist; start the "
                    "retrieval server with --save-address-to there, or give host:port"
                )
        else:
            urls.append(normalize_url(entry))
    if not urls:
        raise ValueError(f"no retrieval server address found in tools.search.server_addr={server_addr!r}")
    return urls


def is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def urls_for_node(urls: Sequence[str], node_ip: str | None, home_ip: str | None = None) -> tuple[list[str], list[str]]:
    """(servers on this node, the other usable servers) for a client on ``node_ip``; ``home_ip`` is the node the
    addresses were written on (the launcher's), where a loopback address points. A client on another node whose
    own IP is not a loopback address cannot use a loopback address: ValueError when nothing else is left.
    ``node_ip`` None (not on a cluster): every URL is usable and none is preferred."""
    if node_ip is None:
        return [], list(urls)
    on_home = home_ip is None or node_ip == home_ip or is_loopback_host(node_ip)
    usable = list(urls) if on_home else [u for u in urls if not is_loopback_host(urlsplit(u).hostname)]
    if not usable:
        raise ValueError(
            f"tools.search.server_addr {list(urls)} is a loopback address of node {home_ip}, but this worker runs "
            f"on node {node_ip}, another machine. Fix: retrieval.per_node=true (a server on every node), "
            "retrieval.host=0.0.0.0 for the launched server, or the address of a server every node can reach "
            "(host:port)."
        )

    def here(url: str) -> bool:  # on this node: its own IP, or a loopback address on the launcher's node
        host = urlsplit(url).hostname
        return host == node_ip or (node_ip == home_ip and is_loopback_host(host))

    local = [u for u in usable if here(u)]
    return local, [u for u in usable if u not in local]
