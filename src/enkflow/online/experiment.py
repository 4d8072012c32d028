"""The server of an online experiment (``experiment.mode = "online"``), built from its configuration.

The initial ensemble is read from the members' restart files (the assimilated
variables with the parallel reader, the carried ones with netCDF4), the
observations and the analysis are those of offline mode, every cycle's
analysis mean and spread go to ``EXPDIR/cycles/NNNN/`` as offline, and after
the last cycle the final analysis is written back into the restart files
(crash-safe), so both modes leave the same files behind.

``python -m enkflow.online.experiment EXPDIR`` is the server process that
:mod:`enkflow.online.launch` starts (under mpiexec for ``[online] ranks > 1``).
"""

from __future__ import annotations

import signal
import socket
import sys
import traceback
from enum import StrEnum
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.errors import DETERMINISTIC_ERROR_RC, BindError, ConfigError, EnkflowError, FileFormatError, MemberError
from enkflow.experiment.config import ExperimentConfig, experiment_from_json
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.experiment.cycling import NoOutput, OutputSink
from enkflow.experiment.directory import ExperimentDir
from enkflow.experiment.step import StateRows, build_step
from enkflow.experiment.initial_statistics import write_initial_mean_spread
from enkflow.experiment.verification import truth_of
from enkflow.experiment.output_setup import background_archiver, mean_spread_setup
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.io import EnsembleFiles
from enkflow.jobs.events import EventLog
from enkflow.jobs.lease import watch_from_environment
from enkflow.obs.obsfile import ObsSettings
from enkflow.obs.space import CycleObservations
from enkflow.online.bus import RankLost
from enkflow.online.checkpoint import analysis_path
from enkflow.online.fields import Field
from enkflow.online.liveness import AliveFile, alive_period
from enkflow.online.scheduler import SchedulerConfig
from enkflow.transport import Transport
from enkflow.online.server import Problem, Server, ServerConfig
from enkflow.online.sockets import bus_host
from enkflow.online.store import MemoryStore
from enkflow.output.analysis_output import AnalysisOutput
from enkflow.output.archive import listed_cycles
from enkflow.output.archive_background import ArchiveFailure
from enkflow.output.mean_spread_files import BackgroundMeanSpread
from enkflow.parallel import Comm, get_comm, leave, node_names
from enkflow.state import StateLayout


class ServerStatus(StrEnum):
    """The server's verdict in ``EXPDIR/online/status.json`` (``"state"``), which the launcher waits for."""

    DONE = "done"
    FAILED = "failed"  # with the error (and the member and cycle of a member's error): a restart cannot fix it
    RANK_LOST = "rank_lost"  # with the error, ranks and nodes: a server rank (its node) was lost; restart it


class ArchivingOutput:
    """An output sink that also archives the server's analysis checkpoints ([archive] dir).

    At cycle k's output every rank has flushed its checkpoints (each does before the collective
    analysis), so the analysis checkpoints of cycle k - 1 are complete on every rank: rank 0
    stages them (hard links: a checkpoint is renamed into place, never rewritten) and the
    background archiver compresses and copies them. :meth:`finish` does the last cycle's, once
    the server's checkpointer has closed, and waits for the archiver."""

    def __init__(self, inner: OutputSink, cfg: ExperimentConfig, comm: Comm, events: EventLog, progress=None):
        self.inner, self.cfg, self.comm = inner, cfg, comm
        self.dir = cfg.dir.online.checkpoints
        self.archiver = background_archiver(cfg, events, progress) if comm.rank == 0 else None
        if self.archiver is not None:
            self.archiver.poll()  # cycles a crashed server staged but did not archive

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None:
        self.inner.write(cycle, Xa, row_start, diagnostics)
        self._stage(cycle - 1)

    def wait(self) -> None:
        self.inner.wait()

    def _stage(self, cycle: int) -> None:
        if self.archiver is None:
            return
        files = [(analysis_path(self.dir, cycle, r), f"analysis.rank_{r:04d}.h5", f"rank:{r}") for r in range(self.comm.size)]
        if not all(p.exists() for p, _, _ in files) or cycle in listed_cycles(self.archiver.root):
            return  # before the first cycle; or the checkpoint a restarted server resumed from, archived already
        self.archiver.stage(cycle, files, {"mode": "online", "members": self.cfg.experiment.members,
                                           "ranks": self.comm.size}, link=True)

    def finish(self, last: int | None) -> None:
        self.comm.barrier()  # every rank's checkpointer has closed: the last analysis is on disk
        if self.archiver is not None:
            if last is not None:
                self._stage(last)
            self.archiver.finish()


