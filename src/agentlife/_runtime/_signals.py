"""How signals get in, and how the process is sure to get out.

* `EarlySignal`: installed by the command line before the agent's module is imported. A signal during
  that import abandons it (`SignalDuringImport`); one after it is remembered until the runtime's receiver
  is up.
* `receive_drain_signals`: the loop's receiver of `DRAIN_SIGNALS`, plus a watcher thread on the signal
  wakeup fd, so a tool that blocks the event loop cannot keep the drain budget from being enforced.
* `HardExit`: a timer that ``os._exit``s with a settled code when code that ignores cancellation would
  otherwise hold the process past its budget; it first kills the process groups of the child processes
  that must not outlive this one (`agentlife._children`: the MCP stdio servers).
* SIGUSR1 dumps every thread's stack (faulthandler, from C); SIGQUIT dumps them, then quits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator

import anyio
import anyio.abc
import orjson

from agentlife._children import kill_groups
from agentlife._exceptions import SignalDuringImport
from agentlife._exitcode import ExitCode

__all__ = ["DRAIN_SIGNALS", "EarlySignal", "HardExit", "receive_drain_signals"]

#: The signals that drain: Kubernetes sends SIGTERM; Ctrl-C is SIGINT; a supervisor or a closed terminal
#: sends SIGHUP. Each drains the same way and exits 143 with the job resumable.
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class HardExit:
    """The guarantee that code ignoring cancellation cannot hold the process past its budget.

    Thread-safe: armed from the event loop and from the signal watcher thread. Disabled (every method a
    no-op) for in-process runs such as the test harness, where leaving the process is not ours to do.
    """

    def __init__(self, *, enabled: bool) -> None:
        self.enabled = enabled
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()
        self._settled = False

    def arm(self, seconds: float, code: int) -> None:
        """Exit with ``code`` after ``seconds`` unless disarmed; the first timer armed stays."""
        if not self.enabled:
            return
        with self._lock:
            if self._timer is None and not self._settled:
                self._timer = _start_timer(seconds, code)

    def settle(self, seconds: float, code: int) -> None:
        """Replace any timer by one that exits with the settled ``code`` after ``seconds``; no more arming.

        Stays armed until the process really exits: a task the agent started outside our task groups that
        swallows cancellation would otherwise hold the interpreter's shutdown for ever.
        """
        if not self.enabled:
            return
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._settled = _start_timer(seconds, code), True

    def disarm(self) -> None:
        """Cancel the timer and refuse further arming."""
        with self._lock:
            self._settled = True
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None


def _start_timer(seconds: float, code: int) -> threading.Timer:
    timer = threading.Timer(seconds, _hard_exit, args=(code, seconds))
    timer.daemon = True
    timer.start()
    return timer


async def receive_drain_signals(
    request_drain: Callable[[str], None],
    *,
    early: EarlySignal | None,
    on_signal_off_loop: Callable[[], None] | None,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``request_drain(name)`` for every drain signal until cancelled.

    Args:
        request_drain: what a signal does (``Runtime.request_drain``).
        early: a signal caught before this receiver was up, replayed at once.
        on_signal_off_loop: called from a watcher thread as soon as a drain signal arrives, even while
            the event loop is blocked (it arms the hard exit); None installs no watcher.
        task_status: started once the receiver is installed.
    """
    previous = {signum: signal.getsignal(signum) for signum in DRAIN_SIGNALS}
    try:
        with anyio.open_signal_receiver(*DRAIN_SIGNALS) as signals:
            stop_watch = _watch_off_loop(on_signal_off_loop) if on_signal_off_loop else _nothing
            try:
                task_status.started()
                if early is not None and early.is_set():
                    request_drain(early.name)
                async for signum in signals:
                    request_drain(signal.Signals(signum).name)
            finally:
                stop_watch()  # gives the loop its wakeup fd back before the receiver removes its handlers
    finally:
        # The receiver leaves SIG_DFL behind: a signal in the last milliseconds before the process exits
        # would kill it (-15, not 143) or raise KeyboardInterrupt (SIGINT: exit 130). Put back what was
        # there before (the CLI's EarlySignal, which only remembers it).
        for signum, handler in previous.items():
            if handler is not None:
                signal.signal(signum, handler)


def _nothing() -> None:
    return None


def _watch_off_loop(on_signal: Callable[[], None]) -> Callable[[], None]:
    """Call ``on_signal`` from a thread, so a tool that blocks the event loop cannot hold the exit.

    While a tool blocks the loop (``time.sleep`` in an ``async def``, a CPU loop) the loop's signal
    receiver never runs, so nothing would arm the drain budget. A Python-level handler is no answer
    either: it runs only when the main thread gets to check for signals, and the kernel may deliver the
    signal to another thread, leaving the blocked main thread asleep. The C-level handler, in whatever
    thread takes the signal, always writes the signal number to the wakeup fd; so this puts a pipe there,
    and a watcher thread calls ``on_signal`` and forwards each byte to the loop's own wakeup socket, which
    then runs the drain as before. Returns the function that restores the loop's wakeup fd.
    """
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    loop_fd = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    drain_signals = {int(signum) for signum in DRAIN_SIGNALS}

    def watch() -> None:
        try:
            while data := os.read(read_fd, 64):  # b"" once the write end is closed
                if drain_signals.intersection(data):
                    on_signal()
                if loop_fd != -1:
                    with contextlib.suppress(OSError):
                        os.write(loop_fd, data)
        finally:
            os.close(read_fd)

    threading.Thread(target=watch, name="agentlife-signal-watch", daemon=True).start()

    def stop() -> None:
        current = signal.set_wakeup_fd(loop_fd)
        if current != write_fd:  # someone replaced ours meanwhile: keep theirs
            signal.set_wakeup_fd(current)
        os.close(write_fd)

    return stop


