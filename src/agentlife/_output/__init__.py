"""A running job's output, as its followers see it. Private; this docstring is its map.

``_events``
    `JobEvent` (one event of a job's output: published, status, delta or end) and the cursors a follower
    leaves and rejoins with (`cursor_for`, `parse_cursor`): opaque strings bound to their job.
``_follow``
    `follow_job`: an async iterator over a job's output after a cursor, live or up to now, that ends after
    the job's end; `Client.events` and the HTTP API's SSE stream are built on it.
``_deltas``
    `DeltaBuffer`: the model text a streaming step hands its followers, batched, rate-bounded (drops
    counted), sent by its own task so a slow store or follower never slows the step.

The step's side (``ctx.publish``, the stream's tap) is in ``_step``; the rows, statements and the
followers' ``LISTEN`` connection are in ``stores`` (``_output``, ``_output_sql``, ``_output_watch``,
``_pg_output_listen``). This ``__init__`` imports nothing.
"""
