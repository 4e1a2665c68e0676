"""The version of agentlife (read by the build backend and by ``python -m agentlife --version``)."""

__version__ = "0.3.0"
