"""A study's ``analysis_mean.nc`` and ``analysis_spread.nc`` (``[analysis_output]
mean_spread_files``), off the analysis's critical path.

The files hold the whole state in the restart's layout, with the template's coordinates
(:class:`enkflow.io.meanspread.MeanSpreadTemplate`). A writer process started once per run,
``python -m enkflow.output.mean_spread_files``, writes them on request (after its settings,
one JSON line per cycle on its stdin, one JSON line back), while the next forecasts run. A
process, not a thread: the netCDF library is not thread-safe, and the driver or the server
calls it meanwhile. Its layout is read from a copy of member 1's restart taken when the
driver or server starts (``COPY``), not from the restart, which a model may be rewriting. It is
given plain values (the ``[state]`` table, paths, the ensemble size, each cycle's directory): it
does not read the experiment's configuration.

* **offline** (:class:`MeanSpreadFromStatistics`): the analysis tasks only add their rows
  to the study's output service, which writes the per-variable statistics files
  (:mod:`enkflow.output.analysis_output`). After each cycle's analysis a thread of the driver
  waits until the service has written them, and the writer makes the two files from them:
  the same float64 values, so bitwise the files the analysis used to write itself. Without a
  service the analysis task writes them itself.
* **online** (:class:`BackgroundMeanSpread`, the server's output sink): the server gathers
  the mean and spread on rank 0, which saves them raw (2 x n_rows float64) for the writer.
  The cycle's checkpoint waits for the files: a restarted server skips every checkpointed
  cycle, so they must exist first.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import netCDF4
import numpy as np

from enkflow.errors import EnkflowError, FileFormatError, StorageError
from enkflow.fsutil import atomic_output
from enkflow.io.meanspread import MeanSpreadTemplate, gather_mean_spread
from enkflow.job_thread import JobThread
from enkflow.jobs.files import log_tail
from enkflow.output.analysis_output import field_name
from enkflow.output.heartbeat import Silence, kill_if_stalled
from enkflow.output.remote import RemoteOutput
from enkflow.parallel import Comm
from enkflow.state import StateConfig, StateLayout

MEAN, SPREAD = "analysis_mean.nc", "analysis_spread.nc"
TEMPLATE = "mean_spread_template.nc"
_POLL_S = 0.5


@dataclass(frozen=True)
class MeanSpreadSetup:
    """What the mean and spread files need of a study (the experiment layer builds it:
    :func:`enkflow.experiment.output_setup.mean_spread_setup`)."""

    source: Path  # member 1's restart: the layout's template (copied at the start), named in the files
    state: StateConfig  # the [state] table
    members: int  # N_e, named in the files
    cycle_dir: Callable[[int], Path]  # a cycle's directory (EXPDIR/cycles/NNNN), where its files go
    service_dir: Path  # offline: the output service's directory; the writer's template and log go there
    writer_timeout: float  # [analysis_output] writer_timeout: seconds a writer may make no progress


def copy_template(setup: MeanSpreadSetup, directory: Path) -> Path:
    """A skeleton of member 1's restart in ``directory``, the layout's template for the files: every
    dimension and variable definition with its attributes, and the values of only what the layout
    and the files read (the mask, the state variables' coordinates); a restart's size in values
    would be copied at every start otherwise."""
    src_path = setup.source
    state = setup.state
    wanted = {state.mask.variable} if state.mask is not None else set()
    wanted |= set(state.coordinates or ())
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / TEMPLATE
    try:
        with netCDF4.Dataset(src_path) as src, atomic_output(copy) as tmp, \
                netCDF4.Dataset(tmp, "w", format="NETCDF4") as dst:
            src.set_auto_maskandscale(False)
            for name in state.variables:
                if name in src.variables:
                    v = src.variables[name]
                    wanted |= set(v.dimensions)
                    if "coordinates" in v.ncattrs():
                        wanted |= set(str(v.getncattr("coordinates")).split())
            for d, dim in src.dimensions.items():
                dst.createDimension(d, None if dim.isunlimited() else len(dim))
            dst.setncatts({k: src.getncattr(k) for k in src.ncattrs()})
            for name, v in src.variables.items():
                fill = v.getncattr("_FillValue") if "_FillValue" in v.ncattrs() else None
                out = dst.createVariable(name, v.datatype, v.dimensions, fill_value=fill)
                out.set_auto_maskandscale(False)
                out.setncatts({k: v.getncattr(k) for k in v.ncattrs() if k != "_FillValue"})
                if name in wanted:
                    out[...] = v[...]
    except (OSError, RuntimeError) as exc:
        raise StorageError(f"the template of the mean and spread files could not be made from {src_path}: {exc}",
                           path=str(copy)) from None
    return copy


def files_missing(setup: MeanSpreadSetup, cycle: int) -> bool:
    """Whether ``cycle``'s mean or spread file is missing."""
    cdir = setup.cycle_dir(cycle)
    return not ((cdir / MEAN).is_file() and (cdir / SPREAD).is_file())


class _Writer:
    """The writer process and a thread that talks to it (no netCDF call in this process).

    A request waits for the answer as long as the writer makes progress (reads or writes bytes,
    :class:`enkflow.output.heartbeat.Silence`): one silent for ``[analysis_output] writer_timeout``
    seconds (stopped, stuck in the file system) is killed and the request fails naming it. Its
    files go under their final names by rename only, so a kill leaves none half-written."""

    def __init__(self, setup: MeanSpreadSetup, template: Path, log: Path):
        self.log = log
        self.timeout = setup.writer_timeout
        self.cycle_dir = setup.cycle_dir
        spec = {"template": str(template), "state": setup.state.model_dump(mode="json"),
                "source": str(setup.source), "members": setup.members}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "enkflow.output.mean_spread_files"],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True)
        self._bg = JobThread("enkflow-mean-spread")
        try:
            self._say(spec)
        except OSError:
            pass  # it died at once: the first request says so, with its log

    def request(self, cycle: int, rows: Path | None = None) -> None:
        """Write ``cycle``'s files (from ``rows``, else from its statistics files); blocks."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self._say({"cycle": cycle, "rows": str(rows) if rows else None, "dir": str(self.cycle_dir(cycle))})
            line = self._answer(cycle)
        except OSError:
            line = ""
        if not line:
            raise EnkflowError(f"cycle {cycle}: the writer of {MEAN} and {SPREAD} (pid {self.proc.pid}) died "
                               f"(exit {self.proc.wait()}):\n{log_tail(self.log, 10)}")
        error = json.loads(line).get("error")
        if error:
            raise EnkflowError(f"cycle {cycle}: {MEAN} and {SPREAD} were not written: {error}")

    def _say(self, line: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(line) + "\n")
        self.proc.stdin.flush()

    def _answer(self, cycle: int) -> str:
        """The writer's answer line ('' if it died); raises if it hangs (killed first)."""
        assert self.proc.stdout is not None
        silence = Silence(None, self.proc.pid)
        silence.seconds()
        while not select.select([self.proc.stdout], [], [], _POLL_S)[0]:
            if self.proc.poll() is not None:
                return ""
            stalled = kill_if_stalled(self.proc, silence, self.timeout)
            if stalled is not None:
                silent, state = stalled
                raise EnkflowError(
                    f"cycle {cycle}: the writer of {MEAN} and {SPREAD} (pid {self.proc.pid}) made no progress for "
                    f"{silent:.0f} s ([analysis_output] writer_timeout = {self.timeout:g} s)"
                    f"{f'; {state}' if state else ''}; killed: this cycle's files are not written")
        return self.proc.stdout.readline()

    def submit(self, cycle: int, rows: Path | None = None) -> None:
        """:meth:`request` in the background."""
        self._bg.submit(lambda: self.request(cycle, rows))

    def wait(self) -> None:
        """Until every submitted request is done; raises the first error."""
        self._bg.wait()

    def close(self) -> None:
        self._bg.close()  # the requests queued are answered first
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class MeanSpreadFromStatistics:
    """The offline driver's side: each cycle's files, written after its analysis from the statistics
    files of the study's output service (whose ``address`` and ``token`` are in ``service_dir``;
    None: no service runs, only finished cycles' missing files are written)."""

    def __init__(self, setup: MeanSpreadSetup, service_dir: Path | None):
        self.setup = setup
        self.service_dir = Path(service_dir) if service_dir is not None else None
        d = self.service_dir or setup.service_dir
        template = copy_template(setup, d)  # now, while no model rewrites the restart
        self._writer = _Writer(setup, template, d / "mean_spread.log")
        self._client: RemoteOutput | None = None

    def has_statistics(self, cycle: int) -> bool:
        cdir = self.setup.cycle_dir(cycle)
        return all((cdir / f"{field_name(v, s)}.nc").is_file() for v in self.setup.state.variables
                   for s in ("analysis_mean", "analysis_spread"))

    def analysed(self, cycle: int) -> None:
        """After ``cycle``'s analysis, before it counts as done: wait until the service has written
        the statistics (the files are made from them, so they must outlive a crash of the driver and
        the service together), then have the files written in the background."""
        if not files_missing(self.setup, cycle):  # the analysis task, having found no service, wrote them
            return
        if self.service_dir is not None:
            if self._client is None:
                self._client = RemoteOutput.from_dir(self.service_dir, timeout=30.0)
            self._client.sync()
        self._writer.submit(cycle)

    def write_now(self, cycle: int) -> None:
        """The files of ``cycle`` from its statistics files, written now."""
        self._writer.request(cycle)

    def wait(self) -> None:
        """Until every submitted cycle's files are written; raises the first error."""
        self._writer.wait()

    def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            try:
                client.close(wait=False)
            except EnkflowError:
                pass  # the service's stop reports its failures
        self._writer.close()


