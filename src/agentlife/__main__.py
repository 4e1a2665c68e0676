"""``python -m agentlife``: the command line (see ``python -m agentlife --help``)."""

from agentlife._cli import exit_now, main

if __name__ == "__main__":
    exit_now(main())
