"""The model clients' TLS context: none to load for a loopback http:// server, one per process otherwise.

The default client's is built while the process boots (on the preload thread), so its first call finds it.
"""

from __future__ import annotations

import importlib
import ssl
import threading

import certifi
import pytest

from agentlife._llm._default import default_llm
from agentlife._llm._tls import tls_context, warm
from agentlife._preload import Preloader
from agentlife._providers import PROVIDERS


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


def _pool_context(client: object) -> ssl.SSLContext:
    return client._transport._pool._ssl_context  # type: ignore[attr-defined,no-any-return]


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize(
    ("url", "trust_env"),
    [
        ("https://api.example.test", True),
        ("http://127.0.0.1:9", False),  # loopback: no proxy, so no TLS ever
        ("http://[::1]:9", False),
        ("http://localhost:9", False),
        ("http://models.example.test", True),  # a proxy from the environment could speak TLS
    ],
)
async def test_the_boot_warm_up_builds_the_context_the_default_client_then_uses(
    provider: str, url: str, trust_env: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    row = PROVIDERS[provider]
    env = {"AGENTLIFE_LLM_PROVIDER": provider, "ANTHROPIC_API_KEY": "sk-ant-test"}
    env.update({"ANTHROPIC_BASE_URL": url} if provider == "anthropic" else {"OPENAI_BASE_URL": url + "/v1"})
    assert row.warm is not None
    module, _, function = row.warm.partition(":")
    getattr(importlib.import_module(module), function)(env)
    warmed = tls_context(url.split(":")[0], trust_env=trust_env)
    client = default_llm(env)
    http = client._http if provider == "anthropic" else client  # type: ignore[attr-defined]
    _, pool = http._make_client()
    try:
        assert _pool_context(pool) is warmed  # the first call finds it built: nothing loaded after READY
    finally:
        await pool.aclose()


@pytest.mark.parametrize(
    "url", ["", "not a url", "ftp://example.com", "http://", "http://[::1", "https://h:x/"]
)
def test_a_warm_up_of_a_url_no_client_accepts_builds_nothing_or_fails_harmlessly(url: str) -> None:
    try:
        warm(url)
    except ValueError:  # urlsplit's own refusal: the preloader swallows it, the first call reports it
        assert url == "http://[::1"


def test_a_failing_warm_up_neither_stops_the_others_nor_reaches_the_boot() -> None:
    ran: list[str] = []

    def fails() -> None:
        raise ValueError("Invalid IPv6 URL")

    preloader = Preloader(["json"], [fails, lambda: ran.append("second")]).start()
    assert preloader.wait("json", 30)
    preloader._thread.join(30)
    assert ran == ["second"] and not preloader._thread.is_alive()


def test_the_warm_up_runs_after_the_imports_even_without_modules() -> None:
    ran = threading.Event()
    preloader = Preloader([], [ran.set]).start()
    assert ran.wait(30)
    preloader._thread.join(30)
