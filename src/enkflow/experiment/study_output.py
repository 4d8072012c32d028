"""The offline study's analysis output (docs/output.md): one output service for the study, which
the analysis tasks add their statistics to instead of starting writers of their own, and the writer
of each cycle's ``analysis_mean.nc`` and ``analysis_spread.nc`` from those statistics."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from enkflow.errors import EnkflowError
from enkflow.experiment.config import ExperimentConfig, Mode
from enkflow.jobs.events import EventLog
from enkflow.jobs.files import log_tail
from enkflow.jobs.launchers import LAUNCHERS
from enkflow.output.analysis_output import output_config, statistics_coords
from enkflow.experiment.output_setup import mean_spread_setup
from enkflow.output.mean_spread_files import MEAN, SPREAD, MeanSpreadFromStatistics, files_missing
from enkflow.output.service import OutputService
from enkflow.state import StateLayout


class StudyOutput:
    """The service and the mean/spread writer of one ``enkflow run``: :meth:`start` them, :meth:`check`
    the service at every poll, then :meth:`finish` (the run succeeded) or :meth:`close` (it failed)."""

    def __init__(self, cfg: ExperimentConfig, events: EventLog, say: Callable[[str], None]):
        self.cfg = cfg
        self.events = events
        self.say = say
        self.service: OutputService | None = None
        self.files: MeanSpreadFromStatistics | None = None

    def start_service(self) -> None:
        """The study's output service; none when the statistics are off, the analysis is an external
        program, or the service cannot start (the tasks then start their own writers)."""
        cfg = self.cfg
        ao = cfg.analysis_output
        if cfg.state is None or cfg.analysis_task.command is not None or not ao.statistics_for(Mode.OFFLINE):
            return
        try:
            layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
            ocfg = output_config(layout, cfg.dir.cycles, **ao.writer_settings())
            # Analysis tasks on other hosts reach it over TCP; on this machine ipc is enough.
            tcp = LAUNCHERS[cfg.launcher.kind].spans_hosts
            svc = OutputService.start(ocfg, cfg.dir.output_service, transport="tcp" if tcp else "ipc",
                                      bind="0.0.0.0" if tcp else "127.0.0.1",
                                      timeout_key="[analysis_output] writer_timeout", coords=statistics_coords(layout))
        except (EnkflowError, OSError) as exc:
            self.say(f"output service not started ({exc}); each analysis task starts its own writer")
            self.events.emit("output_service_failed", error=str(exc))
            return
        self.events.emit("output_service_start", pid=svc.proc.pid, address=svc.address)
        self.service = svc

    def start_files(self, done: Iterable[int]) -> None:
        """With ``[analysis_output] mean_spread_files`` and the built-in analysis: the writer of each
        cycle's mean and spread files from the statistics the service writes (the analysis tasks then
        leave them out). First the missing files of the finished cycles ``done`` (an earlier run ended
        before writing them) are written from their statistics, even when nothing is left to run."""
        cfg = self.cfg
        if not cfg.analysis_output.mean_spread_files or cfg.state is None or cfg.analysis_task.command is not None:
            return
        setup = mean_spread_setup(cfg)
        missing = [k for k in sorted(done) if files_missing(setup, k)]
        if self.service is None and not missing:
            return
        files = MeanSpreadFromStatistics(setup, self.service.directory if self.service is not None else None)
        try:
            lost = [k for k in missing if not files.has_statistics(k)]
            for k in missing:
                if k not in lost:
                    files.write_now(k)
                    self.say(f"cycle {k}: {MEAN} and {SPREAD} written from its statistics (an earlier run ended first)")
            if lost:
                # Not made here (restored from an archive, or the files turned on later): said once.
                self.events.emit("mean_spread_missing", cycles=lost)
                self.say(f"{MEAN} and {SPREAD} missing, and their statistics too, for {len(lost)} finished "
                         f"cycle(s) ({', '.join(map(str, lost[:10]))}{' ...' if len(lost) > 10 else ''}); not written")
        except BaseException:
            files.close()
            raise
        if self.service is None:
            files.close()
            return
        self.files = files

    def analysed(self, cycle: int) -> None:
        """``cycle``'s analysis is done: its mean and spread files can be written."""
        if self.files is not None:
            self.files.analysed(cycle)

    def check(self) -> None:
        """At every poll: a service that died or hangs (no progress for its hang limit) is killed and
        the run stops now, naming it, rather than each later analysis task waiting for it and the run
        failing at its end. What it held (the statistics of the cycle in flight) may be lost; the next
        ``enkflow run`` resumes with a new service."""
        svc = self.service
        if svc is None:
            return
        why = svc.hung() if svc.alive() else f"ended (exit {svc.proc.returncode})"
        if why is None:
            return
        tail = log_tail(svc.log, 5) if svc.log.exists() else ""
        msg = (f"the study's output service (pid {svc.proc.pid}) {why}; killed: the analysis statistics it held "
               f"may be lost; `enkflow run` again resumes with a new service" + (f":\n{tail}" if tail.strip() else ""))
        self.lose(msg)
        raise EnkflowError(msg)

    def lose(self, why: str) -> None:
        """A service gone or hung: nothing to stop in order; a hung one is killed."""
        if self.service is not None:
            svc, self.service = self.service, None
            svc.kill()
            self.events.emit("output_service_end", error=why)

    def finish(self) -> None:
        """The run succeeded: wait for the mean and spread files, then stop the service (everything
        the analysis tasks added is written); raises what went wrong."""
        if self.files is not None:
            files, self.files = self.files, None
            try:
                files.wait()
            finally:
                files.close()
        if self.service is not None:
            svc, self.service = self.service, None  # stopped once, whatever the stop raises
            self._stop(svc)

    def close(self) -> None:
        """The run failed: finish what was asked; what the service received complete is written, the rest dropped."""
        if self.files is not None:
            files, self.files = self.files, None
            try:
                files.wait()
            except EnkflowError as exc:
                self.say(f"analysis mean and spread files: {exc}")
            files.close()
        if self.service is not None:
            svc, self.service = self.service, None
            try:
                self._stop(svc)
            except EnkflowError as exc:
                self.say(f"output service: {exc}")

    def _stop(self, svc: OutputService) -> None:
        t0 = time.perf_counter()
        try:
            res = svc.stop()
        except EnkflowError as exc:
            self.events.emit("output_service_end", error=str(exc))
            raise
        self.events.emit("output_service_end", stop_s=time.perf_counter() - t0, stats=res.get("stats", {}),
                         notes=res.get("notes", []))