class BackgroundMeanSpread:
    """The online server's output sink (:class:`enkflow.experiment.cycling.OutputSink`): each
    cycle's files written by the writer process of rank 0. Collective :meth:`write`; :meth:`wait`
    (rank 0) until the files of every cycle so far are written."""

    def __init__(self, setup: MeanSpreadSetup, layout: StateLayout, comm: Comm, directory: Path):
        self.setup, self.layout, self.comm, self.dir = setup, layout, comm, Path(directory)
        self._writer: _Writer | None = None

    def start(self) -> None:
        """Start the writer (rank 0; after the study's checks, before the first forecast)."""
        if self.comm.rank == 0 and self._writer is None:
            for stale in self.dir.glob("mean_spread_*.f8"):  # of a server that died meanwhile
                stale.unlink(missing_ok=True)
            self._writer = _Writer(self.setup, copy_template(self.setup, self.dir), self.dir / "mean_spread.log")

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: object) -> None:
        """The analysis ``Xa`` (this rank's rows from ``row_start``) of ``cycle`` as its mean and spread files;
        ``diagnostics`` (the cycle's, as every output sink gets them) are not written here."""
        mean, spread = gather_mean_spread(Xa, self.layout, self.comm)  # on rank 0
        error = None
        if self.comm.rank == 0:
            try:
                self.start()
                assert self._writer is not None
                self._writer.wait()  # at most one cycle behind (without checkpoints nothing else waits)
                rows = self.dir / f"mean_spread_{cycle:04d}.f8"
                np.stack([mean, spread]).tofile(rows)
                self.setup.cycle_dir(cycle).mkdir(parents=True, exist_ok=True)
                self._writer.submit(cycle, rows)
            except (EnkflowError, OSError) as exc:
                error = str(exc)
        # Every rank raises rank 0's error: one rank leaving alone would leave the others in the
        # next collective for ever.
        error = self.comm.bcast(error, root=0)
        if error is not None:
            raise EnkflowError(f"server rank 0: {error}")

    def wait(self) -> None:
        if self._writer is not None:
            self._writer.wait()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


