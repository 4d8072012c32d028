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

import sys
from pathlib import Path

import numpy as np

from enkflow.analysis import LocalDomains
from enkflow.analysis.factory import make_filter
from enkflow.errors import DETERMINISTIC_ERROR_RC, ConfigError, EnkflowError, FileFormatError, MemberError
from enkflow.experiment.config import ExperimentConfig, experiment_from_json
from enkflow.experiment.cycling import LocalGeometry, NoOutput
from enkflow.experiment.output_setup import background_archiver, mean_spread_setup
from enkflow.fsutil import read_json, write_json_atomic
from enkflow.jobs.events import EventLog
from enkflow.obs.obsfile import ObsSettings, load_for_state
from enkflow.obs.space import FileObservations
from enkflow.obs.vertical import localization_coords
from enkflow.online.fields import Field
from enkflow.output.archive_background import ArchiveFailure
from enkflow.output.mean_spread_files import BackgroundMeanSpread
from enkflow.online.scheduler import SchedulerConfig
from enkflow.online.server import Problem, Server, ServerConfig
from enkflow.online.store import MemoryStore
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout


def online_dir(cfg: ExperimentConfig) -> Path:
    return cfg.expdir / "online"


class CycleObservations:
    """Each cycle's observation file, read and checked against the state when the cycle's analysis asks."""

    def __init__(self, cfg: ExperimentConfig, layout: StateLayout):
        self.cfg, self.layout = cfg, layout
        self._cycle: int | None = None
        self._space: FileObservations | None = None
        self.qc = None
        self.kind_names: dict[int, str] = {}

    def _for(self, cycle: int) -> FileObservations:
        if self._cycle != cycle:
            metric = self.cfg.analysis.localization.metric if self.cfg.analysis.localization else None
            settings = ObsSettings.from_experiment(self.cfg)
            of = load_for_state(self.cfg.obs_path(cycle), self.layout, metric, cycle=cycle, settings=settings)
            self._space, self._cycle = FileObservations(of, self.layout.n_rows, settings=settings), cycle
            self.qc, self.kind_names = self._space.qc, self._space.kind_names
        return self._space

    def observations(self, cycle: int):
        return self._for(cycle).observations(cycle)  # also sets self.qc, self.kind_names (analyse reads them)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self._for(cycle).apply(cycle, X, row_start, comm)

    def apply_mean(self, cycle: int, x: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self._for(cycle).apply_mean(cycle, x, row_start, comm)


class ArchivingOutput:
    """An output sink that also archives the server's analysis checkpoints ([archive] dir).

    At cycle k's output every rank has flushed its checkpoints (each does before the collective
    analysis), so the analysis checkpoints of cycle k - 1 are complete on every rank: rank 0
    stages them (hard links: a checkpoint is renamed into place, never rewritten) and the
    background archiver compresses and copies them. :meth:`finish` does the last cycle's, once
    the server's checkpointer has closed, and waits for the archiver."""

    def __init__(self, inner, cfg: ExperimentConfig, comm: Comm, events: EventLog, progress=None):
        self.inner, self.cfg, self.comm = inner, cfg, comm
        self.dir = online_dir(cfg) / "checkpoints"
        self.archiver = background_archiver(cfg, events, progress) if comm.rank == 0 else None
        if self.archiver is not None:
            self.archiver.poll()  # cycles a crashed server staged but did not archive

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: dict[str, float]) -> None:
        self.inner.write(cycle, Xa, row_start, diagnostics)
        self._stage(cycle - 1)

    def wait(self) -> None:
        self.inner.wait()

    def _stage(self, cycle: int) -> None:
        from enkflow.online.checkpoint import analysis_path
        from enkflow.output.archive import listed_cycles

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
    import netCDF4

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
    import netCDF4

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


def build_problem(cfg: ExperimentConfig, comm: Comm, sink=None, stats=None) -> tuple[Problem, StateLayout]:
    """The server's :class:`Problem` for ``cfg``; every check of the configuration and files first."""
    from enkflow.io import EnsembleFiles

    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    fields = experiment_fields(cfg, layout)
    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]

    def initial(store: MemoryStore) -> None:
        with EnsembleFiles(paths, layout, mode="r", comm=comm, config=cfg.io) as ens:
            X = ens.read()
        store.scatter(cfg.cycle_numbers[0], X)
        _carried_io(cfg, store, write=False)

    # As offline: several server ranks analyse rows of equal estimated work (the same result).
    balance = True if cfg.analysis.balance and comm.size > 1 and cfg.analysis.method.is_local else None

    def local(store: MemoryStore) -> LocalGeometry | None:
        if not cfg.analysis.method.is_local:
            return None
        if balance:
            return LocalGeometry(row_coords=localization_coords(layout, cfg.analysis.localization))
        return LocalGeometry(LocalDomains.by_location(
            localization_coords(layout, cfg.analysis.localization)[store.row_start:store.row_stop]))

    steps = cfg.steps_per_cycle
    from enkflow.analysis.adaptive_inflation import FieldCarrier
    from enkflow.obs.diagnostics import ObsDiagnosticsWriter

    flt = make_filter(cfg.analysis)
    metric = cfg.analysis.localization.metric.value if cfg.analysis.localization else None
    carrier = None
    if getattr(flt, "adaptive", None) is not None:  # in memory, and written per cycle (a restart resumes from it)
        carrier = FieldCarrier(flt.adaptive, layout.n_rows, comm, cfg.cycle_dir, layout.coords)
    problem = Problem(fields, cfg.experiment.members, initial, lambda cycle: steps, CycleObservations(cfg, layout),
                      flt, local=local, sink=sink or BackgroundMeanSpread(mean_spread_setup(cfg), layout, comm, online_dir(cfg)),
                      balance=balance, stats=stats, obs_diag=ObsDiagnosticsWriter(cfg.cycle_dir, comm.rank, metric),
                      inflation=carrier)
    return problem, layout


