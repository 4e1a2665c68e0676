"""This machine's addresses, for tests that must reach a local server the way a remote one is reached."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

import pytest

#: Proxy variables a client honours for a host that is not loopback: unset where such a test runs.
PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def non_loopback_address() -> str:
    """An IPv4 address of this machine that is not a loopback address (the test fails if it has none).

    A model client treats ``127.0.0.0/8`` as this machine and speaks to it without httpx; a server bound to
    this address is reached through httpx, as a remote one is.
    """
    candidates: list[str] = []
    for probe in ("192.0.2.1", "10.255.255.254", "8.8.8.8"):  # a UDP connect sends nothing: it picks a route
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                candidates.append(s.getsockname()[0])
        except OSError:
            continue
    with contextlib.suppress(OSError):
        candidates += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
    for address in candidates:
        if not ipaddress.ip_address(address).is_loopback:
            return str(address)
    pytest.fail("this machine has no IPv4 address besides loopback: the httpx transport cannot be reached")
