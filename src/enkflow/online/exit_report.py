"""A runner process that ends without closing its :class:`~enkflow.online.runner.Runner` still tells the server why.

A model written without ``with Runner(...)`` that raises inside its loop ends its process through the
uncaught exception: the server would hear of it only once the runner's heartbeats stopped
(``[online] heartbeat_timeout``), as a runner "killed, hung or cut off", and the exception's text would
be only in the runner's log. So every runner registers here while it is open:

- an uncaught exception (``sys.excepthook``, after the traceback is printed) FAILs the member each open
  runner holds with the exception's type and text, then closes the runner (BYE): the server gives the
  member to another runner at once, and its error names the cause;
- a process that ends otherwise with a runner still open (the end of the script, ``sys.exit``) closes
  it (``atexit``), FAILing a member it still holds as left unfinished.

A KeyboardInterrupt is no model error: the runner only says BYE.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from types import TracebackType
from typing import Protocol


class OpenRunner(Protocol):
    """What this module needs of a runner: the task held (0: none), FAIL and BYE."""

    task: int

    def fail(self, error: str) -> None: ...

    def close(self) -> None: ...


_open: weakref.WeakSet[OpenRunner] = weakref.WeakSet()
_installed = False


def register(runner: OpenRunner) -> None:
    """Report for ``runner`` when the process ends with it open; the hooks are installed once per process."""
    global _installed
    if not _installed:
        _installed = True
        previous = sys.excepthook

        def on_uncaught(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            previous(kind, exc, tb)  # the traceback first: the runner's log holds it whatever follows
            why = f"{kind.__name__}: {exc}" if issubclass(kind, Exception) else None
            _close_all(why)

        sys.excepthook = on_uncaught
        atexit.register(_close_all, "the runner's process ended while it held the member (without expose or close)")
    _open.add(runner)


def forget(runner: OpenRunner) -> None:
    """``runner`` was closed: nothing left to report for it."""
    _open.discard(runner)


def _close_all(why: str | None) -> None:
    """FAIL the member each open runner holds with ``why`` (None: give it back without a failure), then close it."""
    for runner in list(_open):
        try:
            if why is not None and runner.task:
                runner.fail(why)
            runner.close()
        except Exception as exc:  # noqa: BLE001 - the process is ending: say why this report failed, go on
            print(f"enkflow runner: could not report the exit to the server: {exc}", file=sys.stderr, flush=True)
