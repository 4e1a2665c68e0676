"""The engine: one agent process's lifecycle, from boot to exit. Private; this docstring is its map.

A process runs one job through six states (``agentlife.State``)::

    BOOTING -> HYDRATING -> READY -> EXECUTING -> DRAINING -> TERMINATED

and the modules here each own one part of that road:

``_lifecycle``
    `Runtime`: one job's whole road in one structured-concurrency scope, readable top to bottom. It boots
    (settings, journal, store), hydrates, runs the step loop, drains and cleans up, and turns the outcome
    into the exit code (0, 1, 143). It holds its collaborators as fields and passes them to each other;
    none reads another's state through ``self``:
``_process``
    `ProcessShell`: what lives as long as the process, shared by ``run`` and ``worker``: JSON logs, the
    signal receiver and `HardExit`, the probe server and its `StatusBoard`, telemetry, the lag monitor, all
    closed by one exit stack. ``run`` builds its own; a worker lends its shell to each job.
``_drain``
    `Drain`: the drain flag, reason, event and deadline, the cancel scopes it bounds (a step, delivery) or
    cancels (boot and hydration), and its listeners (a worker's drain fans out to each job's).
``_events``
    `JobEvents`: a job's state machine, observers and counters; `JobBoard`: its entry in ``/status`` and
    its log fields (``job_log_context``), so concurrent jobs never overwrite each other.
``_base``
    The records: `RunOptions` (how the CLI, the worker and the test harness differ), `Hydrated`, `Outcome`.
``_services``
    `JobServices`: what one job opens around its steps (session journal, SSE and job heartbeats, store,
    memory client, MCP servers, LLM client) and their orderly close in cleanup.
``_steps``
    `StepRunner`: running one step (its `StepContext` and cancel scope), the checkpoint after it (fenced,
    retried while the store is unreachable), usage accounting, and parking a step that waits for approval;
    `JobHost`, the `StepHost` a step's calls get.
``_finish``
    `Finisher`: delivery at most once per channel, the terminal status, housekeeping, memories written
    back; `record_crash` and `cleanup`.
``_signals``
    How signals get in and how the process is sure to get out: `EarlySignal` (a signal during the
    agent's imports), the loop's signal receiver plus a watcher thread on the wakeup fd (a tool that
    blocks the loop cannot hold a drain), `HardExit`, and the stack dumps of SIGUSR1/SIGQUIT.
``_hydration``
    `Hydrator`: claim the row and load the checkpoint (mandatory, with store retries), scan the
    journal (5 s), fetch memories (10 s), in that order, each timed.
``_worker``
    `Worker`: the warm pool's process (``python -m agentlife worker``), which boots once and runs up to
    ``--concurrency`` jobs at once in one task group, each a `Runtime` with the worker's shell and store lent
    to it (`job_run`); idle slots share one wait for work; the zombie reaper and the runnable-jobs gauge run
    beside the jobs.

The step API the engine runs (`StepContext`, tool calls, approvals, `ToolAgent`, and what a step needs
from its host: `Booted`, `StepHost`, `DrainState`, `RuntimeStats`) lives one layer down, in ``_step/``.
Hydration's result is the frozen `Hydrated` (job, budget, approvals, where to resume) of ``_base``; the
step and finish paths are built over `Booted` and take `Hydrated` as an argument, so nothing there reads an
optional attribute.

Collaborators take what they need (`StepHost`, the settings, the store, the journal) rather than the
`Runtime`, so each can be built on its own in a test. The engine sits above the step API, observability,
the clients, the journal and the stores and below the tools (``_cli``, ``testing``): see
``tests/test_layers.py``. This ``__init__`` imports nothing, so the command line can install
`EarlySignal` without loading the engine; import from the modules themselves.
"""