def _statistics(cdir: Path, layout: StateLayout, stat: str) -> np.ndarray:
    """The state's rows (n_rows,) of statistic ``stat`` of the cycle in ``cdir``, from the
    per-variable statistics files (:mod:`enkflow.output.analysis_output`)."""
    rows = np.empty(layout.n_rows)
    for v in layout.variables:
        name = field_name(v.name, stat)
        path = cdir / f"{name}.nc"
        try:
            with netCDF4.Dataset(path) as ds:
                var = ds.variables[name]
                var.set_auto_maskandscale(False)
                x = np.asarray(var[...], dtype=np.float64).reshape(-1)
        except (OSError, KeyError) as exc:
            raise FileFormatError(f"the analysis statistics cannot be read: {exc}", path=str(path)) from None
        if x.size != v.n_elems:
            raise FileFormatError(f"{x.size} values, the state variable {v.name!r} has {v.n_elems} elements",
                                  path=str(path))
        rows[v.rows] = x if v.index is None else x[v.index]  # the statistics files keep the variable's layout
    return rows


def write_files(cdir: Path, cycle: int, layout: StateLayout, tmpl: MeanSpreadTemplate, members: int,
                rows: Path | None = None) -> None:
    """``cycle``'s mean and spread files in its directory ``cdir``, for an ensemble of ``members``: from
    ``rows`` (the mean and the spread, 2 x n_rows float64, raw; removed once written) or else from the
    cycle's statistics files."""
    if rows is not None:
        mean, spread = np.fromfile(rows, dtype=np.float64).reshape(2, layout.n_rows)
    else:
        mean = _statistics(cdir, layout, "analysis_mean")
        spread = _statistics(cdir, layout, "analysis_spread")
    tmpl.write(cdir / MEAN, cdir / SPREAD, mean, spread, title=f"enkflow analysis, cycle {cycle}", n_ens=members)
    if rows is not None:
        rows.unlink()


def serve(spec: dict[str, Any], requests: TextIO) -> None:
    """The writer's loop: its settings ``spec`` (``template``: the layout's file, ``state``: the
    ``[state]`` table, ``source``: member 1's restart, ``members``), then a request per line of
    ``requests`` (``{"cycle": K, "rows": FILE or null, "dir": the cycle's directory}``), its answer
    per line on stdout (``{"cycle": K, "error": null or TEXT}``); ends at EOF."""
    layout = StateLayout.from_config(spec["template"], StateConfig.model_validate(spec["state"]))
    tmpl = MeanSpreadTemplate.read(layout, source=spec["source"])
    for line in requests:
        req = json.loads(line)
        cycle, rows = int(req["cycle"]), req.get("rows")
        try:
            write_files(Path(req["dir"]), cycle, layout, tmpl, int(spec["members"]), Path(rows) if rows else None)
            error = None
        except EnkflowError as exc:
            error = str(exc)
        except Exception as exc:  # noqa: BLE001 - told to the owner, which fails the run; this process lives on
            error = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"cycle": cycle, "error": error}), flush=True)


def main() -> int:
    """``python -m enkflow.output.mean_spread_files`` (:func:`serve`): its settings are the first line
    of stdin."""
    try:
        serve(json.loads(sys.stdin.readline()), sys.stdin)
    except (EnkflowError, OSError) as exc:
        print(f"enkflow: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
