"""The observation space of one cycle's observation file (an
:class:`~enkflow.experiment.cycling.ObservationSpace`).

H is the file's operator (``[observations] interpolation``: the selection of the
observed state rows, the nearest rows, or bilinear interpolation), applied
rank-locally and summed across ranks, unless an operator stage wrote H(x) per
member (NetCDF files with ``hx(obs)``, or ``hx(slot, obs)`` with ``slot_time(slot)``
for H(x) at several times of the window, see docs/formats.md), which is then used
as given; the analysis mean is always mapped with the file's operator.

Its :meth:`~FileObservations.quality_control` (:class:`enkflow.analysis.qc.QualityControl` or
None) is the quality control :func:`enkflow.experiment.step.analyse` applies to the cycle's
observations. :class:`CycleObservations` reads each cycle's file when the cycle's analysis asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.analysis.qc import QualityControl
from enkflow.config import Metric
from enkflow.errors import FileFormatError, InputError
from enkflow.obs.gathered import sorted_ids
from enkflow.obs.obsfile import ObsFile, ObsSettings, load_for_state
from enkflow.obs.operators import GivenHX
from enkflow.obs.source import ObsFileSource
from enkflow.parallel import Comm
from enkflow.state import StateLayout

HX_VAR = "hx"
SLOT_DIM = "slot"
SLOT_TIME = "slot_time"
HX_SLICE = 1_000_000  # the most observations of an hx variable read at once (memory: slots x this x 8 bytes)


def slot_of(obs_time: np.ndarray, slot_time: np.ndarray) -> np.ndarray:
    """The time slot of each observation: the slot whose time is nearest (ties: the earlier slot)."""
    st = np.asarray(slot_time, dtype=np.float64)
    return np.argmin(np.abs(np.asarray(obs_time, dtype=np.float64)[:, None] - st[None, :]), axis=1)


def _windows(ids: np.ndarray) -> Iterator[slice]:
    """``ids`` (sorted file indices) in consecutive runs, each within HX_SLICE observations of the file."""
    lo = 0
    while lo < ids.size:
        hi = int(np.searchsorted(ids, ids[lo] + HX_SLICE))
        yield slice(lo, hi)
        lo = hi


def _slots(ds: netCDF4.Dataset, p: Path, var: netCDF4.Variable, n_obs: int,
           obs_time: np.ndarray | None) -> np.ndarray | None:
    """The time slot of each observation asked for (``obs_time``: theirs) where ``hx`` has slots, else
    None; the variable's shape checked against the observation file's ``n_obs``."""
    if var.ndim == 1:
        if var.shape[0] != n_obs:
            raise FileFormatError(f"hx has {var.shape[0]} values, the observation file {n_obs}", path=str(p),
                                  variable=HX_VAR)
        return None
    if var.ndim != 2:
        raise FileFormatError(f"hx has dimensions {var.dimensions}, expected (obs) or (slot, obs)", path=str(p),
                              variable=HX_VAR)
    if SLOT_TIME not in ds.variables:
        raise FileFormatError(f"hx has time slots {var.dimensions} but the file has no '{SLOT_TIME}'",
                              path=str(p), variable=SLOT_TIME)
    st = np.asarray(ds.variables[SLOT_TIME][:], dtype=np.float64).reshape(-1)
    if st.size != var.shape[0]:
        raise FileFormatError(f"{SLOT_TIME} has {st.size} values, hx {var.shape[0]} slots", path=str(p),
                              variable=SLOT_TIME)
    if obs_time is None:
        raise FileFormatError("hx has time slots, but the observation file has no 'time'", path=str(p),
                              variable=HX_VAR)
    if var.shape[1] != n_obs:
        raise FileFormatError(f"hx has {var.shape[1]} observations, the observation file {n_obs}", path=str(p),
                              variable=HX_VAR)
    return slot_of(obs_time, st)


def _member_hx(ds: netCDF4.Dataset, p: Path, n_obs: int, obs_time: np.ndarray | None, ids: np.ndarray) -> np.ndarray:
    """(len(ids),) H(x) of one member's file at the observations ``ids``, read slice by slice."""
    if HX_VAR not in ds.variables:
        raise FileFormatError("no variable 'hx' (the operator's H(x) per observation)", path=str(p), variable=HX_VAR)
    var = ds.variables[HX_VAR]
    slot = _slots(ds, p, var, n_obs, obs_time)
    out = np.empty(ids.size)
    for w in _windows(ids):
        a, b = int(ids[w][0]), int(ids[w][-1]) + 1
        if slot is None:
            v = np.asarray(var[a:b], dtype=np.float64)[ids[w] - a]
        else:
            v = np.asarray(var[:, a:b], dtype=np.float64)[slot[w], ids[w] - a]
        bad = ~np.isfinite(v)
        if bad.any():
            raise FileFormatError(f"hx holds NaN or Inf at observation {int(ids[w][np.argmax(bad)])}", path=str(p),
                                  variable=HX_VAR)
        out[w] = v
    return out