def experiment_fields(cfg: ExperimentConfig, layout: StateLayout, template: Path | None = None) -> tuple[Field, ...]:
    """The fields runners must declare: the state variables (whole, flattened as in the file), then the carried
    ones (read from ``template``, default member 1's restart)."""
    fields = []
    for v in layout.variables:
        if v.index is not None:
            raise ConfigError(f"online mode exchanges whole variables; state variable {v.name!r} is masked "
                              "([state] mask): unmask it or use offline mode", key="state.mask")
        fields.append(Field(v.name, v.dtype.name, v.shape, assimilated=True))
    template = template or cfg.restart_path(1)
    with netCDF4.Dataset(template) as ds:
        for name in cfg.online.carried:
            if name not in ds.variables:
                raise FileFormatError("a carried variable ([online] carried) is not in the restart file", path=str(template),
                                      variable=name)
            if name in layout.names:
                raise ConfigError(f"{name!r} is both a state variable and carried", key="online.carried")
            var = ds.variables[name]
            fields.append(Field(name, np.dtype(var.dtype).name, tuple(var.shape), assimilated=False))
    return tuple(fields)


def _carried_io(cfg: ExperimentConfig, store: MemoryStore, write: bool) -> None:
    """Read (or, with ``write``, write from rank 0 after a gather) the carried variables of every member."""
    carried = [k for k, f in enumerate(store.own.fields) if not f.assimilated]
    if not carried:
        return
    for m in range(1, store.n_members + 1):
        path = cfg.restart_path(m)
        if not write:
            with netCDF4.Dataset(path) as ds:
                for k in carried:
                    lo, hi = store.ranges[k]
                    store.column(k, m)[...] = np.asarray(ds.variables[store.own.fields[k].name][:]).reshape(-1)[lo:hi]
            continue
        parts = store.comm.allgather_obj([store.column(k, m).copy() for k in carried])
        if store.comm.rank == 0:
            with netCDF4.Dataset(path, "r+") as ds:
                for i, k in enumerate(carried):
                    f = store.own.fields[k]
                    ds.variables[f.name][:] = np.concatenate([p[i] for p in parts]).reshape(f.shape)
    store.comm.barrier()


def build_problem(cfg: ExperimentConfig, comm: Comm, output: OutputSink) -> tuple[Problem, StateLayout]:
    """The server's :class:`Problem` for ``cfg``, its analysis writing to ``output``; every check of the
    configuration and files first."""
    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    fields = experiment_fields(cfg, layout)
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]

    def initial(store: MemoryStore) -> None:
        with EnsembleFiles(paths, layout, mode="r", comm=comm, config=cfg.io) as ens:
            X = ens.read()
        store.scatter(cfg.cycle_numbers[0], X)
        write_initial_mean_spread(cfg, X, layout, comm)  # the report's cycle 0
        _carried_io(cfg, store, write=False)

    steps = cfg.steps_per_cycle
    # As offline: the same step (several server ranks analyse rows of equal estimated work, the same
    # result); the adaptive inflation field in memory, and written per cycle (a restart resumes from it).
    step = build_step(cfg.analysis, StateRows.of_layout(layout), comm, cycle_dir=lambda c: cfg.dir.cycle(c).path,
                      first_cycle=cfg.experiment.first_cycle, output=output, truth=truth_of(cfg.truth_path, layout))
    obs = CycleObservations(cfg.obs_path, layout, ObsSettings.from_experiment(cfg))
    return Problem(fields, cfg.experiment.members, initial, lambda cycle: steps, obs, step), layout


