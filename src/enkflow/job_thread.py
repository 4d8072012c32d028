"""One background thread that runs jobs in order, for work off a caller's critical path
(the online server's checkpoints, the mean/spread files' requests). The first error is kept,
later jobs are skipped, and the caller's thread raises it at its next :meth:`~JobThread.submit`
or :meth:`~JobThread.wait`."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable


class JobThread:
    def __init__(self, name: str):
        self._q: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._q.get()
            if job is None:
                return
            try:
                if self._error is None:
                    job()
            except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
                self._error = exc
            finally:
                self._q.task_done()

    def check(self) -> None:
        """Raise the first error of a job, if any."""
        if self._error is not None:
            raise self._error

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job`` (raises an earlier job's error instead)."""
        self.check()
        self._q.put(job)

    def wait(self) -> None:
        """Until every queued job is done; raises the first error."""
        self._q.join()
        self.check()

    def close(self) -> None:
        """Stop the thread once the queued jobs are done."""
        self._q.put(None)
        self._thread.join()
