"""One piece of a field as ``add`` takes it: its checks, and its copy as sent.

Shared by :class:`~enkflow.output.Output` and :class:`~enkflow.output.remote.RemoteOutput`, which
check a piece before anything is sent (the native client runs the same checks, native/src/output.c).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from enkflow.errors import InputError
from enkflow.output.config import OutputConfig

Region = Sequence[slice | int] | Mapping[str, slice | int] | None
Bounds = tuple[tuple[int, int], ...]
"""A region as ((start, stop), ...) per dimension of the global field."""


@dataclass(slots=True)
class Piece:
    """A checked piece of field ``name`` at ``time`` (in ``time_units``): ``member`` 1..members for an
    ensemble field (None otherwise); ``array`` float32 or float64 (other real types converted to
    float64), the shape of ``region`` (None: the whole field); ``what`` names it in messages;
    ``wire`` is the dtype it travels as (:meth:`~enkflow.output.config.OutputConfig.narrowed`)."""

    name: str
    time: float
    member: int | None
    array: np.ndarray
    region: Bounds | None
    what: str
    wire: np.dtype

    @property
    def nbytes(self) -> int:
        """Bytes as sent."""
        return self.array.size * self.wire.itemsize

    def region_json(self) -> list[list[int]] | None:
        """The region as the messages carry it: [[start, stop], ...] or None."""
        return [list(r) for r in self.region] if self.region is not None else None


def _bounds(region: Region, dims: list[str], shape: tuple[int, ...], arr_shape: tuple[int, ...],
            what: str) -> Bounds | None:
    """``region`` as ((start, stop), ...) in the global field, checked against the array's shape."""
    if region is None:
        if arr_shape != shape:
            raise InputError(f"{what}: the array has shape {arr_shape}, the field {shape} "
                             f"(dims {dims}); pass region= for a part", item=what)
        return None
    if isinstance(region, Mapping):
        unknown = set(region) - set(dims)
        if unknown:
            raise InputError(f"{what}: region names unknown dimension(s) {sorted(unknown)}; dims are {dims}", item=what)
        items = [region.get(d, slice(None)) for d in dims]
    else:
        items = list(region)
        if len(items) != len(dims):
            raise InputError(f"{what}: region has {len(items)} entries, the field has {len(dims)} dims {dims}", item=what)
    if len(arr_shape) != len(dims):
        raise InputError(f"{what}: the array has {len(arr_shape)} dimensions, the field {len(dims)} {dims}", item=what)
    return tuple(_span(d, n, m, r, what) for d, n, m, r in zip(dims, shape, arr_shape, items))


def _span(dim: str, n: int, m: int, r: slice | int, what: str) -> tuple[int, int]:
    """(start, stop) of region entry ``r`` along ``dim`` (size ``n``) for an array of ``m`` points there."""
    if isinstance(r, slice):
        if r.step not in (None, 1):
            raise InputError(f"{what}: region step {r.step} along {dim}; only contiguous regions", item=what)
        start = 0 if r.start is None else int(r.start)
        stop = start + m if r.stop is None else int(r.stop)
    elif isinstance(r, (int, np.integer)):
        start, stop = int(r), int(r) + m
    else:
        raise InputError(f"{what}: region entry {r!r} along {dim}: a slice or an integer offset", item=what)
    if not 0 <= start < stop <= n:
        raise InputError(f"{what}: region [{start}, {stop}) along {dim} is outside [0, {n})", item=what)
    if stop - start != m:
        raise InputError(f"{what}: the array has {m} points along {dim}, the region [{start}, {stop}) "
                         f"{stop - start}", item=what)
    return start, stop


def check_piece(cfg: OutputConfig, shapes: Mapping[str, tuple[int, ...]], name: str, array: Any, time: float,
                member: int | None, region: Region) -> Piece:
    """The checks of :meth:`Output.add <enkflow.output.Output.add>` (also
    :class:`~enkflow.output.remote.RemoteOutput`'s, before anything is sent). Raises InputError."""
    spec = cfg.fields.get(name)
    if spec is None:
        raise InputError(f"unknown output field {name!r}; [output.fields] declares "
                         f"{', '.join(sorted(cfg.fields)) or 'none'}", item=str(name))
    what = f"output field {name}" + (f" member {member}" if member is not None else "")
    if spec.ensemble:
        if not isinstance(member, (int, np.integer)) or not 1 <= int(member) <= cfg.members:
            raise InputError(f"{what}: an ensemble field needs member = 1..{cfg.members}, got {member!r}",
                             item=name)
        member = int(member)
    elif member is not None:
        raise InputError(f"{what}: not an ensemble field (ensemble = false): member must be None", item=name)
    try:
        t = float(time)
    except (TypeError, ValueError):
        raise InputError(f"{what}: time {time!r} is not a number (in {cfg.time_units})", item=name) from None
    if not math.isfinite(t):
        raise InputError(f"{what}: time {time!r} is not finite", item=name)
    a = np.asarray(array)
    if a.dtype.kind not in "fiub" or a.dtype.kind == "b":
        raise InputError(f"{what}: dtype {a.dtype} is not a real number type", item=name)
    if a.dtype.kind != "f" or a.dtype.itemsize not in (4, 8):
        a = a.astype(np.float64)
    bounds = _bounds(region, spec.dims, shapes[name], a.shape, what)
    wire = np.dtype(np.float32) if cfg.narrowed(name) else a.dtype
    return Piece(name, t, member, a, bounds, what, wire)


def wire_copy(a: np.ndarray, wire: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """``a`` copied as ``wire`` (C order) into ``out``, or into a new array. A value beyond float32's
    range becomes inf, as the writer's own cast to a float32 variable would make it."""
    with np.errstate(over="ignore"):
        if out is None:
            return np.array(a, dtype=wire, order="C", copy=True)
        np.copyto(out, a, casting="same_kind")
        return out
