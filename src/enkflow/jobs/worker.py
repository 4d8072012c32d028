"""The pilot worker of the dynamic running job scheme (``enkflow worker``).

A worker loops: take the first ID of the cycle's to-do list, run its steps,
write a done-marker, mark it done; until the list is empty (Zheng et al.,
GMD 2020, fig. 3). It

* runs each step as a child process in its own session that the kernel
  kills if the worker dies (``PR_SET_PDEATHSIG``), so a ``kill -9`` of the
  worker leaves no orphan model writing a restart;
* keeps a heartbeat file so that others can tell a dead worker on another
  host (:func:`is_stale`), and requeues stale claims it finds;
* on its time limit, SIGTERM or a lapsed lease on its launcher
  (:mod:`enkflow.jobs.lease`) stops the running child and puts the task
  back at the front of the list;
* confirms a member only after the model exited 0 and its restart was
  committed: the done-marker (``done/task_NNN.json``) is written atomically
  after that, and only then is the ID marked done. Before a member's model
  first runs its restart is kept aside, and every rerun starts from that copy
  (:mod:`enkflow.jobs.protect`): a half-written restart is never accepted, and
  a forecast is never applied twice.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import psutil

from enkflow.errors import EnkflowError
from enkflow.jobs.durations import TaskDurations
from enkflow.jobs.events import EventLog
from enkflow.jobs.files import fingerprint, hostname, read_json, write_json_atomic
from enkflow.jobs.launchers import JOB_ID_VARIABLES
from enkflow.jobs.lease import watch_from_environment
from enkflow.jobs.process import process_alive, runs_a_step
from enkflow.jobs.protect import discard, link_intact, protect, protected_path, restore
from enkflow.jobs.tasks import RestartWrite, Step, StepKind, Task, TaskTable, Unchanged, done_marker, logs_dir
from enkflow.jobs.todo import Claimant, Take, TodoList
from enkflow.shm_names import live_makers, remove_dead_segments

# Lines of a failing step's stderr kept for the error message.
STDERR_TAIL_LINES = 20
# Seconds between SIGTERM and SIGKILL when stopping a child.
KILL_GRACE_S = 5.0
STEP_EXIT_WAIT_S = 10.0  # how long a stopping pilot waits for its steps' processes to end before it sweeps
_PR_SET_PDEATHSIG = 1

try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: no parent-death signal; stale claims still time out
    _prctl = None


def _child_setup(parent: int) -> None:
    # Runs in the child between fork and exec: only async-signal-safe work.
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # The parent may have died before prctl took effect.
        if os.getppid() != parent:
            os._exit(137)


def is_stale(claim: dict[str, Any], heartbeat_dir: Path, lease_s: float) -> bool:
    """Whether the worker holding ``claim`` is gone.

    On this host the claimant's PID (with its creation time) decides at once;
    on another host its heartbeat file must be younger than ``lease_s`` seconds.
    """
    if claim.get("host") == hostname():
        return not process_alive(int(claim["pid"]), claim.get("pid_ctime"))
    hb = read_json(heartbeat_dir / f"{claim['worker'].split('/')[0]}.json")
    t = hb.get("t", 0.0) if isinstance(hb, dict) else 0.0
    return time.time() - max(t, claim.get("since", 0.0)) > lease_s


def kill_orphans(claim: dict[str, Any], heartbeat_dir: Path) -> None:
    """Kill a dead worker's children still running on this host (should PDEATHSIG have missed)."""
    if claim.get("host") != hostname():
        return
    hb = read_json(heartbeat_dir / f"{claim['worker'].split('/')[0]}.json")
    if not isinstance(hb, dict):
        return
    for pid, ctime in hb.get("children", {}).values():
        if process_alive(pid, ctime):
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def requeue_stale(todo: TodoList, table: TaskTable, events: EventLog, *, by: str) -> list[int]:
    """Requeue at the front every task claimed by a dead worker; returns their IDs."""
    hb_dir = todo.dir / "workers"
    stale = todo.requeue_stale(lambda c: is_stale(c, hb_dir, table.lease_s))
    for task, claim in stale:
        kill_orphans(claim, hb_dir)
        events.emit("task_requeue", cycle=table.cycle, task=task, member=_member(table, task), reason="stale", claim=claim, by=by)
    return [t for t, _ in stale]


