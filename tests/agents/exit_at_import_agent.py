"""An agent module that ends its own import: ``sys.exit(EXIT_AT_IMPORT)``; with ``RAISE_AT_IMPORT=base`` a
BaseException of its own whose message quotes the control-plane token; with ``RAISE_AT_IMPORT=keyboard`` a
``KeyboardInterrupt`` that no signal sent (code that calls ``input()`` at import, a test helper)."""

from __future__ import annotations

import os
import sys


class AgentImportAborted(BaseException):
    """Not an Exception: ``except Exception`` lets it through."""


if os.environ.get("RAISE_AT_IMPORT") == "base":
    raise AgentImportAborted(f"token {os.environ.get('AGENTLIFE_CONTROL_PLANE_TOKEN')} refused")
if os.environ.get("RAISE_AT_IMPORT") == "keyboard":
    raise KeyboardInterrupt
sys.exit(int(os.environ.get("EXIT_AT_IMPORT", "0")))
