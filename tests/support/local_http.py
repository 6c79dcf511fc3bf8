"""One-off HTTP requests to the test's own plain-HTTP servers on the loopback interface.

``httpx.get`` builds a client for every call, and with it a TLS context that loads the CA
bundle: ~50 ms of CPU here, for a request that takes ~4 ms. A test that polls a starting
server or an engine's ``/metrics`` every 20-50 ms with it keeps a core busy beside the
processes it waits for, half of a 2-core machine. These servers speak plain HTTP, so no
TLS context is built (``verify=False`` skips loading the bundle; nothing is verified on
plain HTTP anyway), and a URL that is not plain HTTP on loopback is refused.
"""

from __future__ import annotations

import ipaddress
from typing import Any

import httpx


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(_loopback(url), verify=False, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(_loopback(url), verify=False, **kwargs)


def _loopback(url: str) -> str:
    parsed = httpx.URL(url)
    if parsed.scheme != "http" or not _is_loopback(parsed.host):
        raise ValueError(f"{url!r} is not plain HTTP on the loopback interface")
    return url


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name
        return False
