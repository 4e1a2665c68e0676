"""What a process shows about itself.

Probes and their HTTP server, the status board, heartbeats (SSE and the job row's), telemetry and
Prometheus, and the event-loop lag monitor.

Private; import from the modules themselves. This ``__init__`` imports nothing.
"""
