"""The observations of a cycle as every rank holds them whole (the replicated layout): ``H X`` summed over
the ranks by one Allreduce, the quality control decided from it on every rank. Global filters, the serial
filter and local filters with fixed domains always use it; local filters on located rows where
``[analysis] observations = "replicated"``."""

from __future__ import annotations

import time

import numpy as np

from enkflow.analysis import Filter
from enkflow.analysis.qc import QCResult
from enkflow.experiment.cycle_diagnostics import BalanceReport, CycleDiagnostics, ObsLayoutReport
from enkflow.experiment.cycling import EnsembleStore, ObservationSpace
from enkflow.experiment.decomposition import LocalGeometry, local_analysis
from enkflow.experiment.serial_analysis import serial_analysis
from enkflow.obs import ObsSet
from enkflow.obs.diagnostics import ObsDiagnosticsWriter
from enkflow.obs.gathered import rms


class ReplicatedObs:
    """One cycle's observations ``obs`` whole on every rank of ``store`` (collective methods)."""

    def __init__(self, obs: ObservationSpace, store: EnsembleStore, cycle: int):
        self.obs, self.store, self.cycle = obs, store, cycle
        self.keep: np.ndarray | None = None

    def observe(self, X: np.ndarray) -> CycleDiagnostics:
        """H of the forecast rows ``X``, the quality control and the diagnostics they give."""
        obs, cycle = self.obs, self.cycle
        self.y_all = obs.observations(cycle)
        self.HX_all = obs.apply(cycle, X, self.store.row_start, self.store.comm)
        checks = obs.quality_control(cycle)
        self.qc: QCResult | None = checks.check(self.y_all, self.HX_all) if checks is not None else None
        keep = self.qc.keep if self.qc is not None and self.qc.flags.any() else None
        self.keep = keep
        self.y, self.HX = (self.y_all, self.HX_all) if keep is None else (self.y_all.subset(keep), self.HX_all[keep])
        return CycleDiagnostics(n_obs=self.y.n_obs, omb_rms=rms(self.y.values - self.HX.mean(axis=1)),
                                qc=self.qc.counts(self.y_all.kinds, dict(obs.kind_names(cycle))) if self.qc is not None else {})

    def assimilate(self, flt: Filter, local: LocalGeometry | None, X: np.ndarray,
                   infl: np.ndarray | None) -> tuple[np.ndarray, BalanceReport | None]:
        """The filter on this rank's rows ``X``: a global filter's transform, or the local analysis of
        the ranks' domains (which may overwrite ``X``), or the serial filter on this rank's rows with
        their coordinates; and the balance report of a local or the serial one, if any."""
        sf = flt.as_serial()
        if sf is not None and local is not None:
            return serial_analysis(sf, local, self.store, X, self.HX, self.y, self.cycle, infl)
        lf = flt.as_local()
        if lf is None or local is None:
            return flt.analyze(X, self.HX, self.y, cycle=self.cycle), None
        return local_analysis(lf, local, self.store, X, self.HX, self.y, self.cycle, infl)

    def oma(self, Xa: np.ndarray) -> float:
        """RMS of the used observations minus H of the analysis mean of the rows ``Xa``."""
        st = self.store
        mean = np.ascontiguousarray(Xa.mean(axis=1))[:, None]
        hxa = self.obs.apply_analysis(self.cycle, mean, st.row_start, st.comm)[:, 0]
        return rms(self.y.values - (hxa if self.keep is None else hxa[self.keep]))

    def report(self) -> ObsLayoutReport:
        """Every rank held every observation and the whole H(x); an Allreduce of it (reduce-scatter and
        allgather, MPICH's for large messages) sends and receives 4 (P - 1) / P of its bytes per rank."""
        P = self.store.comm.size
        n, N = self.HX_all.shape
        hx = 8.0 * n * N
        arrays = (3.0 if self.keep is not None else 2.0) * hx + _obs_bytes(self.y_all)
        return ObsLayoutReport(False, [float(n)] * P, [float(n)] * P, [arrays] * P, [4.0 * (P - 1) / P * hx] * P,
                               [0.0] * P)

    def write_diagnostics(self, writer: ObsDiagnosticsWriter, Xa: np.ndarray) -> float:
        """The cycle's observation-space diagnostics of every observation (QC-rejected ones included)
        from the forecast ``HX`` and H of the analysis members ``Xa`` (collective); its seconds."""
        t0 = time.perf_counter()
        st = self.store
        HXa = self.obs.apply_analysis(self.cycle, Xa, st.row_start, st.comm)
        writer.write(self.cycle, self.y_all, self.HX_all, HXa, self.qc.flags if self.qc is not None else None,
                     self.obs.kind_names(self.cycle), self.obs.coordinate_metric(self.cycle))
        return time.perf_counter() - t0


def _obs_bytes(y: ObsSet) -> float:
    """Bytes of the observations' own arrays (values, variances, coordinates, kinds, radii, levels)."""
    return float(sum(a.nbytes for a in (y.values, y.error_var, y.coords, y.kinds, y.half_width, y.vcoord)
                     if a is not None))