def read_given_hx(paths: Sequence[Path], n_obs: int, obs_time: np.ndarray | None = None,
                  ids: np.ndarray | None = None) -> np.ndarray:
    """H(x) per member from an operator stage, (n, N) C-order: of the file's ``n_obs`` observations,
    or of only those ``ids`` (ascending indices in the observation file, n of them). Each file holds
    ``hx(obs)``, or ``hx(slot, obs)`` and ``slot_time(slot)`` (relative to the analysis time, like the
    observation file's ``time``): each observation then takes the slot nearest its time (4-D / FGAT);
    a file with slots needs the times of the observations asked for (``obs_time``, (n,)). A file is
    read HX_SLICE observations at most at a time, so memory grows with n, not with ``n_obs``."""
    sel = np.arange(n_obs, dtype=np.int64) if ids is None else sorted_ids(ids, n_obs)
    if obs_time is not None and np.shape(obs_time) != (sel.size,):
        raise InputError(f"obs_time has shape {np.shape(obs_time)}, expected ({sel.size},): one time per "
                         "observation asked for", item="obs_time")
    HX = np.empty((sel.size, len(paths)))
    for m, p in enumerate(paths):
        try:
            with netCDF4.Dataset(p, "r") as ds:
                HX[:, m] = _member_hx(ds, Path(p), n_obs, obs_time, sel)
        except OSError as exc:
            raise FileFormatError(f"cannot read the operator output: {exc}", path=str(p), variable=HX_VAR) from None
    return HX


def quality_control(obs_file: ObsFile, settings: ObsSettings | None) -> QualityControl | None:
    """The QC ``settings`` ask for on ``obs_file``'s observations (None: none)."""
    return qc_for(obs_file.qc_sigma, obs_file.n_obs, obs_file.lonlat, settings)


def qc_for(qc_sigma: np.ndarray | None, n_obs: int, lonlat: bool, settings: ObsSettings | None) -> QualityControl | None:
    """The QC ``settings`` ask for on ``n_obs`` observations with the kinds' gross-error thresholds
    ``qc_sigma`` (n_obs,) or None, whose coordinates are longitude/latitude where ``lonlat``."""
    if settings is None:
        return None
    qc = settings.config.qc
    gross = qc_sigma
    if gross is None and qc.gross_sigma is not None:
        gross = np.full(n_obs, qc.gross_sigma)
    if gross is None and qc.buddy_radius is None:
        return None
    loc = settings.localization
    if loc is not None:
        metric, period = loc.metric, loc.period
    else:  # a global filter: the buddies' distance in the observations' own coordinates
        metric, period = (Metric.SPHERE if lonlat else Metric.CARTESIAN), None
    return QualityControl(gross, qc.buddy_radius, qc.buddy_sigma, metric, period)


class FileObservations:
    """The observations of one cycle, from ``obs_file`` (as :func:`~enkflow.obs.obsfile.load_for_state`
    read and checked it) on a state of ``n_rows`` rows; ``hx_files`` (member 1 first) hold H(x)
    of the cycle's forecasts, read when :meth:`apply` is called; ``settings`` give the QC.
    An :class:`~enkflow.experiment.cycling.ObservationSpace`."""

    def __init__(self, obs_file: ObsFile, n_rows: int, hx_files: Sequence[Path] | None = None,
                 settings: ObsSettings | None = None, source: ObsFileSource | None = None):
        self._source = source
        self.file = obs_file
        self.operator = obs_file.operator_for(n_rows)
        self.hx_files = list(hx_files) if hx_files else None
        self.qc = quality_control(obs_file, settings)

    @classmethod
    def load(cls, path: str | Path, layout: StateLayout, settings: ObsSettings, cycle: int | None = None,
             hx_files: Sequence[Path] | None = None) -> "FileObservations":
        """The observation file ``path`` read and checked against the state ``layout``, located in
        the metric of ``settings.localization`` (none: the state's own coordinates)."""
        metric = settings.localization.metric if settings.localization is not None else None
        of = load_for_state(path, layout, metric, cycle=cycle, settings=settings)
        source = ObsFileSource(Path(path), layout, settings, cycle, tuple(hx_files) if hx_files else None)
        return cls(of, layout.n_rows, hx_files, settings, source)

    def observations(self, cycle: int) -> ObsSet:
        return self.file.obs

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        if self.hx_files:
            return GivenHX(read_given_hx(self.hx_files, self.file.obs.n_obs, self.file.time)).apply(X, row_start, comm)
        return self.operator.apply(X, row_start, comm)

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.operator.apply(Xa, row_start, comm)

    def quality_control(self, cycle: int) -> QualityControl | None:
        return self.qc

    def kind_names(self, cycle: int) -> Mapping[int, str]:
        return self.file.kind_names

    def coordinate_metric(self, cycle: int) -> Metric | None:
        return Metric.SPHERE if self.file.lonlat else None

    def source(self, cycle: int) -> ObsFileSource | None:
        """The file these observations were loaded from (None: made in memory)."""
        return self._source

    def share(self, cycle: int, comm: Comm) -> None:
        return None


