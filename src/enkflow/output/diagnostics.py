"""Inline reductions of the writer: ensemble mean/spread per time, time statistics per window.

Ensemble statistics use Welford's update per grid point (members and regions arrive in any
order, each point counts its own members), which has no cancellation: the mean and the
spread (standard deviation, ddof = 1) equal ``np.mean`` / ``np.std(ddof=1)`` of the full
ensemble to a few ulps, in float64. Window statistics keep a float64 sum, the minimum and
the maximum of the per-time field, and are checkpointed to HDF5 (atomically, never pickle) so
that a restarted writer continues a window where the last one stopped.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.fsutil import atomic_output


class EnsembleAccumulator:
    """Mean and spread over members of one field at one time; ``shape`` the field's global shape."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.count = np.zeros(shape, dtype=np.int32)
        self.mean = np.zeros(shape, dtype=np.float64)
        self.m2 = np.zeros(shape, dtype=np.float64)

    def add(self, x: np.ndarray, region: tuple[slice, ...]) -> None:
        """Add one member's values ``x`` on ``region`` of the field."""
        x = np.asarray(x, dtype=np.float64)
        n = self.count[region] + 1
        mean = self.mean[region]
        d = x - mean
        mean += d / n
        self.m2[region] += d * (x - mean)
        self.count[region] = n

    def result(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(mean, spread); spread is None for one member."""
        n = int(self.count.min()) if self.count.size else 0
        if n < 2:
            return self.mean, None
        return self.mean, np.sqrt(self.m2 / (self.count - 1))


@dataclass
class Window:
    """Time statistics of one field over window ``index`` (times in [index L, (index + 1) L))."""

    index: int
    total: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray
    times: list[float] = field(default_factory=list)

    @classmethod
    def first(cls, index: int, x: np.ndarray, t: float) -> "Window":
        x = np.asarray(x, dtype=np.float64)
        return cls(index, x.copy(), x.copy(), x.copy(), [t])

    def add(self, x: np.ndarray, t: float) -> None:
        self.total += x
        np.minimum(self.minimum, x, out=self.minimum)
        np.maximum(self.maximum, x, out=self.maximum)
        self.times.append(t)

    @property
    def mean(self) -> np.ndarray:
        return self.total / len(self.times)


class WindowSet:
    """Open windows of one field, keyed by window name; ``lengths``: name -> length in time units."""

    def __init__(self, lengths: dict[str, float]) -> None:
        self.lengths = lengths
        self.open: dict[str, dict[int, Window]] = {w: {} for w in lengths}

    def add(self, x: np.ndarray, t: float) -> list[str]:
        """Add the field at time ``t`` to its window of every length. Returns the names of the windows
        where ``t`` was counted already (a restarted run adding it again: not counted twice)."""
        repeated = []
        for name, length in self.lengths.items():
            k = math.floor(t / length)
            w = self.open[name].get(k)
            if w is None:
                self.open[name][k] = Window.first(k, x, t)
            elif t in w.times:
                repeated.append(name)
            else:
                w.add(x, t)
        return repeated

    def pop_done(self, latest: float, busy: list[float]) -> list[tuple[str, float, Window]]:
        """Windows that ended at or before ``latest`` (a completed time) and hold no still-open
        time of ``busy``: (name, length, window), removed from the set."""
        done = []
        for name, length in self.lengths.items():
            for k in sorted(self.open[name]):
                end = (k + 1) * length
                if end <= latest and not any(k * length <= b < end for b in busy):
                    done.append((name, length, self.open[name].pop(k)))
        return done

    def pop_all(self) -> list[tuple[str, float, Window]]:
        out = [(n, self.lengths[n], w) for n in self.lengths for w in self.open[n].values()]
        for n in self.lengths:
            self.open[n] = {}
        return out

    def empty(self) -> bool:
        return not any(self.open.values())

    # -- checkpoint ------------------------------------------------------------------------

    def save(self, path: Path, field_name: str, shape: tuple[int, ...]) -> None:
        """Write the open windows to ``path`` (HDF5, atomically)."""
        import h5py  # lazy: +25 ms (7%) at every writer's start; only a window's checkpoint is HDF5

        with atomic_output(path) as tmp:
            with h5py.File(tmp, "w") as h:
                h.attrs["field"] = field_name
                h.attrs["shape"] = np.asarray(shape, dtype=np.int64)
                for name, wins in self.open.items():
                    g = h.create_group(name)
                    g.attrs["length"] = self.lengths[name]
                    for k, w in wins.items():
                        s = g.create_group(str(k))
                        s.create_dataset("total", data=w.total)
                        s.create_dataset("minimum", data=w.minimum)
                        s.create_dataset("maximum", data=w.maximum)
                        s.create_dataset("times", data=np.asarray(w.times, dtype=np.float64))

    def load(self, path: Path, field_name: str, shape: tuple[int, ...]) -> None:
        """Continue from a checkpoint written by :meth:`save`; windows of another length are an error."""
        import h5py  # lazy: +25 ms (7%) at every writer's start; only a window's checkpoint is HDF5

        try:
            with h5py.File(path, "r") as h:
                if tuple(int(v) for v in h.attrs["shape"]) != tuple(shape):
                    raise FileFormatError(f"the checkpoint holds field {field_name} with shape "
                                          f"{tuple(h.attrs['shape'])}, the configuration says {shape}", path=str(path))
                for name in h:
                    if name not in self.lengths:
                        continue  # a window no longer configured: dropped
                    g = h[name]
                    if float(g.attrs["length"]) != self.lengths[name]:
                        raise FileFormatError(f"window {name} has length {float(g.attrs['length'])} in the checkpoint, "
                                              f"{self.lengths[name]} in the configuration (remove the checkpoint "
                                              "to start the window statistics afresh)", path=str(path))
                    for k in g:
                        s = g[k]
                        self.open[name][int(k)] = Window(int(k), s["total"][...], s["minimum"][...],
                                                         s["maximum"][...], [float(t) for t in s["times"][...]])
        except (OSError, KeyError) as exc:
            raise FileFormatError(f"cannot read the output checkpoint: {exc}", path=str(path)) from None


def remove_checkpoint(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
