"""``enkflow run`` for ``experiment.mode = "online"``: start the server and the runners, keep them alive.

The server (``python -m enkflow.online.experiment EXPDIR``, under ``mpiexec -n
ranks`` when ``[online] ranks > 1``) and ``[online] runners`` runner processes
are jobs of an :mod:`enkflow.jobs` launcher, on this machine or through SLURM.
The supervisor shows each cycle's progress from the server's events
(:mod:`enkflow.online.study_progress`), reports a runner that exits before the
study is over at once and replaces it, or stops the study when the runner failed
to start or was refused (:mod:`enkflow.online.process_ends`), and restarts a crashed server,
which resumes from its checkpoints (up to ``max_server_restarts`` times). The server's verdict is
``EXPDIR/online/status.json``: done, or failed with the error (a member that
failed ``max_failures`` times, bad input), which is not retried. The server and
the runners run under the run's lease (:mod:`enkflow.experiment.run_lease`):
killed, this launcher leaves nothing running for longer than the lease's
timeout, and a rerun first waits for what an earlier run left.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import zmq

from enkflow.errors import ConfigError, EnkflowError, MemberError
from enkflow.experiment import checks
from enkflow.experiment.config import ExperimentConfig, Initial, Mode
from enkflow.experiment.directory import OnlineDir
from enkflow.experiment.driver import make_launcher
from enkflow.experiment.from_archive import archive_checker, archive_root, drop_later, report_restored
from enkflow.experiment.lock import DriverLock
from enkflow.experiment.run_lease import RunLease
from enkflow.fsutil import read_json, write_bytes_atomic, write_json_atomic
from enkflow.jobs.events import EventLog
from enkflow.jobs.launcher import JobSpec, JobState, Launcher
from enkflow.jobs.launchers import LAUNCHERS
from enkflow.jobs.protect import place
from enkflow.netaddr import reaching_other_nodes
from enkflow.online.checkpoint import analysis_path
from enkflow.online.contact import CONTACT_ENV, contacts
from enkflow.online.experiment import ServerStatus, experiment_fields
from enkflow.online.liveness import AliveWatch, alive_limit, alive_period
from enkflow.online.process_ends import Culprit, RunnerExit, RunnerExits, StudyFailed, tail_of
from enkflow.online.study_progress import StudyProgress
from enkflow.transport import TRANSPORT_ENV
from enkflow.output import archive as _archive
from enkflow.output.service import OutputService
from enkflow.parallel.program import find_program
from enkflow.state import StateLayout
from enkflow.tokens import secret_file


def copy_initial(cfg: ExperimentConfig) -> None:
    """``experiment.initial = "copy"``: the experiment's own copy of the initial ensemble, made once."""
    if cfg.experiment.initial is not Initial.COPY:
        return
    for m in range(1, cfg.experiment.members + 1):
        dst = cfg.restart_path(m)
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            place(cfg.source_restart_path(m), dst)


def make_secrets(directory: Path, *, curve: bool) -> Path:
    """The experiment's token (and, with ``curve``, the server's CURVE key pair), made once in the
    online directory ``directory`` (:class:`OnlineDir`); returns the token file."""
    odir = OnlineDir(directory)
    secret_file(odir.token, lambda: secrets.token_hex(32))
    if curve and not odir.curve_secret.exists():
        pub, sec = zmq.curve_keypair()
        write_bytes_atomic(odir.curve_public, pub + b"\n")
        secret_file(odir.curve_secret, lambda: sec.decode())
    return odir.token


