"""``python -m agentlife.testing fake-anthropic|fake-openai --port N``: a fake model server."""

from __future__ import annotations

import sys

from agentlife.testing._fake_cli import main

if __name__ == "__main__":
    sys.exit(main())
