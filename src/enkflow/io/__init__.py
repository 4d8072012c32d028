"""Restart-file I/O: byte offsets of contiguous variables in NetCDF-3 and NetCDF-4/HDF5 files,
the parallel multi-file read/update of :class:`EnsembleFiles`, the crash-safe update, and the
analysis mean/spread files."""

from enkflow.io.config import IOConfig, LustreConfig, SafeUpdateConfig, UpdateMethod
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.transfer import TransferStats
from enkflow.io.formats import read_structure
from enkflow.io.meanspread import write_mean_spread
from enkflow.io.storage import FileStructure, VarStorage

__all__ = [
    "EnsembleFiles",
    "FileStructure",
    "IOConfig",
    "LustreConfig",
    "SafeUpdateConfig",
    "TransferStats",
    "UpdateMethod",
    "VarStorage",
    "read_structure",
    "write_mean_spread",
]
