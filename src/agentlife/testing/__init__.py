"""Test helpers for agent authors: the in-process harness, the pytest plugin, stub servers.

Importing this package is cheap; the stub servers import aiohttp when they start.
"""

from __future__ import annotations

__all__: list[str] = []