def server_config(cfg: ExperimentConfig, token: str, port: int, curve_secret: str | None = None) -> ServerConfig:
    o, odir = cfg.online, cfg.dir.online
    return ServerConfig(token=token, bind=o.bind, port=port, heartbeat_s=o.heartbeat, heartbeat_timeout_s=o.heartbeat_timeout,
                        rank_timeout_s=o.rank_timeout,
                        scheduler=SchedulerConfig(o.due_floor, o.due_factor, o.max_failures),
                        checkpoint_dir=odir.checkpoints, curve_secret_key=curve_secret,
                        address_file=odir.address, stateless_check=o.stateless_check,
                        min_runners=o.min_runners, stop_file=odir.stopping, transport=Transport(o.transport))


def write_final_restarts(cfg: ExperimentConfig, layout: StateLayout, store: MemoryStore) -> None:
    """The final analysis back into the restart files (the write-ahead log makes it crash-safe and a redo harmless)."""
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]
    with EnsembleFiles(paths, layout, mode="r+", comm=store.comm, config=cfg.io) as ens:
        ens.update(np.asfortranarray(store.gather(-1)))
    _carried_io(cfg, store, write=True)


def serve_experiment(cfg: ExperimentConfig, *, comm: Comm | None = None, progress=None) -> dict[int, dict[str, float]]:
    """Run the server of ``cfg`` (every rank calls it); the launcher wrote the token. The first start binds
    ``[online] port`` or any free port and records it in ``online/launch.json`` for the restarts."""
    comm = comm or get_comm()
    online = cfg.dir.online
    odir = online.path
    token = online.token.read_text().strip()
    # The port an earlier start of this server bound: runners that outlived it reconnect there.
    port = int((read_json(online.launch) or {}).get("port") or cfg.online.port)
    curve = online.curve_secret.read_text().strip() if cfg.online.curve else None
    events = EventLog(cfg.dir.events)
    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    ao = cfg.analysis_output
    files = BackgroundMeanSpread(mean_spread_setup(cfg), layout, comm, odir) if ao.mean_spread_files else None
    sink: OutputSink = files or NoOutput()
    if cfg.archive.dir is not None:
        sink = ArchivingOutput(sink, cfg, comm, events, progress)
    problem, layout = build_problem(cfg, comm, sink)  # every check first
    if files is not None:
        files.start()
    stats = None
    if ao.statistics_for("online"):
        # One writer for the whole study: the ranks add their rows each cycle and go on.
        # Ranks on several nodes reach rank 0's writer where they reach its bus: on the interface of
        # [online] bind (never every interface), and with CURVE (output.writer_process).
        nodes = node_names(comm)
        stats = AnalysisOutput(layout, cfg.dir.cycles, comm, **ao.writer_settings(),
                               tcp_bind=bus_host(cfg.online.bind, nodes) if len(set(nodes)) > 1 else None)
        problem.step.stats = stats
    try:
        try:
            server = Server(problem, server_config(cfg, token, port, curve), comm=comm, events=events, progress=progress)
        except BindError as exc:
            raise exc.of_experiment(str(cfg.expdir)) from None
        if comm.rank == 0 and port == 0:
            # Bound here, not probed by the launcher and released: nothing can take it in between.
            write_json_atomic(online.launch, {"port": server.port})
        diag = server.run(cfg.cycle_numbers)
        sink.wait()  # the last cycle's mean and spread files
        if isinstance(sink, ArchivingOutput):
            sink.finish(cfg.cycle_numbers[-1])
        if stats is not None:
            stats, s = None, stats
            s.close()
    finally:
        if stats is not None:
            stats.abandon()
        if files is not None:
            files.close()
    write_final_restarts(cfg, layout, server.store)
    return diag


