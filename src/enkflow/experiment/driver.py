"""The offline cycle driver (``enkflow run``).

For each cycle: write the task table and the to-do list, submit the jobs of
the chosen strategy, watch the list (requeueing tasks of dead workers,
resubmitting jobs for tasks no live job covers), and once the analysis is
confirmed done cancel the jobs still queued and record the cycle as finished.
Everything is recorded in ``events.jsonl`` and in files under
``EXPDIR/cycles/NNNN``, so a rerun resumes where a crash stopped.

The cycles are :func:`~enkflow.experiment.cycling.run_cycles`: the forecast
(the :class:`~enkflow.experiment.cycling.Propagator`) starts or resumes a
cycle and watches until every member task is done, the analysis watches on
until the analysis task (:mod:`enkflow.experiment.analysis_task`, which runs
:func:`~enkflow.experiment.cycling.analyse` on the member files) is done. One
watch spans both: the jobs of a strategy may run members and analysis alike.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from enkflow.errors import DETERMINISTIC_ERROR_RC, ConfigError, EnkflowError, MemberError
from enkflow.experiment import checks, provenance
from enkflow.experiment.initial_statistics import write_initial_from_restarts
from enkflow.experiment.provenance import RestartState
from enkflow.experiment.config import ExperimentConfig, Initial
from enkflow.experiment.cycling import run_cycles
from enkflow.experiment.directory import CycleDir
from enkflow.experiment.from_archive import restore_offline
from enkflow.experiment.lock import DriverLock
from enkflow.experiment.run_lease import RunLease
from enkflow.experiment.output_setup import background_archiver
from enkflow.experiment.settings_diff import describe, recorded_changes
from enkflow.experiment.state import ExperimentState
from enkflow.experiment.study_output import StudyOutput
from enkflow.fsutil import write_bytes_atomic
from enkflow.jobs import launchers
from enkflow.jobs.events import EventLog
from enkflow.jobs.files import fingerprint, log_tail, newest, read_json, write_json_atomic
from enkflow.jobs.protect import place
from enkflow.jobs.launcher import JobState, Launcher
from enkflow.jobs.pilot import Board
from enkflow.jobs.strategies import JobRole, PilotSpan, PlannedJob, Resources, Strategy, plan
from enkflow.jobs.tasks import RestartWrite, Step, StepKind, Task, TaskTable, logs_dir
from enkflow.jobs.todo import TodoList, remaining
from enkflow.jobs.worker import requeue_stale
from enkflow.output.remote import ServiceLost


def archived_restarts(cfg: ExperimentConfig) -> list[tuple[Path, str, str]]:
    """What an offline cycle archives: every member's restart, (path, archived name, target key)."""
    out = []
    for m in range(1, cfg.experiment.members + 1):
        p = cfg.restart_path(m)
        out.append((p, f"member_{m:04d}.{p.name}", f"member:{m}"))
    return out


def make_launcher(cfg: ExperimentConfig, *, colocated: int | None = None) -> Launcher:
    """The launcher ``[launcher]`` asks for, its files in the experiment directory
    (``colocated``: see :meth:`enkflow.jobs.launchers.LauncherType.from_config`)."""
    return launchers.make_launcher(cfg.launcher, cfg.dir.launcher(cfg.launcher.kind), colocated=colocated)


def _argv(template: str, values: dict[str, object]) -> list[str]:
    # Split first, then fill in: a path with spaces stays one argument.
    return [tok.format(**values) for tok in shlex.split(template)]


def _fmt_length(x: float) -> str:
    return f"{x:g}"


