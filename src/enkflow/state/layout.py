"""The state vector of a restart file: which elements of which variables, in which order.

State row ``r`` is one element of one state variable. Variables are stacked in the configured
order; within a variable, elements follow the file's C (row-major) order, keeping only the
masked points when a mask applies. So a row range maps to a few ``Piece``s, each a run of rows
of one variable lying inside one contiguous element range of that variable; that is what lets
:mod:`enkflow.io` read a rank's rows with one ``pread`` per variable and file.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.errors import FileFormatError, InputError
from enkflow.state.config import MaskConfig, StateConfig
from enkflow.state.coords import CoordAxis, CoordKind, state_coords
from enkflow.state.mask import mask_index

_STATE_DTYPES = (np.dtype(np.float64), np.dtype(np.float32))


@dataclass(frozen=True, eq=False)
class StateVariable:
    """One variable of the state vector.

    ``index`` holds the flat (C-order) element indices that are state rows, ascending, or is
    ``None`` when every element is (no mask). ``dtype`` is the value type in the file (float32
    or float64, native byte order here; the file's byte order is the I/O layer's business).
    """

    name: str
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: np.dtype
    row0: int
    n_rows: int
    index: np.ndarray | None = None

    @property
    def n_elems(self) -> int:
        """Elements in the whole variable (masked or not)."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def rows(self) -> slice:
        """The state rows of this variable."""
        return slice(self.row0, self.row0 + self.n_rows)

    def elements(self, r0: int, r1: int) -> np.ndarray:
        """Flat element indices of the variable's local rows ``[r0, r1)`` (0 = its first row)."""
        if self.index is None:
            return np.arange(r0, r1, dtype=np.int64)
        return self.index[r0:r1]


@dataclass(frozen=True, eq=False)
class Piece:
    """State rows ``[row_start, row_stop)`` of one variable, inside its element range
    ``[elem_start, elem_stop)``. ``select`` gives, for each row, its element's offset from
    ``elem_start`` (``None``: the rows are exactly the elements, one to one)."""

    var: StateVariable
    row_start: int
    row_stop: int
    elem_start: int
    elem_stop: int
    select: np.ndarray | None

    @property
    def n_rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True, eq=False)
