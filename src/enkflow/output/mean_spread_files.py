"""An offline study's ``analysis_mean.nc`` and ``analysis_spread.nc`` (``[analysis_output]
mean_spread_files``), off the analysis's critical path.

The files hold the whole state in the restart's layout, with the template's coordinates
(:class:`enkflow.io.meanspread.MeanSpreadTemplate`). The analysis tasks only add their rows
to the study's output service, which writes the per-variable statistics files
(:mod:`enkflow.output.analysis_output`). After each cycle's analysis, a thread of the driver
waits until the service has written them, then runs ``python -m enkflow.output.mean_spread_files
EXPDIR CYCLE``, which writes the two files from them: the same float64 values, so bitwise the
files the analysis used to write itself. A process, not the thread itself: the netCDF library
is not thread-safe, and the driver reads netCDF files meanwhile.

The layout is read from a copy of member 1's restart made when the driver starts
(``EXPDIR/output_service/mean_spread_template.nc``), not from the restart, which the next
forecast rewrites meanwhile. Without a service the analysis task writes the files itself.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np

from enkflow.errors import EnkflowError, FileFormatError
from enkflow.state import StateLayout

MEAN, SPREAD = "analysis_mean.nc", "analysis_spread.nc"
TEMPLATE = "mean_spread_template.nc"


class _OneThread:
    """Jobs run one after the other on a daemon thread; the first error is kept and raised by
    :meth:`wait` (and by :meth:`submit`, which does not queue after an error)."""

    def __init__(self, name: str):
        self._cond = threading.Condition()
        self._jobs: list[Callable[[], None]] = []
        self._busy = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._jobs))
                job = self._jobs.pop(0)
                self._busy = True
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                with self._cond:
                    self._error = self._error or exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def submit(self, job: Callable[[], None]) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            self._jobs.append(job)
            self._cond.notify_all()

    def wait(self) -> None:
        """Until every submitted job is done; raises the first error."""
        with self._cond:
            self._cond.wait_for(lambda: not self._jobs and not self._busy)
            if self._error is not None:
                raise self._error


class MeanSpreadFromStatistics:
    """The driver's side: each cycle's files, written after its analysis from the statistics
    files of the study's output service (whose ``address`` and ``token`` are in ``service_dir``)."""

    def __init__(self, cfg, service_dir: Path):
        self.cfg = cfg
        self.service_dir = Path(service_dir)
        self.python = cfg.launcher.python or sys.executable
        copy = self.service_dir / TEMPLATE
        tmp = copy.with_name(f".{copy.name}.tmp")
        shutil.copyfile(cfg.restart_path(1), tmp)  # now, while no model rewrites it
        tmp.replace(copy)
        self._bg = _OneThread("enkflow-mean-spread")

    def missing(self, cycle: int) -> bool:
        cdir = self.cfg.cycle_dir(cycle)
        return not ((cdir / MEAN).is_file() and (cdir / SPREAD).is_file())

    def submit(self, cycle: int) -> None:
        """Write the files of ``cycle`` in the background, once the service has written the
        statistics; unless they exist (the analysis task, having found no service, wrote them)."""
        if self.missing(cycle):
            self._bg.submit(lambda: self._after_sync(cycle))

    def _after_sync(self, cycle: int) -> None:
        from enkflow.output.remote import RemoteOutput

        client = RemoteOutput.from_dir(self.service_dir, timeout=30.0)
        try:
            client.sync()  # everything the analysis tasks added is written
        finally:
            client.close(wait=False)
        self.write_now(cycle)

    def write_now(self, cycle: int) -> None:
        """The files of ``cycle`` from its statistics files, written now by a process."""
        p = subprocess.run([self.python, "-m", "enkflow.output.mean_spread_files", str(self.cfg.expdir), str(cycle)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            tail = "\n".join((p.stderr or p.stdout).strip().splitlines()[-5:])
            raise EnkflowError(f"cycle {cycle}: {MEAN} and {SPREAD} were not written (exit {p.returncode}): {tail}")

    def wait(self) -> None:
        """Until every submitted cycle's files are written; raises the first error."""
        self._bg.wait()


def _statistics(cdir: Path, layout: StateLayout, stat: str) -> np.ndarray:
    """The state's rows (n_rows,) of statistic ``stat`` of the cycle in ``cdir``, from the
    per-variable statistics files (:mod:`enkflow.output.analysis_output`)."""
    import netCDF4

    from enkflow.output.analysis_output import field_name

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
        if x.size != v.n_rows:
            raise FileFormatError(f"{x.size} values, the state variable {v.name!r} has {v.n_rows} rows", path=str(path))
        rows[v.rows] = x
    return rows


def write_from_statistics(cfg, cycle: int) -> None:
    """``cycle``'s mean and spread files of experiment ``cfg``, from its statistics files."""
    from enkflow.io.meanspread import MeanSpreadTemplate
    from enkflow.output.analysis_output import service_dir

    layout = StateLayout.from_config(service_dir(cfg.expdir) / TEMPLATE, cfg.state)
    tmpl = MeanSpreadTemplate.read(layout, source=cfg.restart_path(1))
    cdir = cfg.cycle_dir(cycle)
    mean = _statistics(cdir, layout, "analysis_mean")
    spread = _statistics(cdir, layout, "analysis_spread")
    tmpl.write(cdir / MEAN, cdir / SPREAD, mean, spread, title=f"enkflow analysis, cycle {cycle}",
               n_ens=cfg.experiment.members)


def main(argv: list[str] | None = None) -> int:
    """``python -m enkflow.output.mean_spread_files EXPDIR CYCLE``."""
    from enkflow.experiment.config import experiment_from_json
    from enkflow.fsutil import read_json

    args = sys.argv[1:] if argv is None else argv
    expdir = Path(args[0])
    try:
        cfg = experiment_from_json(read_json(expdir / "config.json"), file=str(expdir / "config.json"))
        write_from_statistics(cfg, int(args[1]))
    except EnkflowError as exc:
        print(f"enkflow: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