def build_tasks(cfg: ExperimentConfig, cycle: int, events: Path) -> TaskTable:
    """The task table of ``cycle``: one forecast (+ operator) per member, then the analysis."""
    n = cfg.experiment.members
    cdir = cfg.dir.cycle(cycle)
    obs = cfg.obs_path(cycle)
    tasks: dict[int, Task] = {}
    for m in range(1, n + 1):
        restart = cfg.restart_path(m)
        workdir = cdir.work(m)
        workdir.mkdir(parents=True, exist_ok=True)
        tmp = restart.with_name(f".{restart.name}.enkflow-{cycle}.tmp")
        values = {"member": m, "cycle": cycle, "restart": restart, "length": _fmt_length(cfg.experiment.forecast_length),
                  "output": tmp, "expdir": cfg.expdir, "workdir": workdir}
        uses_output = "{output}" in cfg.model.command
        steps = [Step(StepKind.MODEL, _argv(cfg.model.command, values),
                      commit={"from": str(tmp), "to": str(restart)} if uses_output else None)]
        if cfg.observations.operator:
            final = cfg.operator_output(m, cycle)
            op_tmp = None if final is None else final.with_name(f".{final.name}.tmp")
            if final is not None:
                final.parent.mkdir(parents=True, exist_ok=True)
            ov = {"member": m, "cycle": cycle, "restart": restart, "obs": obs, "output": op_tmp or "", "expdir": cfg.expdir}
            steps.append(Step(StepKind.OPERATOR, _argv(cfg.observations.operator, ov),
                              commit={"from": str(op_tmp), "to": str(final)} if final is not None and "{output}" in cfg.observations.operator else None))
        tasks[m] = Task(m, m, steps, restart=str(restart),
                        restart_write=RestartWrite.RENAME if uses_output else cfg.model.restart_write,
                        unchanged=cfg.model.unchanged, cpus=cfg.jobs.cpus_per_job)
    at = cfg.analysis_task
    prefix = shlex.split(at.launcher) if at.launcher.strip() else []
    if at.command is not None:
        av = {"cycle": cycle, "expdir": cfg.expdir, "members": n, "obs": obs, "config": cfg.dir.config}
        argv = prefix + _argv(at.command, av)
    else:
        argv = prefix + [cfg.launcher.python or sys.executable, "-m", "enkflow.experiment.analysis_task", str(cfg.expdir), str(cycle)]
    fatal = None if at.command is not None else DETERMINISTIC_ERROR_RC
    tasks[n + 1] = Task(n + 1, None, [Step(StepKind.ANALYSIS, argv, fatal_rc=fatal)], max_attempts=at.max_attempts,
                        cpus=cfg.jobs.analysis_cpus)
    return TaskTable(cycle=cycle, n_members=n, tasks=tasks, events=str(events),
                     max_attempts=cfg.model.max_attempts, heartbeat_s=cfg.jobs.heartbeat, lease_s=cfg.jobs.lease,
                     poll_s=cfg.jobs.poll, env=dict(cfg.model.env))


@dataclass
class _Job:
    id: str
    role: JobRole
    covers: frozenset[int] | None
    t_submit: float
    cpus: int = 1
    state: JobState = JobState.PENDING


@dataclass
class _Cycle:
    """The watch over one cycle's to-do list, from its forecast to the end of its analysis."""

    number: int
    cdir: Path
    table: TaskTable
    todo: TodoList
    res: Resources
    t0: float = field(default_factory=time.time)
    submitted: int = 0
    serial: int = 0  # rounds of submissions
    last_msg: str = ""
    snap: dict | None = None  # the snapshot the last watch stopped on: the next one starts from it
    next_cycle: int | None = None  # the study's next cycle (pilots that span cycles are submitted for it ahead)
    ahead_at: float | None = None  # when the next cycle's pilots are due (None: once the analysis may start)
    # Tasks an earlier run recorded as failed for good (a rerun without --retry-failed stops at them).
    failed_before: frozenset[int] = frozenset()