class StateLayout:
    """Which variables of a restart file form the state vector, in which order, with which mask.

    Attributes
    ----------
    template : str
        The restart file the layout was built from.
    variables : tuple of StateVariable
        In state-vector order; ``variables[k].rows`` are its rows.
    n_rows : int
        N_x, the length of the state vector.
    coords : (n_rows, n_dim) float64
        Localization coordinates of every state row: (lon, lat) in degrees when
        ``coord_kind == "lonlat"``, else the ``state.coordinates`` variables' values in their units,
        or without them grid indices (x, y) or (i,).
    coord_names : tuple of str
        What each column of ``coords`` is (variable names, or ``index:<dim>``).
    coord_kind : "lonlat" or "index"
    coord_axes : tuple of CoordAxis or None
        Which axis each column of ``coords`` is, by the coordinate variable's CF attributes or name
        (None: the file does not say); observations located by their coordinates need them in x, y, z order.
    """

    template: str
    variables: tuple[StateVariable, ...]
    n_rows: int
    coords: np.ndarray
    coord_names: tuple[str, ...]
    coord_kind: CoordKind
    coord_axes: tuple[CoordAxis | None, ...]

    @classmethod
    def from_config(cls, template: str | Path, config: StateConfig) -> "StateLayout":
        """Build from a template restart file and a ``[state]`` configuration section."""
        return cls.from_file(template, config.variables, mask=config.mask, coordinates=config.coordinates)

    @classmethod
    def from_file(
        cls,
        template: str | Path,
        variables: Sequence[str],
        *,
        mask: MaskConfig | np.ndarray | None = None,
        mask_dims: Sequence[str] | None = None,
        coordinates: Sequence[str] | None = None,
    ) -> "StateLayout":
        """Build from a template restart file.

        ``mask`` is a :class:`MaskConfig` (a mask variable in the file) or a boolean array
        over ``mask_dims`` (which then must be given); it applies to every state variable
        whose trailing dimensions are the mask's (or to ``MaskConfig.apply_to``).
        Raises :class:`FileFormatError` naming the file and variable when a variable is
        missing, not float32/float64, or a mask or coordinate does not fit.
        """
        path = str(template)
        if not variables:
            raise InputError("the state needs at least one variable", item="state.variables")
        try:
            ds = netCDF4.Dataset(path, "r")
        except FileNotFoundError:
            raise FileFormatError("template restart file not found", path=path) from None
        except OSError as exc:
            raise FileFormatError(f"cannot open the template as NetCDF: {exc}", path=path) from None
        try:
            ds.set_auto_maskandscale(False)
            mvals, mdims, apply_to = _mask_spec(ds, path, mask, mask_dims)
            svars: list[StateVariable] = []
            row = 0
            for name in variables:
                if name not in ds.variables:
                    raise FileFormatError(
                        f"state variable not in the file (it has: {', '.join(ds.variables)})", path=path, variable=name
                    )
                v = ds.variables[name]
                dt = np.dtype(v.dtype)
                if dt.newbyteorder("=") not in _STATE_DTYPES:
                    raise FileFormatError(f"state variables must be float32 or float64, this one is {dt}", path=path, variable=name)
                dims = tuple(v.dimensions)
                shape = tuple(int(n) for n in v.shape)
                index = None
                wants = apply_to is None or name in apply_to
                if mvals is not None and wants:
                    if dims[len(dims) - len(mdims):] == tuple(mdims) and len(dims) >= len(mdims):
                        index = mask_index(mvals, shape)
                    elif apply_to is not None:
                        raise FileFormatError(
                            f"mask dims {tuple(mdims)} are not the trailing dims of {dims}", path=path, variable=name
                        )
                n = int(np.prod(shape, dtype=np.int64)) if index is None else int(index.size)
                svars.append(StateVariable(name, dims, shape, dt.newbyteorder("="), row, n, index))
                row += n
            if apply_to is not None:
                for name in apply_to:
                    if name not in variables:
                        raise FileFormatError("mask.apply_to names a variable that is not a state variable", path=path, variable=name)
            coords = state_coords(ds, path, svars, row, coordinates)
        finally:
            ds.close()
        return cls(path, tuple(svars), row, coords.values, coords.names, coords.kind, coords.axes)

    # -- row bookkeeping ---------------------------------------------------------------------
    @property
    def names(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.variables)

    def variable(self, name: str) -> StateVariable:
        for v in self.variables:
            if v.name == name:
                return v
        raise InputError(f"'{name}' is not a state variable (state: {', '.join(self.names)})", item=name)

    def pieces(self, start: int, stop: int, max_rows: int | None = None) -> Iterator[Piece]:
        """The pieces covering state rows ``[start, stop)``, in row order; each holds at most
        ``max_rows`` rows when given (to bound the I/O buffers)."""
        if not 0 <= start <= stop <= self.n_rows:
            raise InputError(f"row range [{start}, {stop}) outside [0, {self.n_rows})", item="rows")
        for v in self.variables:
            lo = max(start, v.row0)
            hi = min(stop, v.row0 + v.n_rows)
            step = max_rows or max(hi - lo, 1)
            for a in range(lo, hi, step):
                b = min(hi, a + step)
                r0, r1 = a - v.row0, b - v.row0
                if v.index is None:
                    yield Piece(v, a, b, r0, r1, None)
                else:
                    idx = v.index[r0:r1]
                    e0, e1 = int(idx[0]), int(idx[-1]) + 1
                    sel = None if e1 - e0 == b - a else idx - e0
                    yield Piece(v, a, b, e0, e1, sel)

    def to_fields(self, x: np.ndarray, fill: float = np.nan) -> dict[str, np.ndarray]:
        """Scatter a full state vector ``x`` (n_rows,) back onto each variable's grid
        (shape of the variable, float64; ``fill`` where the mask excludes a point)."""
        x = np.asarray(x, dtype=np.float64).reshape(-1)
        if x.size != self.n_rows:
            raise InputError(f"state vector has {x.size} rows, the layout {self.n_rows}", item="x")
        out: dict[str, np.ndarray] = {}
        for v in self.variables:
            part = x[v.rows]
            if v.index is None:
                out[v.name] = part.reshape(v.shape).copy()
            else:
                f = np.full(v.n_elems, fill, dtype=np.float64)
                f[v.index] = part
                out[v.name] = f.reshape(v.shape)
        return out

    def describe(self) -> str:
        """One line per variable: name, dims, rows; for logs and error messages."""
        lines = [f"state of {self.n_rows} rows from {self.template}:"]
        for v in self.variables:
            m = "" if v.index is None else f", masked {v.n_rows}/{v.n_elems}"
            lines.append(f"  {v.name}{v.dims} {v.dtype} rows [{v.row0}, {v.row0 + v.n_rows}){m}")
        return "\n".join(lines)


def _mask_spec(
    ds: netCDF4.Dataset, path: str, mask: MaskConfig | np.ndarray | None, mask_dims: Sequence[str] | None
) -> tuple[np.ndarray | None, tuple[str, ...], set[str] | None]:
    """``(boolean mask values, mask dims, apply_to)`` from a MaskConfig or an array."""
    if mask is None:
        return None, (), None
    if isinstance(mask, MaskConfig):
        vs = ds.variables
        if mask.variable not in vs:
            raise FileFormatError("mask variable not in the file", path=path, variable=mask.variable)
        mv = vs[mask.variable]
        raw = np.asarray(mv[...])
        sel = raw != 0 if mask.values is None else np.isin(raw, np.asarray(mask.values))
        return np.asarray(sel, dtype=bool), tuple(mv.dimensions), (set(mask.apply_to) if mask.apply_to else None)
    if mask_dims is None:
        raise InputError("a mask array needs mask_dims (the dimension names it spans)", item="mask_dims")
    arr = np.asarray(mask, dtype=bool)
    if arr.ndim != len(mask_dims):
        raise InputError(f"mask has {arr.ndim} dims but mask_dims names {len(mask_dims)}", item="mask")
    return arr, tuple(mask_dims), None