def server_config(cfg: ExperimentConfig, token: str, port: int, curve_secret: str | None = None) -> ServerConfig:
    o = cfg.online
    return ServerConfig(token=token, bind=o.bind, port=port, heartbeat_s=o.heartbeat, heartbeat_timeout_s=o.heartbeat_timeout,
                        scheduler=SchedulerConfig(o.due_floor, o.due_factor, o.max_failures),
                        checkpoint_dir=online_dir(cfg) / "checkpoints", curve_secret_key=curve_secret,
                        address_file=online_dir(cfg) / "address", stateless_check=o.stateless_check,
                        min_runners=o.min_runners, stop_file=online_dir(cfg) / "stopping.json")


def write_final_restarts(cfg: ExperimentConfig, layout: StateLayout, store: MemoryStore) -> None:
    """The final analysis back into the restart files (the write-ahead log makes it crash-safe and a redo harmless)."""
    from enkflow.io import EnsembleFiles

    paths = [cfg.restart_path(m) for m in range(1, cfg.experiment.members + 1)]
    with EnsembleFiles(paths, layout, mode="r+", comm=store.comm, config=cfg.io) as ens:
        ens.update(np.asfortranarray(store.gather(-1)))
    _carried_io(cfg, store, write=True)


def serve_experiment(cfg: ExperimentConfig, *, comm: Comm | None = None, progress=None) -> dict[int, dict[str, float]]:
    """Run the server of ``cfg`` (every rank calls it); the launcher wrote the token and the port."""
    comm = comm or get_comm()
    odir = online_dir(cfg)
    token = (odir / "token").read_text().strip()
    port = int((read_json(odir / "launch.json") or {}).get("port", cfg.online.port))
    curve = (odir / "curve.key").read_text().strip() if cfg.online.curve else None
    events = EventLog(cfg.expdir / "events.jsonl")
    layout = StateLayout.from_config(cfg.restart_path(1), cfg.state)
    ao = cfg.analysis_output
    files = BackgroundMeanSpread(mean_spread_setup(cfg), layout, comm, odir) if ao.mean_spread_files else None
    sink = files or NoOutput()
    if cfg.archive.dir is not None:
        sink = ArchivingOutput(sink, cfg, comm, events, progress)
    problem, layout = build_problem(cfg, comm, sink)  # every check first
    if files is not None:
        files.start()
    stats = None
    if ao.statistics_for("online"):
        from enkflow.output.analysis_output import AnalysisOutput

        # One writer for the whole study: the ranks add their rows each cycle and go on.
        stats = AnalysisOutput(layout, cfg.expdir / "cycles", comm, **ao.writer_settings())
        problem.stats = stats
    try:
        server = Server(problem, server_config(cfg, token, port, curve), comm=comm, events=events, progress=progress)
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


def main(argv: list[str] | None = None) -> int:
    """``python -m enkflow.online.experiment EXPDIR``: exit 0 when the study is complete, 65 for an error
    that a restart cannot fix (written to ``EXPDIR/online/status.json``), other codes for a crash."""
    args = sys.argv[1:] if argv is None else argv
    expdir = Path(args[0])
    comm = get_comm()
    status = expdir / "online" / "status.json"
    try:
        cfg = experiment_from_json(read_json(expdir / "config.json"), file=str(expdir / "config.json"))
        serve_experiment(cfg, comm=comm, progress=lambda m: print(m, flush=True))
    except (MemberError, ConfigError, FileFormatError, ArchiveFailure) as exc:
        if comm.rank == 0:
            body = {"state": "failed", "error": str(exc)}
            if isinstance(exc, MemberError):
                # The message without the "member M, cycle C: " prefix, which the supervisor's MemberError adds again.
                body.update(member=exc.member, cycle=exc.cycle, error=str(exc).split(": ", 1)[-1])
            write_json_atomic(status, body)
        print(f"enkflow server: error: {exc}", file=sys.stderr, flush=True)
        return DETERMINISTIC_ERROR_RC
    except EnkflowError as exc:
        print(f"enkflow server: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if comm.rank == 0:
        write_json_atomic(status, {"state": "done"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
