"""NetCDF-4 (HDF5) files: byte offsets of contiguous, unfiltered datasets from h5py.

Only the root group is searched (NetCDF-4 variables in sub-groups are not state variables
here). A chunked, filtered (compressed, shuffled), compact, external or never-allocated
dataset has no single byte range and goes through the NetCDF library instead.
"""

from __future__ import annotations

import os

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.io.storage import FileStructure, VarStorage

SIGNATURE = b"\x89HDF\r\n\x1a\n"


def is_hdf5(head: bytes) -> bool:
    return head[:8] == SIGNATURE


def read_structure(path: str) -> FileStructure:
    """Every root-group dataset of a NetCDF-4 file with its storage; raises FileFormatError."""
    import h5py  # lazy: 21 ms; only NetCDF-4 (HDF5) restarts need it, NetCDF-3/CDF-5 ones are read without it

    try:
        size = os.stat(path).st_size
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise FileFormatError("file not found", path=path) from None
    except OSError as exc:
        raise FileFormatError(f"cannot open as NetCDF-4/HDF5: {exc}", path=path) from None
    variables: dict[str, VarStorage] = {}
    try:
        for name, obj in f.items():
            if not isinstance(obj, h5py.Dataset):
                continue
            try:
                dt = np.dtype(obj.dtype)
            except TypeError:
                dt = np.dtype("O")
            reason = ""
            offset = None
            plist = obj.id.get_create_plist()
            if obj.chunks is not None:
                reason = f"chunked {obj.chunks}" + (f", {obj.compression} compressed" if obj.compression else "")
            elif plist.get_nfilters():
                reason = "filtered"
            elif plist.get_external_count():
                reason = "external storage"
            elif plist.get_layout() != h5py.h5d.CONTIGUOUS:
                reason = "compact layout"
            elif dt.kind == "O" or dt.hasobject:
                reason = "variable-length type"
            else:
                offset = obj.id.get_offset()
                if offset is None:
                    reason = "storage never allocated (variable never written)"
            contiguous = offset is not None
            variables[name] = VarStorage(name, (), tuple(int(n) for n in obj.shape), dt, offset, contiguous, reason)
    except (OSError, RuntimeError) as exc:
        raise FileFormatError(f"cannot read the HDF5 structure: {exc}", path=path) from None
    finally:
        f.close()
    return FileStructure(path, "nc4", size, variables)
