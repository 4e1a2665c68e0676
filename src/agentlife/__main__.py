"""``python -m agentlife``: the command line (see ``python -m agentlife --help``)."""

from agentlife._cli import main

if __name__ == "__main__":
    raise SystemExit(main())