def _member(table: TaskTable, task: int) -> int | None:
    return task if task <= table.n_members else None


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def timing_record(timings: dict[str, Any]) -> dict[str, float | list[float]]:
    """The entries of ``timings`` that a timing file keeps: numbers (seconds, counts, ratios) and
    lists of numbers (one per MPI rank, e.g. ``rank_cpu_s``)."""
    out: dict[str, float | list[float]] = {}
    for k, v in timings.items():
        if _number(v):
            out[k] = float(v)
        elif isinstance(v, (list, tuple)) and v and all(_number(x) for x in v):
            out[k] = [float(x) for x in v]
    return out


def read_timings(path: Path) -> dict[str, float | list[float]]:
    """The entries of a timing JSON file a step wrote (:func:`timing_record`; empty if none)."""
    d = read_json(path, {})
    return timing_record(d) if isinstance(d, dict) else {}


# Timing keys (seconds) that count as restart/output I/O; ``update_s`` is the in-place restart update.
IO_KEYS = ("read_s", "write_s", "update_s", "output_s")
# Timing keys that count as computation.
COMPUTE_KEYS = ("compute_s", "analysis_s")


def io_seconds(timings: dict[str, float]) -> float:
    """I/O time of a step's timings: the sum of its :data:`IO_KEYS`."""
    return sum(timings.get(k, 0.0) for k in IO_KEYS)


class StopReason(StrEnum):
    """Why a pilot stops before its list is empty (the ``reason`` of its ``job_end`` and
    ``task_requeue`` events)."""

    TIME_LIMIT = "time-limit"
    TIME_AHEAD = "time-ahead"  # its next task would not end before its time limit: left to another pilot
    SIGTERM = "sigterm"
    SIGINT = "sigint"
    LEASE = "lease"  # its launcher's lease lapsed (enkflow.jobs.lease)
    STOPPED = "stopped"  # the stop was set without a reason (at the run's end)
    IDLE = "idle"  # a pilot that spans cycles waited longer than its idle timeout (enkflow.jobs.pilot)
    STUDY_END = "study-end"  # the driver's board says the study has ended


class _Stop(Exception):
    """The worker must stop (time limit or SIGTERM): requeue and leave."""

    def __init__(self, reason: StopReason):
        super().__init__(reason)
        self.reason = reason


