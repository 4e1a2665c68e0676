"""The TLS context of a model client's httpx pool: built once per process, never where no TLS is spoken.

httpx builds a new `ssl.SSLContext` for every client and loads certifi's bundle into it, 50 to 150 ms of
CPU on the way to the first model request. `tls_context` avoids that cost where it buys nothing:

* a loopback ``http://`` base URL (a local model server, a sidecar) speaks no TLS: its client has
  ``trust_env`` off (so no proxy from the environment applies) and follows no redirect. It gets a context
  that trusts no certificate at all, free to build, which would refuse any TLS peer rather than accept one;
* every other URL gets the context httpx itself would build (``httpx.create_ssl_context``, which honours
  ``SSL_CERT_FILE`` and ``SSL_CERT_DIR`` when ``trust_env`` is on), built once per process for each
  value of those and shared by its clients. Every client of agentlife speaks HTTP/1.1, so the ALPN list
  httpcore sets on the context for each connection is the same for all of them.
"""

from __future__ import annotations

import os
import ssl
import threading

__all__ = ["tls_context"]

_lock = threading.Lock()
_contexts: dict[tuple[bool, str, str], ssl.SSLContext] = {}
_no_tls: list[ssl.SSLContext] = []


def tls_context(scheme: str, *, trust_env: bool) -> ssl.SSLContext:
    """The context for a client whose base URL has ``scheme``; httpx is imported here when needed.

    Thread-safe: two first calls on worker threads build one context, the second waits for the first.
    """
    with _lock:
        if scheme == "http" and not trust_env:
            if not _no_tls:
                # PROTOCOL_TLS_CLIENT verifies certificates and host names, and no root is loaded.
                _no_tls.append(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT))
            return _no_tls[0]
        # The variables httpx reads (from os.environ, as it does) when it builds the context.
        where = (
            (os.environ.get("SSL_CERT_FILE", ""), os.environ.get("SSL_CERT_DIR", ""))
            if trust_env
            else ("", "")
        )
        context = _contexts.get((trust_env, *where))
        if context is None:
            import httpx

            context = _contexts[(trust_env, *where)] = httpx.create_ssl_context(trust_env=trust_env)
        return context
