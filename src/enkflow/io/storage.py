"""Where each variable's bytes lie in one file: the structure shared by the ensemble's files."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class VarStorage:
    """One variable of one file.

    ``dtype`` carries the byte order on disk (``>f8`` for NetCDF-3). ``offset`` is the byte
    offset of element 0 when the variable is stored contiguously (``contiguous``), else
    ``None`` and ``reason`` says why (chunked, compressed, several records...), which sends
    reads and writes through the NetCDF library.
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int | None
    contiguous: bool
    reason: str = ""

    def byte_offset(self, element: int) -> int:
        """Where element ``element`` (flat index) of a contiguous variable starts in the file, bytes."""
        if self.offset is None:
            raise ValueError(f"variable '{self.name}' has no byte offset ({self.reason}); it goes through the NetCDF library")
        return self.offset + element * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def layout_key(self) -> tuple[object, ...]:
        """What must agree between member files (everything but the offset)."""
        return (self.dims, self.shape, self.dtype.str, self.contiguous)


@dataclass(frozen=True)
class FileStructure:
    """The variables of one file and where their bytes are. ``format``: ``nc4`` (NetCDF-4/HDF5),
    ``cdf1`` (classic), ``cdf2`` (64-bit offset) or ``cdf5`` (64-bit data)."""

    path: str
    format: str
    size: int
    variables: dict[str, VarStorage] = field(default_factory=dict)

    def describe_var(self, name: str) -> str:
        v = self.variables[name]
        where = f"offset {v.offset}" if v.contiguous else f"library ({v.reason})"
        return f"{name}{v.dims} {v.shape} {v.dtype.str} {where}"