RANK_LOST_RC = 75  # a server rank or its node was lost (EX_TEMPFAIL): the launcher restarts the server


def main(argv: list[str] | None = None) -> int:
    """``python -m enkflow.online.experiment EXPDIR``: exit 0 when the study is complete, 65 for an error
    that a restart cannot fix (written to ``EXPDIR/online/status.json``), 75 when a server rank was lost,
    other codes for a crash."""
    args = sys.argv[1:] if argv is None else argv
    comm = get_comm()
    # A cancel (SIGTERM) unwinds, so that the server removes its shared-memory segments on the way out;
    # a second one, or one while a collective blocks, ends the process as before.
    signal.signal(signal.SIGTERM, _cancelled)
    # Started by `enkflow run`: stop (SIGTERM, as a cancel) once its lease lapses. Under `enkflow serve`: no lease.
    watch_from_environment(f"server rank {comm.rank}")
    rc = _serve(ExperimentDir(Path(args[0])), comm)
    if rc != 0 and comm.size > 1:
        # Not through MPI_Finalize, which waits for every rank, and the others may wait in a collective
        # for this one: a rank that leaves without it makes mpiexec end them all.
        leave(rc)
    return rc


def _cancelled(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise SystemExit(128 + signum)


def _serve(expdir: ExperimentDir, comm: Comm) -> int:
    """The server's run on this rank, and its exit status (see :func:`main`).

    Whichever rank meets an error a restart cannot fix records it in the status file itself (on the
    shared file system): rank 0 may be waiting in a collective for that rank, and mpiexec ends it
    when this rank exits. A rank that finds another lost records that too, for the supervisor."""
    status = expdir.online.status
    where = f"server rank {comm.rank} (node {socket.gethostname()}): " if comm.size > 1 else ""
    alive = None
    try:
        cfg = experiment_from_json(read_json(expdir.config), file=str(expdir.config))
        if comm.size > 1:  # a node silent inside the analysis: the launcher sees this file stop changing
            alive = AliveFile(expdir.online.alive, comm.rank, socket.gethostname(), alive_period(cfg.online.rank_timeout))
        serve_experiment(cfg, comm=comm, progress=lambda m: print(m, flush=True))
    except (MemberError, ConfigError, FileFormatError, ArchiveFailure, BindError) as exc:
        of = "" if isinstance(exc, BindError) else f" (experiment {expdir.root})"  # a BindError names it
        body = {"state": ServerStatus.FAILED, "error": f"{where}{exc}{of}"}
        if isinstance(exc, MemberError):
            # The message without the "member M, cycle C: " prefix, which the supervisor's MemberError adds again.
            body.update(member=exc.member, cycle=exc.cycle, error=str(exc).split(": ", 1)[-1])
        write_json_atomic(status, body)
        print(f"enkflow server: error: {where}{exc}", file=sys.stderr, flush=True)
        return DETERMINISTIC_ERROR_RC
    except RankLost as exc:
        write_json_atomic(status, {"state": ServerStatus.RANK_LOST, "error": str(exc), "ranks": exc.ranks,
                                   "nodes": exc.nodes})
        print(f"enkflow server: error: {exc}", file=sys.stderr, flush=True)
        return RANK_LOST_RC
    except EnkflowError as exc:
        print(f"enkflow server: error: {where}{exc}", file=sys.stderr, flush=True)
        return 1
    except Exception:  # noqa: BLE001 - a defect: its traceback, then the exit that ends every rank
        traceback.print_exc()
        return 1
    finally:
        if alive is not None:
            alive.close()
    if comm.rank == 0:
        write_json_atomic(status, {"state": ServerStatus.DONE})
    return 0


if __name__ == "__main__":
    sys.exit(main())
