"""A pilot that outlives its cycle (``[jobs] pilots = "study"``).

Zheng et al.'s pilots leave once their cycle's to-do list is empty, so every cycle queues
again, and the queue wait is most of a busy cluster's time to solution. This pilot stays:

* it works the cycle the driver names on the study's board (``EXPDIR/board.json``, a
  :class:`Board`) with a :class:`~enkflow.jobs.worker.Worker`, exactly as a pilot of one cycle
  does (the same to-do list, locks, protected restarts and events);
* once that list is empty it waits, holding its CPUs, while the cycle's analysis runs (one of
  the pilots runs it) and takes the next cycle's forecasts as soon as the driver releases them;
* it leaves when it has been idle for ``--idle-timeout`` seconds, when the board says the study
  ended, on SIGTERM or a lapsed lease, and before a task that its time limit would cut short
  (the task goes back to the front of the list for another pilot).

Its waits are recorded as ``pilot_wait`` events (``idle_s``, the cycle it then joined or was
waiting for when it left), which the report shows as their own term.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import EnkflowError
from enkflow.jobs.durations import TaskDurations
from enkflow.jobs.events import EventLog
from enkflow.jobs.files import hostname, read_json, write_json_atomic
from enkflow.jobs.launchers import JOB_ID_VARIABLES
from enkflow.jobs.lease import watch_from_environment
from enkflow.jobs.tasks import TASKS_FILE
from enkflow.jobs.worker import StopReason, Worker, say
from enkflow.shm_names import remove_dead_segments

@dataclass(frozen=True)
class Board:
    """What the driver tells its pilots: the cycle released to them (``cycle``, its directory
    ``cycle_dir``; None before the first), the study's event log, and whether the study has ended."""

    cycle: int | None = None
    cycle_dir: str | None = None
    events: str | None = None
    end: bool = False

    @classmethod
    def read(cls, path: Path) -> "Board":
        d = read_json(path, {})
        if not isinstance(d, dict):
            return cls()
        cycle = d.get("cycle")
        return cls(int(cycle) if cycle is not None else None, d.get("cycle_dir"), d.get("events"), bool(d.get("end", False)))

    def write(self, path: Path) -> None:
        write_json_atomic(path, {"cycle": self.cycle, "cycle_dir": self.cycle_dir, "events": self.events, "end": self.end})


