"""An agent module that calls ``sys.exit(EXIT_AT_IMPORT)`` while it is imported."""

from __future__ import annotations

import os
import sys

sys.exit(int(os.environ.get("EXIT_AT_IMPORT", "0")))
