"""Checks that N_e member files really share one structure, before any byte is read or written."""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence


from enkflow.errors import FileFormatError, StructureMismatchError
from enkflow.io.formats import read_structure
from enkflow.io.storage import FileStructure
from enkflow.state import StateLayout


def _state_checks(fs: FileStructure, layout: StateLayout) -> None:
    for sv in layout.variables:
        vs = fs.variables.get(sv.name)
        if vs is None:
            raise FileFormatError("state variable missing from the file", path=fs.path, variable=sv.name)
        if vs.dtype.kind != "f" or vs.dtype.itemsize not in (4, 8):
            raise FileFormatError(f"unsupported layout: state variables must be float32/float64, found {vs.dtype}", path=fs.path, variable=sv.name)
        if vs.shape != sv.shape:
            raise StructureMismatchError(f"shape {vs.shape} differs from the template's {sv.shape} ({layout.template})", path=fs.path, variable=sv.name)
    for vs in fs.variables.values():  # auxiliary variables too: a cut file is a damaged file
        if vs.contiguous and vs.offset is not None and vs.offset + vs.nbytes > fs.size:
            raise FileFormatError(
                f"file is truncated: {fs.size} bytes, the variable's data end at byte {vs.offset + vs.nbytes}",
                path=fs.path, variable=vs.name,
            )


def _compare(ref: FileStructure, fs: FileStructure) -> None:
    """The first variable (in the reference file's order) whose structure differs."""
    if fs.format != ref.format:
        first = next(iter(ref.variables), None)
        raise StructureMismatchError(f"format {fs.format} differs from {ref.format} of {ref.path}", path=fs.path, variable=first)
    for name, rv in ref.variables.items():
        v = fs.variables.get(name)
        if v is None:
            raise StructureMismatchError(f"variable missing (present in {ref.path})", path=fs.path, variable=name)
        if v.layout_key() != rv.layout_key():
            what = []
            if v.dims != rv.dims:
                what.append(f"dims {v.dims} vs {rv.dims}")
            if v.shape != rv.shape:
                what.append(f"shape {v.shape} vs {rv.shape}")
            if v.dtype.str != rv.dtype.str:
                what.append(f"dtype/byte order {v.dtype.str} vs {rv.dtype.str}")
            if v.contiguous != rv.contiguous:
                what.append(f"storage {'contiguous' if v.contiguous else v.reason} vs {'contiguous' if rv.contiguous else rv.reason}")
            raise StructureMismatchError(f"structure differs from {ref.path}: {'; '.join(what)}", path=fs.path, variable=name)
    for name in fs.variables:
        if name not in ref.variables:
            raise StructureMismatchError(f"extra variable not in {ref.path}", path=fs.path, variable=name)


def check_writable(path: str, variable: str) -> None:
    """The update needs write access; a file without any write bit counts as read-only even for root."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise FileFormatError(f"cannot stat: {exc.strerror}", path=path, variable=variable) from None
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH) or not os.access(path, os.W_OK):
        raise FileFormatError("file is read-only; the in-place update needs write access", path=path, variable=variable)
    try:
        os.close(os.open(path, os.O_RDWR))
    except OSError as exc:
        raise FileFormatError(f"cannot open for writing: {exc.strerror}", path=path, variable=variable) from None


def validate_files(paths: Sequence[str], layout: StateLayout, *, writable: bool) -> list[FileStructure]:
    """Structures of ``paths`` (member order), after checking that every file exists, opens,
    is long enough, holds the state variables with the template's shapes, and shares the first
    file's structure (variables, shapes, dtypes, byte order, storage layout). Raises
    :class:`FileFormatError` / :class:`StructureMismatchError` naming the first bad file and
    variable. Byte offsets may differ between files (each file keeps its own)."""
    first_var = layout.variables[0].name
    out: list[FileStructure] = []
    for p in paths:
        try:
            fs = read_structure(p)
        except FileFormatError as exc:
            if exc.variable is None:
                raise FileFormatError(f"{str(exc).split(': ', 1)[-1]} (needed for state variable(s) {', '.join(layout.names)})", path=p, variable=first_var) from None
            raise
        _state_checks(fs, layout)
        if out:
            _compare(out[0], fs)
        if writable:
            check_writable(p, first_var)
        out.append(fs)
    return out


def state_nbytes(fs: FileStructure, layout: StateLayout) -> int:
    """Bytes of one file's state (the rows of the state vector, in the file's dtypes)."""
    return int(sum(sv.n_rows * fs.variables[sv.name].dtype.itemsize for sv in layout.variables))


__all__ = ["check_writable", "state_nbytes", "validate_files"]