@dataclass
class Pilot:
    """One pilot job over the study's cycles (see the module's docstring); times in seconds,
    ``time_limit_s`` counted from construction; ``threads`` tasks side by side, in ``cpus`` CPUs
    (a task that needs more is left to another pilot); ``poll_s``: how often it looks at the board before
    its first cycle (then the cycle's ``poll_s``)."""

    board: Path
    worker_id: str
    job_id: str = ""
    time_limit_s: float | None = None
    idle_timeout_s: float = 120.0
    poll_s: float = 0.2
    threads: int = 1
    cpus: int | None = None
    durations: TaskDurations = field(default_factory=TaskDurations)

    def __post_init__(self) -> None:
        self.t0 = time.time()
        self.deadline = None if self.time_limit_s is None else self.t0 + self.time_limit_s
        self.stop = threading.Event()
        self.stop_reason: StopReason | None = None
        self.worker: Worker | None = None
        self._lock = threading.Lock()

    def request_stop(self, reason: StopReason) -> None:
        """Leave: the running task (if any) is stopped and put back at the front of its list."""
        with self._lock:
            if not self.stop.is_set():
                self.stop_reason = reason
                self.stop.set()
            if self.worker is not None:
                self.worker.request_stop(reason)

    def run(self) -> int:
        """Work the board's cycles until a reason to leave; the exit status of
        :meth:`~enkflow.jobs.worker.Worker.exit_status`."""
        remove_dead_segments()
        board = Board.read(self.board)
        events = self._events(board)
        events.emit("job_start", cycle=board.cycle, job=self.job_id, worker=self.worker_id, threads=self.threads, span="study")
        idle_since = time.time()
        try:
            while not self.stop.is_set():
                board = Board.read(self.board)
                if board.end:
                    self.stop_reason = StopReason.STUDY_END
                    break
                why = self._reason_to_leave(idle_since)
                if why is not None:
                    self.stop_reason = why
                    break
                w = self._worker_for(board)
                if w is not None and self.worker is not w:
                    self._switch(w)
                if self.worker is not None and self._has_work(self.worker):
                    w, first = self.worker, self.worker.first_claim_t
                    w.work(idle_limit_s=self.idle_timeout_s - (time.time() - idle_since))
                    if w.aborted or w.failed or w.stop_reason is not None:
                        self.stop_reason = self.stop_reason or w.stop_reason
                        break
                    if first is None and w.first_claim_t is not None:  # joined this cycle: what it waited for it
                        w.events.emit("pilot_wait", cycle=w.table.cycle, job=self.job_id, worker=self.worker_id,
                                      idle_s=w.first_claim_t - idle_since, joined=True)
                    idle_since = max(idle_since, w.last_task_end or idle_since)
                    continue
                self.stop.wait(self.worker.table.poll_s if self.worker is not None else self.poll_s)
        except EnkflowError as exc:  # a write of the study's files failed (disk full...): leave; the driver reports it
            say(f"enkflow pilot {self.worker_id}: error: {exc}")
            return 4
        finally:
            self._leave(events, board, idle_since)
        return self.worker.exit_status() if self.worker is not None else 0

    def _events(self, board: Board) -> EventLog:
        if board.events is None:
            raise EnkflowError(f"{self.board}: no study's board here (a pilot is started by the driver, once it has "
                               "released a cycle)")
        return EventLog(board.events)

    def _worker_for(self, board: Board) -> Worker | None:
        """The worker of the board's cycle: the current one, a new one once its task table is
        written, or None before the first cycle is released."""
        if board.cycle is None or board.cycle_dir is None:
            return self.worker
        if self.worker is not None and self.worker.table.cycle == board.cycle:
            return self.worker
        cycle_dir = Path(board.cycle_dir)
        if not (cycle_dir / TASKS_FILE).exists():
            return self.worker
        left = None if self.deadline is None else max(0.0, self.deadline - time.time())
        return Worker(cycle_dir, self.worker_id, job_id=self.job_id, time_limit_s=left, durations=self.durations,
                      threads=self.threads, cpus=self.cpus)

    def _switch(self, w: Worker) -> None:
        """Move on to ``w``'s cycle; what the cycles worked so far took is learnt first."""
        if self.worker is not None:
            self.durations.learn(self.worker.cycle_dir)
        with self._lock:
            self.worker = w
            if self.stop.is_set():
                w.request_stop(self.stop_reason or StopReason.STOPPED)

    @staticmethod
    def _has_work(w: Worker) -> bool:
        """Whether the cycle's list has a task to claim, read without its lock (the list is
        replaced atomically; a task missed now is seen at the next look)."""
        d = read_json(w.todo.path, None)
        if not isinstance(d, dict):
            return False
        return bool(d.get("pending")) or bool(d.get("failed"))

    def _reason_to_leave(self, idle_since: float) -> StopReason | None:
        now = time.time()
        if now - idle_since > self.idle_timeout_s:
            return StopReason.IDLE
        if self.deadline is not None:
            if now >= self.deadline:
                return StopReason.TIME_LIMIT
            need = self.durations.expected_s(analysis=False)
            if need is not None and now + need > self.deadline:
                return StopReason.TIME_AHEAD
        return None

    def _leave(self, events: EventLog, board: Board, idle_since: float) -> None:
        w = self.worker
        reason = self.stop_reason or (w.stop_reason if w is not None else None)
        failed = w is not None and (w.aborted or w.failed)
        try:
            if w is not None:
                events = w.events
                if reason is not StopReason.STUDY_END:
                    w.events.emit("pilot_wait", cycle=board.cycle, job=self.job_id, worker=self.worker_id,
                                  idle_s=time.time() - idle_since, joined=False)
            events.emit("job_end", cycle=w.table.cycle if w is not None else board.cycle, job=self.job_id,
                        worker=self.worker_id, reason=reason or ("error" if failed else "empty"), span="study")
        except EnkflowError as exc:  # a full disk: the driver reports it; the pilot still leaves
            if w is not None:
                w.failed = True
            say(f"enkflow pilot {self.worker_id}: error: {exc}")
        if w is not None:
            w.sweep_node()
        else:
            remove_dead_segments()


def run_pilot(board: str | os.PathLike[str], *, worker_id: str | None = None, job_id: str | None = None,
              time_limit_s: float | None = None, idle_timeout_s: float = 120.0, poll_s: float = 0.2, threads: int = 1,
              cpus: int | None = None) -> int:
    """Run a pilot on the study's ``board`` until it leaves (SIGTERM, as SLURM sends at the time
    limit or on ``scancel``, stops the running task and puts it back at the front)."""
    job = job_id or next((os.environ[v] for v in JOB_ID_VARIABLES if os.environ.get(v)), "")
    wid = worker_id or f"{hostname()}-{os.getpid()}"
    p = Pilot(Path(board), wid, job_id=job, time_limit_s=time_limit_s, idle_timeout_s=idle_timeout_s, poll_s=poll_s,
              threads=threads, cpus=cpus)
    signal.signal(signal.SIGTERM, lambda signum, frame: p.request_stop(StopReason.SIGTERM))
    signal.signal(signal.SIGINT, lambda signum, frame: p.request_stop(StopReason.SIGINT))
    watch_from_environment(f"pilot {wid}", on_lapse=lambda reason: p.request_stop(StopReason.LEASE))
    return p.run()
