"""The growing files of the writer (``output.file`` without ``{time}``): one per field, and one per
field and window, each along an unlimited ``time`` (:class:`~enkflow.output.record_file.RecordFile`).
A time's values go straight into its record as its pieces arrive (a time the file shows already: into
a scratch slot, :mod:`~enkflow.output.record_rewrite`); the record counts once the time is complete, so ``xarray.open_dataset`` of the file gives every complete time, also after a ``kill -9``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from enkflow.output.config import OutputConfig
from enkflow.output.netcdf import (WINDOW_STATISTICS, define_series, define_window_series, pack,
                                   reduction_value)
from enkflow.output.record_file import RecordFile


def reduction_sizes(cfg: OutputConfig, name: str,
                    reductions: dict[str, Callable[[np.ndarray], Any]]) -> dict[str, int | None]:
    """The length of each user reduction's value (None: a number), from its value on a field of zeros:
    a growing file defines its variables once, so a reduction must give the same shape at every time."""
    sizes: dict[str, int | None] = {}
    for red, fn in reductions.items():
        with np.errstate(all="ignore"):
            try:
                value = reduction_value(name, red, fn(np.zeros(cfg.shape(name))))
            except Exception as exc:
                raise ValueError(f"user reduction {red} ({cfg.reductions[red]}) fails on a field of zeros, "
                                 f"which sets the shape of {name}_{red} in the field's file: {exc!r}") from None
        sizes[red] = value.size if value.ndim == 1 else None
    return sizes


def open_field_series(path: Path, cfg: OutputConfig, name: str, coords: dict[str, np.ndarray],
                      reductions: dict[str, Callable[[np.ndarray], Any]]) -> RecordFile:
    sizes = reduction_sizes(cfg, name, reductions)
    return RecordFile(path, lambda tmp: define_series(tmp, cfg, name, coords, sizes))


def open_window_series(path: Path, cfg: OutputConfig, name: str, window: str, length: float,
                       coords: dict[str, np.ndarray]) -> RecordFile:
    return RecordFile(path, lambda tmp: define_window_series(tmp, cfg, name, window, length, coords))


class SeriesTime:
    """Time ``t`` of field ``name`` in its growing file ``rf``, while its pieces arrive."""

    def __init__(self, rf: RecordFile, cfg: OutputConfig, name: str, t: float) -> None:
        self.rf, self.cfg, self.name, self.t = rf, cfg, name, t
        self.spec = cfg.fields[name]
        self.record = rf.record(t)

    def write(self, x: np.ndarray, member: int | None, region: tuple[slice, ...]) -> int:
        """Store one piece; returns the count of values outside pack_range (int16 only; then nothing is stored)."""
        if not self.cfg.write_members:
            return 0
        if self.spec.dtype == "int16":
            x, outside = pack(x, self.spec)
            if outside:
                return outside
        key = (member - 1,) + region if member is not None else region
        self.rf.write(self.record, self.name, key, x)
        return 0

    def diagnostics(self, mean: np.ndarray | None, spread: np.ndarray | None,
                    reductions: dict[str, np.ndarray]) -> None:
        values = {f"{self.name}_mean": mean, f"{self.name}_spread": spread}
        for red, raw in reductions.items():
            value = reduction_value(self.name, red, raw)
            want = self.rf.vars[f"{self.name}_{red}"].shape[1:]
            if value.shape != want:
                raise ValueError(f"user reduction {red} of {self.name} gave shape {value.shape} at time {self.t:g}, "
                                 f"its file holds {want} (its shape on a field of zeros, when the file was made)")
            values[f"{self.name}_{red}"] = value
        for var, value in values.items():
            if value is not None and var in self.rf.vars:
                self.rf.write(self.record, var, (), value)

    def complete(self) -> None:
        self.rf.commit(self.t)

    def abandon(self) -> None:
        self.rf.release(self.t)

    def flush(self) -> None:
        self.rf.sync()


def write_window_record(rf: RecordFile, start: float, length: float, n_times: int,
                        stats: tuple[np.ndarray, np.ndarray, np.ndarray], name: str, complete: bool) -> None:
    """One window's statistics as the record of its middle time (a window written incomplete at the
    end of a run and completed by the next replaces its record at the next sync or close)."""
    t = start + length / 2.0
    r = rf.record(t)
    rf.write(r, "time_bnds", (), np.array([start, start + length]))
    for suffix, data in zip(WINDOW_STATISTICS, stats):
        rf.write(r, f"{name}_{suffix}", (), data)
    rf.write(r, "number_of_times", (), np.int32(n_times))
    rf.write(r, "window_complete", (), np.int32(1 if complete else 0))
    rf.commit(t)
