"""The engine: one agent process's lifecycle, from boot to exit. Private; this docstring is its map.

A process runs one job through six states (``agentlife.State``)::

    BOOTING -> HYDRATING -> READY -> EXECUTING -> DRAINING -> TERMINATED

and the modules here each own one part of that road:

``_lifecycle``
    `Runtime`: the whole process in one structured-concurrency scope, readable top to bottom. It boots
    (services, settings, journal, store), hydrates, runs the step loop, drains and cleans up, and turns
    the outcome into the exit code (0, 1, 143). It is built in layers, one concern per module:
``_base``
    `RuntimeBase`: the process's state as boot and hydration fill it in, the drain flag, observers, the
    transition listener; `RunOptions` (how the CLI and the test harness differ).
``_services``
    The process-level services around a job: session journal, probe server, lag monitor, SSE and job
    heartbeats, telemetry, JSON logs, the memory client; and their orderly close in cleanup.
``_steps``
    Running one step: its `StepContext`, the checkpoint after it (fenced, retried while the store is
    unreachable), usage accounting, and parking a step that waits for approval.
``_finish``
    How a job ends: delivery at most once per channel, the terminal status, housekeeping, memories
    written back, failures the runtime decides (budgets) and crash records.
``_signals``
    How signals get in and how the process is sure to get out: `EarlySignal` (a signal during the
    agent's imports), the loop's signal receiver plus a watcher thread on the wakeup fd (a tool that
    blocks the loop cannot hold a drain), `HardExit`, and the stack dumps of SIGUSR1/SIGQUIT.
``_hydration``
    `Hydrator`: claim the row and load the checkpoint (mandatory, with store retries), scan the
    journal (5 s), fetch memories (10 s), in that order, each timed.
``_worker``
    `Worker`: the warm pool's process (``python -m agentlife worker``), which boots once and runs job after
    job, each in a `JobRun` (the `Runtime` above with the worker's store, status board, telemetry and logs
    lent to it, its ``owns_process`` False so its cleanup leaves them open); the zombie reaper and the
    runnable-jobs gauge run beside the jobs.

The step API the engine runs (`StepContext`, tool calls, approvals, `ToolAgent`, and what a step needs
from its host: `Booted`, `StepHost`, `DrainState`, `RuntimeStats`) lives one layer down, in ``_step/``.
Hydration's result is the frozen `Hydrated` (job, budget, approvals, where to resume) of ``_base``; the
step and finish paths take `Booted` and `Hydrated` as arguments, so nothing there reads an optional
attribute.

Collaborators take what they need (`StepHost`, the settings, the store, the journal) rather than the
`Runtime`, so each can be built on its own in a test. The engine sits above the step API, observability,
the clients, the journal and the stores and below the tools (``_cli``, ``testing``): see
``tests/test_layers.py``. This ``__init__`` imports nothing, so the command line can install
`EarlySignal` without loading the engine; import from the modules themselves.
"""
