"""The model clients' TLS context: none to load for a loopback http:// server, one per process otherwise."""

from __future__ import annotations

import ssl
import threading

import certifi
import pytest

from agentlife._llm._tls import tls_context


def _roots(context: ssl.SSLContext) -> int:
    return int(context.cert_store_stats()["x509_ca"])


def test_a_loopback_http_client_gets_a_context_that_trusts_nothing_and_costs_nothing() -> None:
    context = tls_context("http", trust_env=False)
    # Were it ever asked for TLS, it would verify the peer against no root at all: refuse, never accept.
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert _roots(context) == 0
    assert tls_context("http", trust_env=False) is context


def test_an_https_client_gets_the_bundle_httpx_would_load_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    context = tls_context("https", trust_env=True)
    assert context.verify_mode is ssl.CERT_REQUIRED and context.check_hostname
    assert _roots(context) > 50  # certifi's bundle
    assert tls_context("https", trust_env=True) is context
    assert tls_context("https", trust_env=False) is not context  # without trust_env, no SSL_CERT_* applies


def test_http_to_another_host_keeps_the_bundle_for_a_proxy_from_the_environment() -> None:
    # trust_env is on there, and an https:// proxy would speak TLS for a plain http:// URL.
    assert _roots(tls_context("http", trust_env=True)) > 50


def test_ssl_cert_file_is_honoured_as_httpx_honours_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    default = tls_context("https", trust_env=True)
    monkeypatch.setenv("SSL_CERT_FILE", certifi.where())
    chosen = tls_context("https", trust_env=True)
    assert chosen is not default and _roots(chosen) > 50
    assert tls_context("https", trust_env=False) is not chosen  # ignored without trust_env, as httpx does


def test_first_calls_on_two_threads_build_one_context() -> None:
    seen: list[ssl.SSLContext] = []
    threads = [
        threading.Thread(target=lambda: seen.append(tls_context("https", trust_env=False))) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(seen) == 4 and all(context is seen[0] for context in seen)
