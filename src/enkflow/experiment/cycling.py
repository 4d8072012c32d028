"""One cycle driver for every mode, written against four small interfaces.

A data-assimilation cycle is: advance every member (``Propagator``), gather the
forecast ensemble as this rank's row block (``EnsembleStore``), apply H and
assimilate the cycle's observations (``ObservationSpace`` and the analysis step),
scatter the analysis back and hand it to the sinks (``OutputSink``, ``StatsSink``)::

    for k in cycles:                # run_cycles(cycles, propagator, analysis, on_cycle_end=...)
        propagator.forecast(k)
        diag = analysis(k)          # analyse(step, store, obs, k) where it runs in-process
        on_cycle_end(k, diag)       # scores, bookkeeping

Offline files with the job scheme (:mod:`enkflow.experiment.driver`), online
server and runners (:mod:`enkflow.online`) and in-process Lorenz-96
(:mod:`enkflow.apps.l96`) implement these interfaces; the analysis
itself is the one function :func:`enkflow.experiment.step.analyse` of the one
:class:`~enkflow.experiment.step.AnalysisStep` that
:func:`~enkflow.experiment.step.build_step` makes from the configuration (after
JEDI/OOPS ``LocalEnsembleDA::execute``: the algorithm reads the same whatever
stores the ensemble or runs the model).

The in-memory :class:`ArrayStore` serves Lorenz-96 and tests;
:class:`enkflow.experiment.file_store.FileStore` the member restart files,
:class:`enkflow.online.store.MemoryStore` the online server's shares.

Shapes: ``X`` is the ensemble of this rank's rows, (n_local_rows, N),
Fortran order (one member contiguous), float64; ``HX`` is (n_obs, N) and the
same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar, runtime_checkable

import numpy as np

from enkflow.analysis.qc import QualityControl
from enkflow.config import Metric
from enkflow.errors import InputError
from enkflow.experiment.cycle_diagnostics import CycleDiagnostics
from enkflow.obs import ObsSet
from enkflow.obs.distributed_space import ReadShare
from enkflow.obs.source import ObsFileSource
from enkflow.parallel import Comm, SerialComm

D = TypeVar("D")  # what a cycle's analysis returns: its diagnostics


@runtime_checkable
class EnsembleStore(Protocol):
    """Where the ensemble lives between cycles, seen by one rank of ``comm``.

    This rank owns the state rows ``row_start:row_stop`` of ``n_rows``.
    """

    comm: Comm
    n_rows: int
    n_members: int
    row_start: int
    row_stop: int

    def gather(self, cycle: int) -> np.ndarray:
        """The forecast ensemble of this rank's rows, (row_stop - row_start, N), float64, Fortran order.
        The caller may overwrite it (the analysis is computed in place where it can)."""
        ...

    def scatter(self, cycle: int, Xa: np.ndarray, record: Mapping[str, float]) -> None:
        """Store the analysis ``Xa`` (same shape as :meth:`gather`'s) as the next cycle's initial ensemble.
        ``record``: the cycle's scalar diagnostics, which a store that makes the analysis durable as it
        stores it commits with it (the member files' completion record); others ignore it."""
        ...

    def checkpoint(self, cycle: int, after: Callable[[], None] | None = None) -> None:
        """Make the analysis of ``cycle``, as scattered, survive a restart, once ``after()`` (the
        cycle's outputs written) has returned: a restart resumes after the last checkpointed cycle.
        A store whose :meth:`scatter` is already durable (the member files) or that no restart
        reads (memory) does nothing."""
        ...


@runtime_checkable
class Propagator(Protocol):
    """Advances every member of the ensemble by one cycle's forecast length."""

    def forecast(self, cycle: int) -> None: ...


@runtime_checkable
class ObservationSpace(Protocol):
    """The observations of a cycle, their quality control and the operator H, applied rank-locally.

    A class that derives from it takes the defaults of :meth:`quality_control` (none),
    :meth:`kind_names` (none) and :meth:`coordinate_metric` (not known)."""

    def observations(self, cycle: int) -> ObsSet:
        """``y`` (n_obs,), the error variances and the observation coordinates."""
        ...

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        """``H X``, (n_obs, N), of the forecast: from this rank's rows ``X`` (n_local_rows, N)
        starting at ``row_start``; collective: every rank returns the full product."""
        ...

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        """``H Xa``, (n_obs, k), of states that are not the forecast: this rank's rows ``Xa``
        (n_local_rows, k) of the analysis members or of the analysis mean (k = 1); collective.
        Where H(x) of the forecast came from an external operator stage, this is the
        observations' own operator (the state-row selection, the interpolation)."""
        ...

    def quality_control(self, cycle: int) -> QualityControl | None:
        """The checks of the cycle's observations, or None: every observation is used."""
        return None

    def kind_names(self, cycle: int) -> Mapping[int, str]:
        """The names of the observation kinds' codes (those without a name are named by their code)."""
        return {}

    def coordinate_metric(self, cycle: int) -> Metric | None:
        """How the observations' coordinates measure distance where they say it themselves
        (``Metric.SPHERE``: longitude and latitude in degrees); None: they do not."""
        return None

    def source(self, cycle: int) -> ObsFileSource | None:
        """The cycle's observation file, for an analysis that reads it distributed by locality
        (:mod:`enkflow.experiment.obs_distributed`); None: these observations are only whole."""
        return None

    def share(self, cycle: int, comm: Comm) -> ReadShare | None:
        """This rank's share of :meth:`source`'s file where it was read already (None: read it then)."""
        return None


@runtime_checkable
class OutputSink(Protocol):
    """Receives each cycle's analysis (this rank's rows, as stored) and its diagnostics, last in
    :func:`~enkflow.experiment.step.analyse`; collective where it writes files. A class that
    derives from it takes the default :meth:`wait`."""

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None: ...

    def wait(self) -> None:
        """Return once what was written is on disk (a sink that writes in the background); raises its errors."""
        return None


@runtime_checkable
class StatsSink(Protocol):
    """Receives each cycle's ensemble statistics of this rank's rows, from :func:`~enkflow.experiment.step.analyse`.

    ``rows`` maps ``forecast_mean``, ``analysis_mean``, ``analysis_spread`` (standard deviation,
    ddof = 1) and ``analysis_increment`` (analysis minus forecast mean) to (row_stop - row_start,)
    float64 arrays of state rows ``row_start:``. Not collective: a rank hands its rows on and goes
    on (an asynchronous output, :class:`enkflow.output.analysis_output.AnalysisOutput`)."""

    def add(self, cycle: int, row_start: int, rows: dict[str, np.ndarray]) -> None: ...


class ArrayStore:
    """An :class:`EnsembleStore` in memory: this rank's rows ``X`` (n_local_rows, N), starting at
    state row ``row_start`` of ``n_rows`` (default: the rows of every rank, summed over ``comm``,
    which makes the constructor collective; ``comm`` defaults to a :class:`SerialComm`).

    :meth:`gather` hands out the held array itself, no copy (an in-place analysis overwrites
    it); :meth:`scatter` keeps the array it is given. A propagator may replace ``X``.
    """

    def __init__(self, X: np.ndarray, *, comm: Comm | None = None, row_start: int = 0, n_rows: int | None = None):
        self.X = np.asfortranarray(X, dtype=np.float64)
        if self.X.ndim != 2:
            raise InputError(f"the ensemble must be (n_rows, N), got shape {self.X.shape}", item="X")
        self.comm = comm or SerialComm()
        self.n_members = self.X.shape[1]
        self.row_start = row_start
        self.row_stop = row_start + self.X.shape[0]
        if n_rows is None:
            n_rows = int(self.comm.allreduce_sum(np.array([self.X.shape[0]]))[0])
        self.n_rows = n_rows

    def gather(self, cycle: int) -> np.ndarray:
        return self.X

    def scatter(self, cycle: int, Xa: np.ndarray, record: Mapping[str, float] | None = None) -> None:
        if Xa.shape != (self.row_stop - self.row_start, self.n_members):
            raise InputError(f"the analysis has shape {Xa.shape}, the store holds {self.X.shape}", item="Xa")
        self.X = Xa

    def checkpoint(self, cycle: int, after: Callable[[], None] | None = None) -> None:
        return None  # nothing in memory survives a restart


class NoOutput(OutputSink):
    """An output sink that keeps nothing."""

    def write(self, cycle: int, Xa: np.ndarray, row_start: int, diagnostics: CycleDiagnostics) -> None:
        return None


def run_cycles(
    cycles: Iterable[int],
    propagator: Propagator,
    analysis: Callable[[int], D],
    *,
    on_cycle_end: Callable[[int, D], None] | None = None,
) -> list[int]:
    """The cycle loop: forecast, analysis, end-of-cycle hook; returns the cycles run.

    ``analysis(k)`` is :func:`~enkflow.experiment.step.analyse` of a step, store and
    observation space where the analysis runs in this process (online, Lorenz-96), or
    the offline job scheme's analysis task, which calls the same function in its own
    (MPI) process.
    """
    done = []
    for k in cycles:
        propagator.forecast(k)
        diag = analysis(k)
        if on_cycle_end is not None:
            on_cycle_end(k, diag)
        done.append(k)
    return done
