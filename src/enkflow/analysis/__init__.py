"""Analysis: pure numerics, no file or socket I/O.

Global filters (ETKF, ESTKF, DEnKF, EnKF, EnKF-N) and local filters (LETKF, LESTKF)
share one interface: ``analyze(X, HX, obs, ...) -> Xa`` with ``X`` (n_rows, N).
"""

from enkflow.analysis.domains import LocalDomains
from enkflow.analysis.enkf_n import EnKFN
from enkflow.analysis.geometry import Geometry
from enkflow.analysis.global_filters import DEnKF, EnKF, ESTKF, ETKF, Filter
from enkflow.analysis.inflation import Inflation, inflate_posterior
from enkflow.analysis.local_filters import LESTKF, LETKF, Kernel, LocalFilter, LocalStats
from enkflow.analysis.localization import Localization
from enkflow.analysis.obsset import ObsSet

__all__ = [
    "DEnKF",
    "ESTKF",
    "ETKF",
    "EnKF",
    "EnKFN",
    "Filter",
    "Geometry",
    "Inflation",
    "Kernel",
    "LESTKF",
    "LETKF",
    "LocalFilter",
    "LocalDomains",
    "LocalStats",
    "Localization",
    "ObsSet",
    "inflate_posterior",
]