@dataclass
class Experiment:
    """Runs the cycles of ``cfg``. ``progress`` receives one-line status messages;
    ``on_cycle_end(cycle)`` is called after each cycle's analysis is confirmed."""

    cfg: ExperimentConfig
    launcher: Launcher | None = None
    progress: Callable[[str], None] | None = None
    on_cycle_end: Callable[[int], None] | None = None
    jobs: list[_Job] = field(default_factory=list, init=False)  # the cycle's jobs
    pilots: list[_Job] = field(default_factory=list, init=False)  # pilots that span cycles (jobs.pilots = "study")
    _cycle: _Cycle | None = field(default=None, init=False, repr=False)
    _retry_failed: bool = field(default=False, init=False, repr=False)
    _output: StudyOutput | None = field(default=None, init=False, repr=False)  # while the cycles run
    _lease: RunLease | None = field(default=None, init=False, repr=False)  # the jobs' lease, while run() runs
    _cycles: list[int] = field(default_factory=list, init=False, repr=False)  # the cycles this run runs
    _last_length: float | None = field(default=None, init=False, repr=False)  # the last cycle's seconds, start to end

    def __post_init__(self) -> None:
        self.dir = self.cfg.dir
        self.expdir = self.dir.root
        self.expdir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.dir.events)
        if self.launcher is None:
            self.launcher = make_launcher(self.cfg)

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    def check(self, cycles: list[int], *, source: bool = False) -> None:
        """Pre-flight checks: commands, every cycle's observation file, restart structure."""
        checks.check_commands(self.cfg)
        checks.check_observations(self.cfg, cycles)
        checks.check_restarts(self.cfg, source=source)

    def run(self, *, retry_failed: bool = False, accept_restarts: bool = False, from_archive: int | None = None) -> list[int]:
        """Run (or resume) every cycle; returns the cycles run by this call.

        ``retry_failed`` puts tasks that failed for good back in line (after the
        cause was fixed); ``accept_restarts`` starts or resumes from restarts that
        another experiment advanced or that changed since this one wrote them;
        ``from_archive`` first restores the restarts archived after that cycle
        (checksums verified before anything is written) and continues from the next
        cycle (:mod:`enkflow.experiment.from_archive`).
        Holds the experiment directory's lock throughout (:class:`DriverLock`), and the run's lease
        (:class:`~enkflow.experiment.run_lease.RunLease`), under which every job runs.
        """
        self._lease = RunLease(self.dir, self.cfg.launcher.lease_timeout, self.events, self._say)
        with DriverLock(self.dir.lock), self._lease:
            if from_archive is not None:
                restore_offline(self.cfg, from_archive, self.events, progress=self.progress)
            return self._run(retry_failed=retry_failed, accept_restarts=accept_restarts)

    def _run(self, *, retry_failed: bool, accept_restarts: bool) -> list[int]:
        cfg = self.cfg
        digests = cfg.digests()
        members = range(1, cfg.experiment.members + 1)
        state = ExperimentState.load(self.dir.state)
        resumed = state is not None
        todo_cycles = [k for k in cfg.cycle_numbers if state is None or k not in state.cycles_done]
        if state is None:
            # Every check before anything is written: the restarts checked are the initial ones.
            self.check(todo_cycles, source=True)
            sources = [cfg.source_restart_path(m) for m in members]
            if not accept_restarts:
                provenance.check_new(sources, self.expdir)
            if cfg.experiment.initial is Initial.COPY:
                self._copy_initial()
            write_initial_from_restarts(cfg)  # the report's cycle 0
            state = ExperimentState.create(self.dir.state, digests, {str(p): fingerprint(p) for p in sources})
        else:
            state.check_finished(self.cfg)
            self.check(todo_cycles)
            if not accept_restarts:
                provenance.check_resume([cfg.restart_path(m) for m in members], self.expdir)
        write_json_atomic(self.dir.config, cfg.to_json())
        # For external analysis programs: the restarts the cycles advance, one path per line, member 1 first.
        write_bytes_atomic(self.dir.restarts_list, "".join(f"{cfg.restart_path(m)}\n" for m in members).encode())
        if resumed:
            self._cancel_earlier_jobs()
        self.events.emit("resume" if resumed else "experiment_start", cycles=todo_cycles, members=cfg.experiment.members,
                         strategy=cfg.jobs.strategy.value, launcher=cfg.launcher.kind.value, accept_restarts=accept_restarts)
        self._cycles = todo_cycles

        archiver = background_archiver(cfg, self.events, self.progress)
        if archiver is not None:
            archiver.poll()  # cycles an earlier run staged but did not archive

        def cycle_end(k: int, diag: dict[str, float]) -> None:
            out.analysed(k)
            if archiver is not None:
                # Before the cycle counts as done: a crash in between stages it again on the rerun.
                archiver.stage(k, archived_restarts(cfg), {"mode": "offline", "members": cfg.experiment.members})
            provenance.mark([cfg.restart_path(m) for m in members], self.expdir, k, RestartState.ANALYSED)
            state.mark_done(k, digests)
            if self.on_cycle_end is not None:
                self.on_cycle_end(k)

        self._retry_failed = retry_failed
        out = self._output = StudyOutput(cfg, self.events, self._say)
        if todo_cycles:
            out.start_service()
        try:
            out.start_files(state.cycles_done)
            run_cycles(todo_cycles, self, self.analysis, on_cycle_end=cycle_end)
            if archiver is not None:
                archiver.finish()
            out.finish()
        except ServiceLost as exc:
            out.lose(str(exc))
            raise
        finally:
            self._end_pilots()
            out.close()  # after a failure: what can still be written is
            self.launcher.close()
            if archiver is not None:
                archiver.close()
        self.events.emit("experiment_end", cycles=cfg.cycle_numbers)
        return todo_cycles

    def _copy_initial(self) -> None:
        """``experiment.initial = "copy"``: the experiment's own copy of the initial ensemble."""
        for m in range(1, self.cfg.experiment.members + 1):
            dst = self.cfg.restart_path(m)
            dst.parent.mkdir(parents=True, exist_ok=True)
            place(self.cfg.source_restart_path(m), dst)
        self._say(f"copied the initial ensemble to {self.dir.restarts}")

    # -- one cycle -----------------------------------------------------------------

    def _resume_table(self, cycle: int, cdir: CycleDir) -> TaskTable:
        """The task table of a started cycle, rebuilt from the current configuration when the
        steps that already ran did not depend on what changed."""
        cfg = self.cfg
        now = cfg.digests()
        was = read_json(cdir.digests, now)
        n = cfg.experiment.members
        done = [m for m in range(1, n + 1) if cdir.done(m).exists()]
        if was["model"] != now["model"] and done:
            changes = recorded_changes(cfg, "model", was["model"], cdir.settings)
            raise ConfigError(f"the [model] settings changed{describe(changes)}, but members "
                              f"{', '.join(map(str, done))} of cycle {cycle} already ran with the recorded ones; "
                              "restore them to resume", key=changes[0].key if changes else "model")
        if was["analysis"] != now["analysis"] and cdir.applied.exists():
            changes = recorded_changes(cfg, "analysis", was["analysis"], cdir.settings)
            raise ConfigError(f"the analysis settings changed{describe(changes)}, but the analysis of cycle {cycle} "
                              "was already applied with the recorded ones; restore them to resume",
                              key=changes[0].key if changes else "analysis")
        if was != now:
            self.events.emit("config_change", cycle=cycle, parts=[k for k in now if was.get(k) != now[k]])
        table = build_tasks(cfg, cycle, self.events.path)
        table.write(cdir.path)
        self._record_settings(cdir)
        return table

    def _record_settings(self, cdir: CycleDir) -> None:
        """The settings ``cdir``'s cycle starts (or resumes) with: their digests, and the configuration itself."""
        write_json_atomic(cdir.settings, self.cfg.to_json())
        write_json_atomic(cdir.digests, self.cfg.digests())

    def forecast(self, cycle: int) -> None:
        """Start (or resume) ``cycle`` and watch its jobs until every member's forecast is done
        (the :class:`~enkflow.experiment.cycling.Propagator` of :meth:`run`)."""
        cfg = self.cfg
        n = cfg.experiment.members
        checks.check_restarts(cfg)
        cd = self.dir.cycle(cycle)
        cdir = cd.path
        cdir.mkdir(parents=True, exist_ok=True)
        cd.logs.mkdir(exist_ok=True)
        if cd.tasks.exists():
            table = self._resume_table(cycle, cd)
            self.events.emit("cycle_resume", cycle=cycle)
        else:
            self.events.emit("cycle_start", cycle=cycle)
            provenance.mark([cfg.restart_path(m) for m in range(1, n + 1)], self.expdir, cycle, RestartState.ADVANCING)
            table = build_tasks(cfg, cycle, self.events.path)
            self._record_settings(cd)
            table.write(cdir)
        todo = TodoList.create(cdir, n)
        if self._retry_failed:
            for task in todo.reset_failed():
                self.events.emit("task_reset", cycle=cycle, task=task, member=task if task <= n else None)
        self.jobs = []
        following = self._cycles[self._cycles.index(cycle) + 1:] if cycle in self._cycles else []
        self._cycle = c = _Cycle(cycle, cdir, table, todo, cfg.resources(os.cpu_count() or 1),
                                 failed_before=frozenset(int(k) for k in todo.snapshot()["failed"]),
                                 next_cycle=following[0] if following else None)
        if self._last_length is not None:
            c.ahead_at = c.t0 + self._last_length - cfg.jobs.submit_ahead
        if self._study_pilots:
            Board(cycle, str(cdir), str(self.events.path)).write(self.dir.board)
        members = set(range(1, n + 1))
        self._watch(lambda snap: n + 1 in snap["done"] or members <= set(snap["done"]))

    def analysis(self, cycle: int) -> dict[str, float]:
        """Watch on until the analysis task of ``cycle`` is done, then cancel the cycle's jobs still queued."""
        n = self.cfg.experiment.members
        self._watch(lambda snap: n + 1 in snap["done"])
        c = self._cycle
        self._cancel_active(cycle)
        self._last_length = time.time() - c.t0
        self.events.emit("cycle_end", cycle=cycle)
        self._say(f"cycle {cycle}: analysis done ({time.time() - c.t0:.1f} s)")
        return {}

    def _watch(self, until: Callable[[dict], bool]) -> None:
        """Watch the cycle's to-do list until ``until(snapshot)``: requeue the tasks of dead
        workers, stop at a task failed for good, submit jobs for the tasks no live job covers.
        On any error the cycle's active jobs are cancelled."""
        cfg, c = self.cfg, self._cycle
        n = cfg.experiment.members
        snap, c.snap = c.snap, None
        try:
            while True:
                if snap is None:
                    requeue_stale(c.todo, c.table, self.events, by="driver")
                    snap = c.todo.snapshot()
                    if snap["failed"]:
                        self._fail(c, snap)
                if until(snap):
                    c.snap = snap
                    return
                if self._output is not None:
                    self._output.check()
                self._refresh()
                uncovered = self._balance_pilots(snap) if self._study_pilots else self._uncovered(snap)
                if uncovered:
                    if c.submitted > 0 and c.serial > cfg.jobs.max_resubmits:
                        raise EnkflowError(f"cycle {c.number}: more than {cfg.jobs.max_resubmits} resubmissions "
                                           f"(jobs.max_resubmits): jobs kept ending with tasks "
                                           f"{', '.join(map(str, uncovered))} left undone{_last_job_log(c.cdir)}")
                    planned = plan(cfg.jobs.strategy, cycle=c.number, cycle_dir=c.cdir, n_members=n, todo=uncovered,
                                   res=c.res, serial=c.serial, python=cfg.launcher.python, board=self.dir.board,
                                   analysis_pilot=self._needs_analysis_pilot(snap))
                    self._submit(c.number, planned)
                    c.submitted += len(planned)
                    c.serial += 1
                done_m = len([t for t in snap["done"] if t <= n])
                msg = f"cycle {c.number}: {done_m}/{n} members done" + (", analysis running" if str(n + 1) in snap["claims"] else "")
                if msg != c.last_msg:
                    self._say(f"{msg} ({time.time() - c.t0:.1f} s)")
                    c.last_msg = msg
                time.sleep(cfg.jobs.poll)
                snap = None
        except BaseException:
            self._cancel_active(c.number)
            raise

    @property
    def _study_pilots(self) -> bool:
        """Whether pilots span cycles (the dynamic strategy with ``jobs.pilots = "study"``)."""
        return self.cfg.jobs.strategy is Strategy.DYNAMIC and self.cfg.jobs.pilots is PilotSpan.STUDY

    def _balance_pilots(self, snap: dict) -> list[int]:
        """Pilots that span cycles, as many as the work left needs: a task ID per member slot to add
        (for :func:`plan`).

        The need is the members still to forecast (at least 1 while the analysis is not done), and
        once the next cycle's pilots are due (:attr:`_Cycle.ahead_at`, or the analysis may start)
        every member of the next cycle too; never more than ``workers`` pilots. In the study's last
        cycle queued pilots beyond the need are cancelled, newest first; before it they are kept (they
        hold no CPU, and the next cycle needs them: cancelled now, they would queue again from the back)."""
        c, n = self._cycle, self.cfg.experiment.members
        left = remaining(snap)
        members_left = [t for t in left if t <= n]
        need = max(len(members_left), 1 if left else 0)
        due = c.ahead_at is not None and time.time() >= c.ahead_at
        if c.next_cycle is not None and (due or not members_left):
            need += n
        want = min(c.res.workers, need)
        live = _live(self.pilots)
        queued = [j for j in live if j.state is JobState.PENDING]
        extra: list[_Job] = []
        surplus = self._slots(live) - want
        for j in queued[::-1] if c.next_cycle is None else []:  # newest first; never the only one for the analysis
            if surplus >= self._slots([j]) and (j.cpus < c.res.analysis_cpus or self._analysis_capable(live, but=j)):
                extra.append(j)
                surplus -= self._slots([j])
        if extra:
            self.launcher.cancel([j.id for j in extra])
            for j in extra:
                j.state = JobState.FINISHED
                self.events.emit("job_cancel", cycle=c.number, job=j.id, role=j.role.value, state=JobState.PENDING.value,
                                 reason="unneeded")
        have = self._slots(live) - self._slots(extra)
        if want <= have and self._needs_analysis_pilot(snap):
            return [1]  # the only pilot large enough for the analysis is gone: plan() makes one
        return list(range(1, want - have + 1)) if want > have else []

    def _slots(self, jobs: list[_Job]) -> int:
        """Member slots of ``jobs``: a pilot of k x ``cpus_per_job`` CPUs runs k members side by side."""
        return sum(max(1, j.cpus // self.cfg.jobs.cpus_per_job) for j in jobs)

    def _analysis_capable(self, jobs: list[_Job], but: _Job | None = None) -> bool:
        """Whether one of ``jobs`` (other than ``but``) has the CPUs the analysis needs."""
        return any(j is not but and j.cpus >= self.cfg.jobs.analysis_cpus for j in jobs)

    def _needs_analysis_pilot(self, snap: dict) -> bool:
        """Whether the next pilots must include one large enough for the analysis: it needs more CPUs
        than a pilot has, is not done, and no live pilot has them."""
        analysis = self.cfg.experiment.members + 1
        live = _live(self.jobs + self.pilots)
        return (self.cfg.jobs.analysis_cpus > self.cfg.jobs.cpus_per_job and analysis not in snap["done"]
                and not self._analysis_capable(live))

    def _end_pilots(self) -> None:
        """The study's end (or failure): the board says so, the pilots that wait on it leave, and
        any still queued or running a moment later are cancelled."""
        if not self._study_pilots or not self.pilots:
            return
        Board(end=True).write(self.dir.board)
        deadline = time.time() + 10 * self.cfg.jobs.poll
        while time.time() < deadline:
            self._refresh()
            if all(j.state is JobState.FINISHED for j in self.pilots):
                return
            time.sleep(self.cfg.jobs.poll)
        live = _live(self.pilots)
        self.launcher.cancel([j.id for j in live])
        for j in live:
            self.events.emit("job_cancel", cycle=self._cycle.number if self._cycle else None, job=j.id, role=j.role.value,
                             state=j.state.value, reason="study-end")

    def _cancel_earlier_jobs(self) -> None:
        """Cancel the jobs an earlier run of this study submitted and the launcher still holds (a
        killed driver leaves its queued pilots behind; they would start later and wait for nothing)."""
        earlier: list[str] = []
        for e in self.events.read():
            if e.get("event") in ("experiment_start", "resume"):
                earlier = []
            elif e.get("event") == "job_submit" and e.get("job"):
                earlier.append(str(e["job"]))
        if not earlier:
            return
        st = self.launcher.states(earlier)
        left = [j for j in earlier if st.get(j, JobState.FINISHED) is not JobState.FINISHED]
        if left:
            self.launcher.cancel(left)
            self.events.emit("earlier_jobs_cancelled", jobs=left)
            self._say(f"cancelled {len(left)} job(s) of the earlier run still queued or running")

    def _refresh(self) -> None:
        active = _live(self.jobs + self.pilots)
        if active:
            st = self.launcher.states([j.id for j in active])
            for j in active:
                j.state = st.get(j.id, JobState.FINISHED)

    def _uncovered(self, snap: dict) -> list[int]:
        """Pending tasks that no pending or running job may run."""
        active = _live(self.jobs + self.pilots)
        if any(j.covers is None for j in active):
            return []
        covered: set[int] = set()
        for j in active:
            covered |= j.covers or set()
        claimed = {int(k) for k in snap["claims"]}
        return [t for t in remaining(snap) if t not in covered and t not in claimed]

    def _submit(self, cycle: int, planned: list[PlannedJob]) -> None:
        member_ids: list[str] = []
        for pj in planned:
            spec = pj.spec
            if pj.role is JobRole.ANALYSIS:
                spec = dataclasses.replace(spec, after=tuple(member_ids))
            if self._lease is not None:
                spec = dataclasses.replace(spec, env=spec.env | self._lease.env)
            t = time.time()
            jid = self.launcher.submit(spec)
            if pj.role is JobRole.MEMBER:
                member_ids.append(jid)
            (self.pilots if self._study_pilots else self.jobs).append(_Job(jid, pj.role, pj.covers, t, spec.cpus))
            self.events.emit("job_submit", cycle=cycle, job=jid, role=pj.role.value, strategy=self.cfg.jobs.strategy.value,
                             cpus=spec.cpus, t_submit=t)

    def _cancel_active(self, cycle: int) -> None:
        self._refresh()
        active = _live(self.jobs)
        if active:
            self.launcher.cancel([j.id for j in active])
            for j in active:
                self.events.emit("job_cancel", cycle=cycle, job=j.id, role=j.role.value, state=j.state.value)

    def _fail(self, c: _Cycle, snap: dict) -> None:
        n, cycle = self.cfg.experiment.members, c.number
        key, rep = sorted(snap["failed"].items(), key=lambda kv: int(kv[0]))[0]
        task = int(key)
        count = snap["failures"].get(key, 0)
        what = rep.get("reason") or f"failed {count} time(s), last exit status {rep.get('returncode')}"
        msg = (f"{rep.get('step', 'model')}: {what}\n"
               f"  command: {shlex.join(rep.get('argv', []))}\n"
               f"  log: {rep.get('log')}\n  stderr (last lines):\n"
               + "\n".join("    " + line for line in str(rep.get("stderr_tail", "")).splitlines()))
        if task in c.failed_before:
            msg = _previous_failure(msg)
        self.events.emit("experiment_fail", cycle=cycle, task=task, report=rep, previous=task in c.failed_before)
        if task <= n:
            raise MemberError(msg, member=task, cycle=cycle)
        raise EnkflowError(f"analysis of cycle {cycle}: {msg}")


def _live(jobs: list[_Job]) -> list[_Job]:
    """The jobs of ``jobs`` still queued or running (as last refreshed)."""
    return [j for j in jobs if j.state is not JobState.FINISHED]


def _previous_failure(msg: str) -> str:
    """``msg``, the failure an earlier run recorded, marked as such, with the way to run the task again."""
    return ("the previous run failed here, and this run did not run the task again (a task that failed for good "
            "stays failed):\n  previous failure: " + msg.replace("\n", "\n  ")
            + "\n  after fixing the cause, rerun with --retry-failed to put the failed tasks back "
              "(done members are not run again)")


def _last_job_log(cdir: Path, lines: int = 10) -> str:
    """The tail of the newest job log of a cycle, for an error message."""
    log = newest(logs_dir(cdir), "job-*.log")
    if log is None:
        return f"; see {logs_dir(cdir)}"
    return f"; the last job log {log} ends with:\n" + log_tail(log, lines)