@dataclass
class Worker:
    """One pilot: ``threads`` claim loops in one process (one for a pilot job,
    N for the strategy that runs a whole cycle in one allocation).

    ``only`` restricts the worker to one task ID (one-job-per-member strategy).
    ``time_limit_s`` counts from construction; None means no limit. ``durations``: how long
    tasks take (learnt from the tasks run); a task claimed with less time left than it is
    expected to take is put back and the worker stops (a pilot that spans cycles,
    :mod:`enkflow.jobs.pilot`).
    """

    cycle_dir: Path
    worker_id: str
    job_id: str = ""
    threads: int = 1
    only: int | None = None
    time_limit_s: float | None = None
    durations: TaskDurations | None = None
    cpus: int | None = None  # the job's CPUs: tasks that need more are left to others (None: any)
    table: TaskTable = field(init=False)
    todo: TodoList = field(init=False)
    events: EventLog = field(init=False)

    def __post_init__(self) -> None:
        self.cycle_dir = Path(self.cycle_dir)
        self.table = TaskTable.read(self.cycle_dir)
        self.todo = TodoList(self.cycle_dir)
        self.events = EventLog(self.table.events)
        self.t0 = time.time()
        self.deadline = None if self.time_limit_s is None else self.t0 + self.time_limit_s
        self.stop = threading.Event()
        self.stop_reason: StopReason | None = None
        self._children: dict[int, tuple[int, float]] = {}
        self._clock = threading.Lock()
        self.hb_dir = self.cycle_dir / "workers"
        for sub in ("workers", "done", "logs", "timing"):
            (self.cycle_dir / sub).mkdir(exist_ok=True)
        me = psutil.Process()
        self.claimant_base = (hostname(), os.getpid(), me.create_time())
        self.aborted = False
        self.failed = False  # a write of the scheme's own files failed
        self.claimed = 0  # tasks this worker took from the list
        self.first_claim_t: float | None = None  # when it took its first
        self.last_task_end: float | None = None  # when the last task it ran ended (s since the epoch)
        self._skip = frozenset(t.id for t in self.table.tasks.values() if self.cpus is not None and t.cpus > self.cpus)

    # -- lifecycle ------------------------------------------------------------

    def request_stop(self, reason: StopReason) -> None:
        """Ask every loop to stop; running children are stopped and requeued."""
        if not self.stop.is_set():
            self.stop_reason = reason
            self.stop.set()

    def run(self) -> int:
        """Work until the list is empty; 0 on a clean exit, 3 when the experiment must stop."""
        remove_dead_segments()  # a pilot is the study's process on its node: what killed steps left there goes
        self.events.emit("job_start", cycle=self.table.cycle, job=self.job_id, worker=self.worker_id, threads=self.threads)
        try:
            self.work()
        finally:
            self.stop.set()
            try:
                self.events.emit("job_end", cycle=self.table.cycle, job=self.job_id, worker=self.worker_id,
                                 reason=self.stop_reason or ("error" if self.failed else "empty"))
            except EnkflowError as exc:
                print(f"enkflow worker {self.worker_id}: error: {exc}", file=sys.stderr, flush=True)
                self.failed = True
            self.sweep_node()
        return self.exit_status()

    def exit_status(self) -> int:
        """0 after a clean end, 3 when the experiment must stop, 4 when the scheme's own files failed."""
        return 3 if self.aborted else 4 if self.failed else 0

    def work(self, idle_limit_s: float | None = None) -> None:
        """Run the claim loops until the list is empty (or a stop), with the heartbeat meanwhile;
        ``idle_limit_s``: also return once a loop waited this long for the analysis (without a task)."""
        over = threading.Event()
        hb = threading.Thread(target=self._heartbeat, args=(over,), daemon=True)
        hb.start()
        wait_until = None if idle_limit_s is None else time.time() + max(0.0, idle_limit_s)
        loops = [threading.Thread(target=self._loop, args=(n, wait_until), daemon=True) for n in range(self.threads)]
        for t in loops:
            t.start()
        try:
            while any(t.is_alive() for t in loops):
                for t in loops:
                    t.join(timeout=0.2)
                if self.deadline is not None and time.time() >= self.deadline:
                    self.request_stop(StopReason.TIME_LIMIT)
        finally:
            over.set()
            hb.join(timeout=self.table.heartbeat_s + 5.0)
            try:
                (self.hb_dir / f"{self.worker_id}.json").unlink()
            except FileNotFoundError:
                pass

    def sweep_node(self) -> None:
        """Remove the names of this node's segments whose maker is dead, once the makers that are
        processes of this pilot's steps are gone (at most ``STEP_EXIT_WAIT_S``): the ranks of a stopped
        parallel analysis run under SLURM's step daemon, which ends them a moment after the pilot's kill."""
        steps = [step.argv for task in self.table.tasks.values() for step in task.steps]
        deadline = time.monotonic() + STEP_EXIT_WAIT_S
        while any(runs_a_step(pid, steps) for pid in live_makers()) and time.monotonic() < deadline:
            time.sleep(0.1)
        remove_dead_segments()

    def _heartbeat(self, over: threading.Event) -> None:
        path = self.hb_dir / f"{self.worker_id}.json"
        while True:
            with self._clock:
                children = {str(k): list(v) for k, v in self._children.items()}
            try:
                write_json_atomic(path, {"t": time.time(), "host": hostname(), "pid": os.getpid(), "children": children},
                                  durable=False)
            except EnkflowError:
                pass  # a missed beat is harmless; the claim loop reports a full disk
            if over.wait(self.table.heartbeat_s) and not children:
                return

    def _claimant(self, n: int) -> Claimant:
        host, pid, ctime = self.claimant_base
        name = self.worker_id if self.threads == 1 else f"{self.worker_id}/{n}"
        return Claimant(worker=name, host=host, pid=pid, pid_ctime=ctime, job=self.job_id)

    def _loop(self, n: int, wait_until: float | None = None) -> None:
        """Claim loop ``n``. Any error escaping it ends the worker (a pilot that spans cycles too):
        a loop that ended alone would leave its claim held by a live process, which nobody requeues."""
        try:
            self._claim_loop(n, wait_until)
        except EnkflowError as exc:  # a write of the scheme's own files failed (disk full...)
            self._give_up(f"enkflow worker {self.worker_id}: error: {exc}")
        except Exception:
            self._give_up(traceback.format_exc())

    def _give_up(self, message: str) -> None:
        """End this worker for an error of its own, then say why where it can (stderr may be a log
        on the very disk that is full)."""
        self.failed = True
        self.stop.set()
        say(message)

    def _claim_loop(self, n: int, wait_until: float | None) -> None:
        who = self._claimant(n)
        while not self.stop.is_set():
            requeue_stale(self.todo, self.table, self.events, by=who.worker)
            got = self.todo.claim(who, only=self.only, skip=self._skip)
            if got is Take.ABORT:
                self.aborted = True
                self.stop.set()
                return
            if got is Take.EMPTY:
                return
            if got is Take.WAIT:
                if wait_until is not None and time.time() >= wait_until:
                    return
                self.stop.wait(self.table.poll_s)
                continue
            task = self.table.tasks[got]
            with self._clock:
                self.claimed += 1
                if self.first_claim_t is None:
                    self.first_claim_t = time.time()
            if self._too_late(task):
                self.todo.requeue(task.id, reason=StopReason.TIME_AHEAD)
                self.events.emit("task_requeue", cycle=self.table.cycle, task=task.id, member=task.member,
                                 reason=StopReason.TIME_AHEAD, worker=who.worker)
                self.request_stop(StopReason.TIME_AHEAD)
                return
            try:
                self._run_task(task, who)
            except EnkflowError as exc:
                # A write of the scheme's own files failed (disk full...): the claim stays, so the
                # driver requeues the task once this worker is gone, and reports the cause itself.
                self._give_up(f"enkflow worker {who.worker}: {task.label}: error: {exc}")
                return
            except _Stop as stop:
                self.todo.requeue(task.id, reason=stop.reason)
                self.events.emit("task_requeue", cycle=self.table.cycle, task=task.id, member=task.member, reason=stop.reason, worker=who.worker)
                return
            if self.only is not None:
                return

    def _too_late(self, task: Task) -> bool:
        """Whether ``task`` is expected to outlast this worker's time limit."""
        if self.deadline is None or self.durations is None:
            return False
        need = self.durations.expected(task)
        return need is not None and time.time() + need > self.deadline

    # -- one task -----------------------------------------------------------------

    def _marker(self, task: Task) -> Path:
        return done_marker(self.cycle_dir, task.id)

    def _run_task(self, task: Task, who: Claimant) -> None:
        cyc = self.table.cycle
        marker = self._marker(task)
        prot = protected_path(task.restart, cyc) if task.restart else None
        if marker.exists():
            # Confirmed earlier by a worker that died before updating the list.
            self.todo.complete(task.id, who)
            if prot is not None:
                discard(prot)
            return
        attempt = self.todo.snapshot()["claims"].get(str(task.id), {}).get("attempt", 1)
        t_start = time.time()
        self.events.emit("task_start", cycle=cyc, task=task.id, member=task.member, worker=who.worker, job=self.job_id, attempt=attempt)
        prot_fp = self._protect(task, Path(task.restart), prot, who) if task.restart and prot is not None else None
        before = fingerprint(task.restart) if task.restart else None
        run_s = 0.0
        timings: dict[str, float | list[float]] = {}
        for step in task.steps:
            tfile = self.cycle_dir / "timing" / f"task_{task.id:03d}.a{attempt}.{step.name}.json"
            t1 = time.time()
            rc, errlog = self._run_step(task, step, attempt, tfile)
            run_s += time.time() - t1
            # The stderr tail is read only for a failure's report, not after every successful step.
            report = {"returncode": rc, "argv": step.argv, "log": str(errlog), "step": step.name.value}
            if rc != 0:
                deterministic = step.fatal_rc is not None and rc == step.fatal_rc
                if deterministic:
                    report["reason"] = f"exit status {rc}: a deterministic error (bad input or configuration), not retried"
                self._fail(task, who, attempt, report, fatal=deterministic)
                return
            if step.commit:
                if not os.path.exists(step.commit["from"]):
                    report["reason"] = (f"the {step.name} exited 0 but wrote no {{output}} file "
                                        f"(expected {step.commit['from']})")
                    self._fail(task, who, attempt, report, fatal=True)
                    return
                os.replace(step.commit["from"], step.commit["to"])
            if step.name is StepKind.MODEL and task.restart:
                if prot is not None and prot_fp is not None and not link_intact(prot, prot_fp):
                    report["reason"] = ("model.restart_write = 'rename' says the model replaces its restart by "
                                        "renaming a new file over it, but it wrote into the restart in place; "
                                        "set restart_write = 'in-place'")
                    self._fail(task, who, attempt, report, fatal=True)
                    return
                if fingerprint(task.restart) == before:
                    self.events.emit("task_unchanged", cycle=cyc, task=task.id, member=task.member, worker=who.worker,
                                     argv=step.argv, restart=task.restart, policy=task.unchanged.value)
                    if task.unchanged is Unchanged.ERROR:
                        report["reason"] = f"the model exited 0 but left its restart {task.restart} unchanged (model.unchanged = 'error')"
                        self._fail(task, who, attempt, report, fatal=True)
                        return
            for k, v in read_timings(tfile).items():  # steps' seconds add up; per-rank lists are the step's own
                timings[k] = v if isinstance(v, list) else timings.get(k, 0.0) + v
        t_end = time.time()
        rec = {
            "cycle": cyc, "task": task.id, "member": task.member, "worker": who.worker, "job": self.job_id,
            "attempt": attempt, "t_start": t_start, "t_end": t_end, "run_s": run_s, "io_s": io_seconds(timings),
            "timings": timings,
        }
        write_json_atomic(marker, rec)
        self.todo.complete(task.id, who)
        if self.durations is not None:
            self.durations.note(task, run_s)
        self.last_task_end = t_end
        if prot is not None:
            discard(prot)
        self.events.emit("task_end", **rec)

    def _protect(self, task: Task, restart: Path, prot: Path, who: Claimant) -> dict[str, int] | None:
        """Restore the restart from its protected copy (a rerun) or make that copy (the first run).
        Returns the copy's fingerprint for a hard link (to check later that nothing wrote into it)."""
        if prot.exists():
            restore(prot, restart, task.restart_write)
            self.events.emit("task_restore", cycle=self.table.cycle, task=task.id, member=task.member, worker=who.worker,
                             restart=str(restart), protected=str(prot))
        else:
            t0 = time.time()
            how = protect(restart, prot, task.restart_write)
            self.events.emit("task_protect", cycle=self.table.cycle, task=task.id, member=task.member, worker=who.worker,
                             how=how, protect_s=time.time() - t0)
        return fingerprint(prot) if task.restart_write is RestartWrite.RENAME else None

    def _fail(self, task: Task, who: Claimant, attempt: int, report: dict[str, Any], *, fatal: bool) -> None:
        """Record a failed attempt: retried first in line, unless ``fatal`` (a deterministic error)
        or the attempts are used up; then the experiment stops, with the restart restored."""
        cyc = self.table.cycle
        report["stderr_tail"] = _tail(Path(report["log"]))
        limit = 1 if fatal else (task.max_attempts or self.table.max_attempts)
        final = self.todo.fail(task.id, max_attempts=limit, report=report)
        self.events.emit("task_fail", cycle=cyc, task=task.id, member=task.member, worker=who.worker, attempt=attempt,
                         final=final, **report)
        if final:
            if task.restart:
                prot = protected_path(task.restart, cyc)
                if prot.exists():
                    restore(prot, Path(task.restart), task.restart_write)
            self.aborted = True
            self.stop.set()

    def _run_step(self, task: Task, step: Step, attempt: int, tfile: Path) -> tuple[int, Path]:
        """Run one step; returns (exit status, stderr log). Raises _Stop when told to stop."""
        logs = logs_dir(self.cycle_dir)
        stem = f"task_{task.id:03d}.a{attempt}.{step.name}"
        env = dict(os.environ)
        env.update(self.table.env)
        env["ENKFLOW_TIMING_FILE"] = str(tfile)
        env["ENKFLOW_CYCLE"] = str(self.table.cycle)
        if task.member is not None:
            env["ENKFLOW_MEMBER"] = str(task.member)
        errlog = logs / f"{stem}.err"
        with open(logs / f"{stem}.out", "wb") as out, open(errlog, "wb") as err:
            try:
                proc = subprocess.Popen(
                    step.argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env,
                    start_new_session=True, preexec_fn=lambda parent=os.getpid(): _child_setup(parent),
                )
            except OSError as exc:
                err.write(f"cannot start {step.argv[0]!r}: {exc}\n".encode())
                err.flush()
                return 127, errlog
            with self._clock:
                self._children[task.id] = (proc.pid, psutil.Process(proc.pid).create_time() if process_alive(proc.pid) else 0.0)
            try:
                while True:
                    try:
                        return proc.wait(timeout=0.1), errlog
                    except subprocess.TimeoutExpired:
                        pass
                    if self.stop.is_set():
                        _terminate(proc)
                        raise _Stop(self.stop_reason or StopReason.STOPPED)
            finally:
                with self._clock:
                    self._children.pop(task.id, None)