class OnlineExperiment:
    """Runs (or resumes) an online experiment; ``progress`` receives one-line status messages (per cycle the
    members done and runners alive, each analysis, each runner that ended), ``bar_stream``, where it is a
    terminal, shows the members done as a bar instead."""

    def __init__(self, cfg: ExperimentConfig, launcher: Launcher | None = None,
                 progress: Callable[[str], None] | None = None, poll_s: float = 0.2, bar_stream: TextIO | None = None):
        if cfg.experiment.mode is not Mode.ONLINE or cfg.online is None:
            raise ConfigError("not an online experiment (experiment.mode)", key="experiment.mode")
        self.cfg = cfg
        self.o = cfg.online
        self.xdir = cfg.dir
        self.odir = self.xdir.online
        self.progress = progress
        self.poll_s = poll_s
        self.launcher = launcher
        self.events = EventLog(self.xdir.events)
        self.server_restarts = 0
        self.rank_losses = 0  # server ends with a rank lost (of server_restarts + 1)
        self.alive = AliveWatch(self.odir.alive, alive_limit(self.o.rank_timeout), alive_period(self.o.rank_timeout))
        self.runner_starts = 0
        self.runner_index: dict[str, int] = {}  # job -> K of its runner-K.log
        self.exits = RunnerExits()
        self.stopped: set[str] = set()  # runner jobs that ended when the server told them to stop
        self.study = StudyProgress(self.xdir.events, cfg.experiment.members, self._say,
                                   bar_stream if progress is not None else None)
        self.output_service = None
        self.lease = RunLease(self.xdir, cfg.launcher.lease_timeout, self.events, self._say)

    def _say(self, msg: str) -> None:
        if self.progress is not None:
            self.progress(msg)

    def check(self) -> None:
        """Every check that needs no server: the runner program, all observation files, the restarts."""
        checks.check_program(self.o.runner, "online.runner")
        checks.check_observations(self.cfg, self.cfg.cycle_numbers)
        # Before the copy of an initial = "copy" experiment exists, the restarts checked are the initial ones.
        source = self.cfg.experiment.initial is Initial.COPY and not self.cfg.restart_path(1).exists()
        checks.check_restarts(self.cfg, source=source)
        template = self.cfg.source_restart_path(1) if source else self.cfg.restart_path(1)
        experiment_fields(self.cfg, StateLayout.from_config(template, self.cfg.state), template)

    def run(self) -> dict:
        """Run the study to the end; returns the server's status. Holds the experiment's lock."""
        cfg = self.cfg
        self.xdir.root.mkdir(parents=True, exist_ok=True)
        with DriverLock(self.xdir.lock), self.lease:
            self.check()
            self.odir.path.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.xdir.config, cfg.to_json())
            self.token_file = make_secrets(self.odir.path, curve=self.o.curve)
            copy_initial(cfg)
            status = read_json(self.odir.status)
            if status and status.get("state") == ServerStatus.DONE:
                self._say("the study is already complete")
                return status
            self.odir.status.unlink(missing_ok=True)
            self.odir.stopping.unlink(missing_ok=True)
            if self.launcher is None:
                # Runners and server ranks wait on each other: on one machine they all run at once.
                self.launcher = make_launcher(cfg, colocated=self.o.ranks + self.o.runners + 1)
            self.events.emit("experiment_start", mode="online", cycles=cfg.cycle_numbers, members=cfg.experiment.members,
                             runners=self.o.runners, ranks=self.o.ranks, launcher=cfg.launcher.kind.value)
            self.output_service = self._start_output_service()
            try:
                status = self._supervise()
                if self.output_service is not None:
                    self.output_service.stop()  # raises what went wrong in the runners' output
                return status
            finally:
                self.launcher.close()
                if self.output_service is not None and self.output_service.result is None:
                    try:  # a failure: what the service received complete is written, the rest dropped
                        self.output_service.stop()
                    except EnkflowError as exc:
                        self._say(f"output service: {exc}")

    def _start_output_service(self):
        """The output service of ``[output]`` when it declares fields: the runners add to it
        (``{output_address}``, ``{output_token_file}``; docs/output.md)."""
        if self.cfg.output is None or not self.cfg.output.fields:
            return None
        tcp = LAUNCHERS[self.cfg.launcher.kind].spans_hosts  # runners on other hosts
        svc = OutputService.start(self.cfg.output, self.xdir.output_service, transport="tcp" if tcp else "ipc",
                                  bind=reaching_other_nodes(self.o.bind) if tcp else "127.0.0.1", base_dir=self.cfg.base_dir)
        self.events.emit("output_service_start", pid=svc.proc.pid, address=svc.address)
        return svc

    # -- jobs -------------------------------------------------------------------------------

    def _server_argv(self) -> list[str]:
        py = self.o.python or self.cfg.launcher.python or sys.executable
        argv = [py, "-m", "enkflow.online.experiment", str(self.cfg.expdir)]
        if self.o.ranks > 1:
            mpiexec = shlex.split(self.o.mpiexec)
            mpiexec[0] = find_program(mpiexec[0]) or mpiexec[0]  # a venv used without activating it
            argv = mpiexec + ["-n", str(self.o.ranks)] + argv
        return argv

    def _cancel_silent(self, server: str) -> None:
        """Cancel the running server when a rank of it went silent (its alive file stood still: a node
        lost inside the analysis, where the bus is not watched), its status saying so as when a rank
        notices a lost rank on the bus; the server's end is then handled as any."""
        silent = self.alive.silent(time.monotonic())
        if not silent:
            return
        self.launcher.cancel([server])
        self.alive.reset()  # judged once
        limit = self.alive.limit_s
        who = ", ".join(f"rank {s.rank} (node {s.node})" for s in silent)
        write_json_atomic(self.odir.status, {
            "state": ServerStatus.RANK_LOST, "ranks": [s.rank for s in silent], "nodes": [s.node for s in silent],
            "error": f"server {who} gave no sign of life for {limit:g} s (twice [online] rank_timeout); the launcher "
                     "cancelled the server"})

    def _server_ended(self) -> dict | None:
        """The server's job ended: its status when the study is complete; raises for what a restart
        cannot fix, and when the server ended ``max_server_restarts + 1`` times, crashed or with a
        rank lost (both count: a node lost again and again stops the study); None: restart it."""
        status = read_json(self.odir.status) or {}
        state = status.get("state")
        if state == ServerStatus.DONE:
            self.events.emit("experiment_end", mode="online", cycles=self.cfg.cycle_numbers)
            return status
        if state == ServerStatus.FAILED:
            culprit = self._culprit()
            self.events.emit("experiment_fail", reason=status.get("error"), member=status.get("member"),
                             cycle=status.get("cycle"), log=str(self.exits.log_or(self._server_log(), culprit)))
            if status.get("member") is not None:
                raise MemberError(f"{status.get('error')}{self.exits.cause(culprit)}", member=int(status["member"]),
                                  cycle=status.get("cycle"))
            raise StudyFailed(f"the server stopped: {status.get('error')}")
        lost = state == ServerStatus.RANK_LOST
        self.rank_losses += lost
        ends = self.server_restarts + 1
        if self.server_restarts >= self.o.max_server_restarts:
            self.events.emit("experiment_fail", reason=f"the server ended {ends} times", log=str(self._server_log()))
            raise EnkflowError(f"the server ended {ends} times, {self.rank_losses} of them with a server rank lost and "
                               f"{ends - self.rank_losses} crashed (online.max_server_restarts = "
                               f"{self.o.max_server_restarts}); see {self.odir.logs}{tail_of(self._server_log())}")
        self.server_restarts += 1
        if lost:
            ranks, nodes = list(status.get("ranks", [])), list(status.get("nodes", []))
            self.events.emit("server_crash", restart=self.server_restarts, cause="rank_lost", ranks=ranks, nodes=nodes)
            who = ", ".join(f"rank {r} (node {n})" for r, n in zip(ranks, nodes)) or "a rank"
            self._say(f"server {who} lost: {status.get('error')}; restarting the server from its checkpoints "
                      f"({self.server_restarts} of online.max_server_restarts = {self.o.max_server_restarts})")
        else:
            self.events.emit("server_crash", restart=self.server_restarts, cause="crash")
            self._say(f"the server exited without finishing; restarting it from its checkpoint ({self.server_restarts})")
        return None

    def _culprit(self) -> Culprit | None:
        """The runner whose failure made the server fail the member for good, where known."""
        return next((Culprit(k, jid, self.odir.logs / f"runner-{k}.log") for jid, k in self.runner_index.items()
                     if self.study.failed_by in self._greeted(k)), None)

    def _greeted(self, k: int) -> frozenset[int]:
        """The ids runner ``k`` greeted the server with (:mod:`enkflow.online.contact`)."""
        return frozenset(contacts(self.odir.logs / f"runner-{k}.contact"))

    def _server_log(self) -> Path:
        """The log of the server started last."""
        return self.odir.logs / f"server-{self.server_restarts}.log"

    def _start_server(self) -> str:
        self.odir.status.unlink(missing_ok=True)  # the verdict of this server, not of the one before
        self.odir.stopping.unlink(missing_ok=True)
        self.alive.reset()
        self.odir.address.unlink(missing_ok=True)
        logs = self.odir.logs
        logs.mkdir(exist_ok=True)
        spec = JobSpec(name="enkflow-server", argv=self._server_argv(), cpus=self.o.ranks, time_limit_s=self.cfg.jobs.time_limit,
                       log=logs / f"server-{self.server_restarts}.log", env=self._env(), ntasks=self.o.ranks,
                       nodes=self.o.nodes, requeue=False)
        jid = self.launcher.submit(spec)
        self.events.emit("server_start", job=jid, restart=self.server_restarts, ranks=self.o.ranks)
        return jid

    def _env(self) -> dict[str, str]:
        env = dict(self.cfg.model.env) if self.cfg.model is not None else {}
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env | self.lease.env

    def _runner_argv(self, k: int, address: str) -> list[str]:
        curve = self.odir.curve_public.read_text().strip() if self.o.curve else ""
        values = {"address": address, "token_file": self.token_file, "runner": k, "expdir": self.cfg.expdir,
                  "length": f"{self.cfg.experiment.forecast_length:g}", "steps": self.cfg.steps_per_cycle,
                  "restart": self.cfg.restart_path(1), "curve_key": curve,
                  "output_address": self.output_service.address if self.output_service else "",
                  "output_token_file": self.output_service.token_file if self.output_service else ""}
        return [tok.format(**values) for tok in shlex.split(self.o.runner)]

    def _start_runner(self, address: str) -> str:
        k = self.runner_starts
        self.runner_starts += 1
        contact = self.odir.logs / f"runner-{k}.contact"
        contact.unlink(missing_ok=True)  # an earlier run's runner K
        spec = JobSpec(name=f"enkflow-runner-{k}", argv=self._runner_argv(k, address), cpus=1,
                       time_limit_s=self.cfg.jobs.time_limit, log=self.odir.logs / f"runner-{k}.log",
                       env=self._env() | {TRANSPORT_ENV: self.o.transport, CONTACT_ENV: str(contact)},
                       requeue=False)
        jid = self.launcher.submit(spec)
        self.runner_index[jid] = k
        self.events.emit("runner_start", job=jid, runner=k)
        return jid

    def _wait_address(self, server: str) -> str:
        path = self.odir.address
        while not path.exists():  # written once the server has loaded the ensemble
            if self.launcher.states([server])[server] is JobState.FINISHED:
                return ""
            self._cancel_silent(server)
            time.sleep(0.05)
        return path.read_text().strip()

    def _supervise(self) -> dict:
        server = self._start_server()
        address = self._wait_address(server)
        runners: list[str] = []
        max_starts = max(10, 4 * self.o.runners)
        try:
            while True:
                if address and not runners:
                    runners = [self._start_runner(address) for _ in range(self.o.runners)]
                    self._say(f"server at {address}; {self.o.runners} runners started")
                st = self.launcher.states([server, *runners])
                self.study.poll()  # after the states: a runner that ended had joined if it says so by now
                # Before the server's end: a runner told to stop has ended before the server that told it.
                for i, jid in enumerate(runners):
                    if st[jid] is not JobState.FINISHED or jid in self.stopped:
                        continue
                    if self.odir.stopping.exists():  # told that the study is over, or stopped: not replaced
                        self._runner_ended(jid, stopping=True)
                        continue
                    self._runner_ended(jid)
                    if self.o.runners + self.exits.reported >= max_starts:
                        self.events.emit("experiment_fail", reason=f"runners exited {self.exits.reported} times",
                                         log=str(self.exits.log_or(self.odir.logs)))
                        raise EnkflowError(f"runners exited {self.exits.reported} times before the study ended; see "
                                           f"{self.odir.logs}{self.exits.cause()}")
                    runners[i] = self._start_runner(address)
                if st[server] is not JobState.FINISHED:
                    self._cancel_silent(server)
                    time.sleep(self.poll_s)
                    continue
                status = self._server_ended()
                if status is not None:
                    return status
                server = self._start_server()
                new = self._wait_address(server)
                if new and new != address and runners:
                    # Another address (a fixed port should prevent it): runners must be told, so start new ones.
                    self.launcher.cancel(runners)
                    runners = []
                    self.stopped.clear()
                elif new:  # the runners the ended server told to stop serve the new one
                    runners = [self._start_runner(new) if jid in self.stopped else jid for jid in runners]
                    self.stopped.clear()
                address = new
        finally:
            self.study.close()
            self.launcher.cancel([server, *runners])

    def _runner_ended(self, jid: str, *, stopping: bool = False) -> None:
        """Report a runner that ended before the study did, at once: its exit status and its log's tail.
        Raises :class:`StudyFailed` for one that failed to start or was refused. Once the server stopped
        the study (``stopping``) it is only recorded, and reported where it exited with an error."""
        k = self.runner_index[jid]
        status = self.launcher.exit_status(jid)
        ended = RunnerExit(k, jid, status, self.odir.logs / f"runner-{k}.log", self._greeted(k), stopping and status == 0)
        if stopping:
            self.stopped.add(jid)
            self.exits.note(ended)
            if ended.told_to_stop:
                return
        self.events.emit("runner_exit", job=jid, runner=k, status=ended.status)
        if not stopping:
            try:
                self.exits.add(ended, any_joined=self.study.any_joined, refused=self.study.refused)
            except StudyFailed as exc:  # its error says what the line below would
                self.events.emit("experiment_fail", reason=str(exc), runner=k, log=str(ended.log))
                raise
        self._say(f"{ended.describe()}{ended.tail()}")


