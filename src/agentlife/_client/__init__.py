"""Driving agentlife from an application: `Client` and what it answers with.

The layer above the operations an operator makes (``_jobs/``) and below the tools: an application (a web
backend, a script) starts jobs, reads them, waits for their results and answers them through `Client`,
which runs each operation through the same implementation ``job create|show|list|approve|...`` and the
console use (`create_job`, `read_job_state`, `approve_parked`, `cancel_with_children`, the store's own
``reject``, ``retry`` and ``send_event``), never a copy.

* `_client.py`: `Client`, connected to one store (the URL rules and default of every tool).
* `_views.py`: the frozen records it answers with (`JobSnapshot`, `JobSummary`, `JobPage`).
* `_wait.py`: `result`'s wait for a job's end: the store's end notifications on PostgreSQL, a short
  polling backoff on SQLite, and the typed errors of a job that ended without a result.
* `_blocking.py`: `BlockingClient`, the same operations for code that is not async, on a loop of its own.
"""
