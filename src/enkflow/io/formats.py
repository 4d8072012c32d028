"""The table of restart-file formats: each backend tells by the first bytes whether it can open
a file and returns its :class:`FileStructure`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from enkflow.errors import FileFormatError
from enkflow.io import hdf5, netcdf3
from enkflow.io.storage import FileStructure


@dataclass(frozen=True)
class Backend:
    name: str
    can_open: Callable[[bytes], bool]
    read_structure: Callable[[str], FileStructure]


BACKENDS: tuple[Backend, ...] = (
    Backend("netcdf3", lambda head: head[:4] in netcdf3.MAGICS, netcdf3.read_structure),
    Backend("netcdf4", hdf5.is_hdf5, hdf5.read_structure),
)


def read_structure(path: str | os.PathLike[str]) -> FileStructure:
    """Detect the format of ``path`` and return its structure (variables, dtypes, offsets)."""
    p = str(path)
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise FileFormatError("file not found", path=p) from None
    except OSError as exc:
        raise FileFormatError(f"cannot open: {exc.strerror}", path=p) from None
    for b in BACKENDS:
        if b.can_open(head):
            return b.read_structure(p)
    raise FileFormatError(
        "unsupported format: neither NetCDF-3 (CDF-1/2/5) nor NetCDF-4/HDF5 (HDF5 user blocks are not supported)", path=p
    )