def _hard_exit(code: int, seconds: float) -> None:
    sys.stderr.write(
        orjson.dumps(
            {
                "ts": time.time(),
                "level": "CRITICAL",
                "logger": "agentlife.runtime",
                "msg": f"drain budget of {seconds:.1f}s exceeded by code that ignores cancellation: "
                f"exiting {code} now",
            }
        ).decode()
        + "\n"
    )
    sys.stderr.flush()
    kill_groups()  # the stop of the MCP servers will never run: they must not outlive the process
    os._exit(code)


class EarlySignal:
    """Remembers a SIGTERM/SIGINT that arrives before the event loop's receiver is installed.

    The CLI installs it first thing, so a pod stopped while Python is still importing drains cleanly
    (exit 143) instead of dying of the default handler.
    """

    def __init__(self) -> None:
        self.name = "SIGTERM"
        self._event = threading.Event()
        self._import_budget: float | None = None
        self._abandoning = threading.Event()

    def is_set(self) -> bool:
        """Whether a signal arrived."""
        return self._event.is_set()

    @contextlib.contextmanager
    def abandoning_imports(self, budget: float) -> Iterator[None]:
        """While the agent's module imports, a signal abandons the import (`SignalDuringImport`).

        An import may take 25 s or never return; nothing of the job exists yet, so there is nothing to
        save and no reason to wait. Python runs the handler only when the main thread is back between two
        bytecodes, which a blocking call may delay for as long as it blocks (a signal that lands just
        before a ``sleep`` starts does not interrupt it; a C extension may retry on ``EINTR``). So a thread
        reading the signal wakeup fd takes over at once: it sends the signal to the main thread again every
        0.1 s until the import gives way, and past ``budget`` seconds exits 143 itself.
        """
        if self.is_set():
            raise SignalDuringImport(self.name)
        self._import_budget = budget
        stop_watching = self._watch_during_import(budget)
        try:
            yield
        finally:
            self._import_budget = None
            self._abandoning.set()  # stops the repeats: the import is over, one way or the other
            stop_watching()

    def install(self) -> EarlySignal:
        """Take over SIGTERM and SIGINT until the runtime's receiver replaces this handler."""

        def handler(signum: int, frame: object) -> None:
            self.name = signal.Signals(signum).name
            self._event.set()
            if self._import_budget is not None:
                raise SignalDuringImport(self.name)

        for signum in DRAIN_SIGNALS:
            signal.signal(signum, handler)
        _dump_stacks_on_sigusr1()
        signal.signal(signal.SIGQUIT, _dump_stacks_and_quit)
        return self

    def _watch_during_import(self, budget: float) -> Callable[[], None]:
        """Start the thread that sees a drain signal from C, wherever the main thread is; returns its stop."""
        main = threading.main_thread().ident
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        try:
            previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        except ValueError:  # not the main thread (an embedding caller): the handler alone must do
            os.close(read_fd)
            os.close(write_fd)
            return lambda: None
        drain_signals = {int(signum) for signum in DRAIN_SIGNALS}

        def watch() -> None:
            try:
                while data := os.read(read_fd, 64):  # b"" once the write end is closed
                    signum = next((b for b in data if b in drain_signals), None)
                    if signum is not None and main is not None:
                        self._repeat_until_abandoned(main, signum, budget)
                        return
            finally:
                os.close(read_fd)

        threading.Thread(target=watch, name="agentlife-import-signal", daemon=True).start()

        def stop() -> None:
            signal.set_wakeup_fd(previous)
            os.close(write_fd)

        return stop

    def _repeat_until_abandoned(self, main: int, signum: int, budget: float) -> None:
        """Deliver ``signum`` to the main thread every 0.1 s until the import is abandoned, for ``budget`` s.

        Each delivery interrupts a blocking call there and runs the handler, which raises. One raise may
        still be lost (inside a ``__del__`` Python prints and drops it; a module may catch ``BaseException``
        around a slow call), and the next delivery raises again.
        """
        deadline = time.monotonic() + budget
        while not self._abandoning.wait(0.1):
            if time.monotonic() >= deadline:
                _hard_exit(ExitCode.DRAINED, budget)
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(main, signum)


def _dump_stacks_on_sigusr1() -> None:
    """Write every thread's stack to stderr on SIGUSR1, from C, so it works while the loop is blocked.

    The process goes on: how an operator asks a wedged agent where it is.
    """
    import faulthandler

    with contextlib.suppress(ValueError, RuntimeError, OSError):  # stderr without a file descriptor
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)


def _dump_stacks_and_quit(signum: int, frame: object) -> None:
    """SIGQUIT: every thread's stack on stderr, then what SIGQUIT does by default, without a drain.

    The dump runs here, in Python with the GIL held, rather than from C: faulthandler's C handler walking
    every thread while they run could itself crash the process (seen as SIGSEGV instead of SIGQUIT). The
    next attempt resumes as after a SIGKILL.
    """
    import faulthandler

    with contextlib.suppress(ValueError, RuntimeError, OSError):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGQUIT)