def say(message: str) -> None:
    """``message`` on stderr where it can be written (a job's log may be on the disk that is full)."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass


def _terminate(proc: subprocess.Popen) -> None:
    """SIGTERM the child's process group, SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 30.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _tail(path: Path, lines: int = STDERR_TAIL_LINES) -> str:
    try:
        data = path.read_bytes()[-16384:]
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def run_worker(cycle_dir: str | os.PathLike[str], *, worker_id: str | None = None, job_id: str | None = None,
               threads: int = 1, only: int | None = None, time_limit_s: float | None = None, cpus: int | None = None) -> int:
    """Run a pilot worker on ``cycle_dir`` until its to-do list is empty.

    SIGTERM (as SLURM sends at the time limit or on ``scancel``) stops the
    running task and puts it back at the front. Returns the exit code.
    """
    job = job_id or next((os.environ[v] for v in JOB_ID_VARIABLES if os.environ.get(v)), "")
    wid = worker_id or f"{hostname()}-{os.getpid()}"
    w = Worker(Path(cycle_dir), wid, job_id=job, threads=threads, only=only, time_limit_s=time_limit_s, cpus=cpus)
    signal.signal(signal.SIGTERM, lambda signum, frame: w.request_stop(StopReason.SIGTERM))
    signal.signal(signal.SIGINT, lambda signum, frame: w.request_stop(StopReason.SIGINT))
    # A lapsed lease stops the pilot as SLURM's time limit does: its task is put back, resumable.
    watch_from_environment(f"pilot {wid}", on_lapse=lambda reason: w.request_stop(StopReason.LEASE))
    return w.run()