def restore_online(cfg: ExperimentConfig, cycle: int, progress: Callable[[str], None] | None = None) -> dict:
    """Restore the server's analysis checkpoints archived after ``cycle``, so that the online study
    resumes from them at the next cycle (:mod:`enkflow.experiment.from_archive`). Takes the driver
    lock. Returns the archive's manifest."""
    root = archive_root(cfg, cycle)
    t0 = time.perf_counter()
    xdir = cfg.dir
    odir = xdir.online
    ckdir = odir.checkpoints
    ranks = cfg.online.ranks
    targets = {f"rank:{r}": analysis_path(ckdir, cycle, r) for r in range(ranks)}
    check = archive_checker(root, cycle, {"mode": "online", "members": cfg.experiment.members, "ranks": ranks})

    def clear() -> None:
        # Every other checkpoint: the server resumes from the newest analysis, with the forecasts of the next cycle.
        for p in list(ckdir.glob("analysis_*.h5")) + list(ckdir.glob("forecast_*")):
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        for f in (odir.status, odir.stopping):
            f.unlink(missing_ok=True)
        drop_later(cfg, cycle)

    xdir.root.mkdir(parents=True, exist_ok=True)
    with DriverLock(xdir.lock):
        manifest = _archive.restore(root, cycle, targets, check=check, before_write=clear)
        report_restored(EventLog(xdir.events), root, cycle, manifest, t0, progress,
                        "the server's analysis checkpoints")
    return manifest