class CycleObservations:
    """Each cycle's observation file, ``path_of(cycle)``, read and checked against the state
    ``layout`` when the cycle's analysis first asks (:meth:`FileObservations.load`); an
    :class:`~enkflow.experiment.cycling.ObservationSpace` over every cycle of a study."""

    def __init__(self, path_of: Callable[[int], Path], layout: StateLayout, settings: ObsSettings):
        self.path_of, self.layout, self.settings = path_of, layout, settings
        self._cycle: int | None = None
        self._space: FileObservations | None = None

    def of(self, cycle: int) -> FileObservations:
        """The observations of ``cycle`` (the last cycle's are kept)."""
        if self._space is None or self._cycle != cycle:
            self._space = FileObservations.load(self.path_of(cycle), self.layout, self.settings, cycle)
            self._cycle = cycle
        return self._space

    def observations(self, cycle: int) -> ObsSet:
        return self.of(cycle).observations(cycle)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.of(cycle).apply(cycle, X, row_start, comm)

    def apply_analysis(self, cycle: int, Xa: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        return self.of(cycle).apply_analysis(cycle, Xa, row_start, comm)

    def quality_control(self, cycle: int) -> QualityControl | None:
        return self.of(cycle).quality_control(cycle)

    def kind_names(self, cycle: int) -> Mapping[int, str]:
        return self.of(cycle).kind_names(cycle)

    def coordinate_metric(self, cycle: int) -> Metric | None:
        return self.of(cycle).coordinate_metric(cycle)

    def source(self, cycle: int) -> ObsFileSource:
        return ObsFileSource(Path(self.path_of(cycle)), self.layout, self.settings, cycle)

    def share(self, cycle: int, comm: Comm) -> None:
        return None


class SlotObservations(FileObservations):
    """In-process 4-D / FGAT: a :class:`FileObservations` whose H(x) is taken, for each observation,
    at the time slot nearest its ``time`` (the file must have ``time``).

    ``slot_times`` (n_slots,): the slot times relative to the analysis time (the file's ``time``
    units). Whatever advances the members calls :meth:`record` with the ensemble rows at each slot
    time during the forecast (collective, like :meth:`apply`); :meth:`apply` then assembles H X from
    the recorded slots and forgets them. A slot that observations need but nobody recorded is an
    error naming it. The analysis's H (``apply_analysis``, for OmA) stays at the analysis time.
    """

    def __init__(self, obs_file: ObsFile, n_rows: int, slot_times: Sequence[float],
                 settings: ObsSettings | None = None):
        super().__init__(obs_file, n_rows, None, settings)
        if obs_file.time is None:
            raise InputError("time slots need the observations' times (the observation file's 'time')", item="time")
        self.slot_times = np.asarray(slot_times, dtype=np.float64).reshape(-1)
        if self.slot_times.size == 0:
            raise InputError("at least one time slot is needed", item="slot_times")
        self.slot = slot_of(obs_file.time, self.slot_times)
        self._hx: dict[int, np.ndarray] = {}

    def record(self, slot: int, X: np.ndarray, row_start: int, comm: Comm) -> None:
        """H of this rank's ensemble rows ``X`` (n_local_rows, N) at slot ``slot``; collective."""
        if not 0 <= slot < self.slot_times.size:
            raise InputError(f"time slot {slot} is not one of the {self.slot_times.size} slots", item="slot")
        self._hx[slot] = self.operator.apply(X, row_start, comm)

    def apply(self, cycle: int, X: np.ndarray, row_start: int, comm: Comm) -> np.ndarray:
        HX = np.empty((self.file.n_obs, X.shape[1]))
        for s in np.unique(self.slot).tolist():
            if s not in self._hx:
                raise InputError(f"cycle {cycle}: no H(x) was recorded for time slot {s} (time "
                                 f"{self.slot_times[s]:g}), which observations need", item="slot")
            at = self.slot == s
            HX[at] = self._hx[s][at]
        self._hx.clear()
        return HX
