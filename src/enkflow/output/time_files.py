"""The files one writer process writes (:class:`TimeFiles`): each (field, time) written piece by piece,
reduced inline (ensemble mean/spread, windows, user reductions) and made visible once every member and
region is in: as the next record of the field's growing file (:mod:`enkflow.output.series`, ``output.file``
without ``{time}``) or as a file of its own, open under a temporary name and renamed; the window
statistics and their checkpoints. The process around it is :mod:`enkflow.output.writer`.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from enkflow.errors import FileFormatError
from enkflow.fsutil import atomic_output
from enkflow.output.config import OutputConfig
from enkflow.output.diagnostics import EnsembleAccumulator, WindowSet, remove_checkpoint
from enkflow.output.netcdf import TimeFile, write_window
from enkflow.output.record_file import RecordFile
from enkflow.output.series import SeriesTime, open_field_series, open_window_series, write_window_record

class PieceError(Exception):
    """A piece the writer refuses (the sender's data is at fault); ``fatal`` errors are the writer's own (I/O)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


def load_reduction(target: str) -> Callable[[np.ndarray], Any]:
    module, _, name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"output.reductions: cannot load {target!r}: {exc}") from None
    if not callable(fn):
        raise ValueError(f"output.reductions: {target!r} is not callable")
    return fn


def checkpoint_path(directory: Path, name: str) -> Path:
    return directory / ".checkpoint" / f"{name}.h5"


def _space_note(path: Path) -> str:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return ""
    free = st.f_bavail * st.f_frsize
    if free == 0:
        return " (no space left on its file system)"
    return f" (only {free} bytes free on its file system: full?)" if free < 1 << 20 else ""


class TimeSink(Protocol):
    """Where the values of one (field, time) go while its pieces arrive."""

    def write(self, x: np.ndarray, member: int | None, region: tuple[slice, ...]) -> int: ...

    def diagnostics(self, mean: np.ndarray | None, spread: np.ndarray | None,
                    reductions: dict[str, np.ndarray]) -> None: ...

    def complete(self) -> None: ...

    def abandon(self) -> None: ...

    def flush(self) -> None: ...


class SingleFile:
    """The file of one (field, time) of its own (``output.file`` with ``{time}``), under a temporary
    name until :meth:`complete` renames it."""

    def __init__(self, path: Path, cfg: OutputConfig, name: str, t: float, coords: dict[str, np.ndarray]) -> None:
        self.cm: AbstractContextManager[Path] = atomic_output(path)
        self.tmp = self.cm.__enter__()
        try:
            self.file = TimeFile(self.tmp, cfg, name, t, coords)
        except BaseException as exc:
            self.cm.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def write(self, x: np.ndarray, member: int | None, region: tuple[slice, ...]) -> int:
        return self.file.write(x, member, region)

    def diagnostics(self, mean: np.ndarray | None, spread: np.ndarray | None,
                    reductions: dict[str, np.ndarray]) -> None:
        self.file.diagnostics(mean, spread, reductions)

    def complete(self) -> None:
        self.file.close()
        self.cm.__exit__(None, None, None)

    def abandon(self) -> None:
        try:
            self.file.close()
        except Exception:
            pass
        exc = RuntimeError("abandoned")
        self.cm.__exit__(RuntimeError, exc, None)  # removes the temporary file

    def flush(self) -> None:
        self.file.ds.sync()
        fd = os.open(self.tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass
class OpenTime:
    """A (field, time) being written."""

    path: Path
    sink: TimeSink
    covered: np.ndarray  # uint8 (members or 1, *shape): which values arrived
    remaining: int
    acc: EnsembleAccumulator | None
    t: float


@dataclass
class Stats:
    puts: int = 0
    bytes: int = 0
    files: int = 0
    window_files: int = 0
    write_s: float = 0.0
    nan: dict[str, int] = field(default_factory=dict)
    errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"puts": self.puts, "bytes": self.bytes, "files": self.files, "window_files": self.window_files,
                "write_s": self.write_s, "cpu_s": time.process_time(), "nan": dict(self.nan), "errors": self.errors}


class TimeFiles:
    """The files of ``fields`` (writer ``index``) in ``directory``: ``coords`` the coordinate values
    per dimension; ``stats`` counts what is written; ``beat(doing)`` tells the senders what it does
    (its progress page), before each step that can take long."""

    def __init__(self, cfg: OutputConfig, index: int, directory: Path, fields: list[str],
                 coords: dict[str, np.ndarray], stats: Stats, beat: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.index = index
        self.directory = directory
        self.fields = fields
        self.coords = coords
        self.stats = stats
        self.beat = beat
        self.reductions = {k: load_reduction(v) for k, v in self.cfg.reductions.items()}
        lengths = {w.name: w.length for w in self.cfg.windows}
        self.windows = {f: WindowSet(lengths) for f in self.fields}
        if lengths:
            for f in self.fields:
                cp = checkpoint_path(self.directory, f)
                if cp.exists():
                    self.windows[f].load(cp, f, self.cfg.shape(f))
        self.open: dict[tuple[str, float], OpenTime] = {}
        self.done: dict[tuple[str, float], str] = {}  # written or failed, with the reason
        self.latest: dict[str, float] = {}
        self.paths: dict[Path, float] = {}  # file -> its time: two times must not share a file
        self.series: dict[Path, RecordFile] = {}  # the growing files opened so far

    def _file_path(self, name: str, t: float) -> Path:
        return self.directory / self.cfg.file.format(field=name, time=t)

    def _series(self, path: Path, opener: Callable[[], RecordFile]) -> RecordFile:
        rf = self.series.get(path)
        if rf is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                rf = self.series[path] = opener()
            except (FileFormatError, ValueError) as exc:
                raise PieceError(str(exc)) from None
            except OSError as exc:
                raise PieceError(f"cannot create {path}: {exc}{_space_note(path)}", fatal=True) from None
        return rf

    def _start(self, name: str, t: float) -> OpenTime:
        path = self._file_path(name, t)
        sink: TimeSink
        if self.cfg.series:
            rf = self._series(path, lambda: open_field_series(path, self.cfg, name, self.coords, self.reductions))
            sink = SeriesTime(rf, self.cfg, name, t)
        else:
            other = self.paths.setdefault(path, t)
            if other != t:
                raise PieceError(f"field {name}: times {other!r} and {t!r} give the same file name {path.name} "
                                 f"(output.file = {self.cfg.file!r}); write the time with more digits, e.g. "
                                 "{time:.6f}, or leave {time} out: one file per field along time")
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                sink = SingleFile(path, self.cfg, name, t, self.coords)
            except Exception as exc:
                raise PieceError(f"cannot create {path}: {exc}{_space_note(path)}", fatal=True) from None
        spec = self.cfg.fields[name]
        shape = self.cfg.shape(name)
        nmem = self.cfg.members if spec.ensemble else 1
        return OpenTime(path, sink, np.zeros((nmem,) + shape, dtype=np.uint8), nmem * math.prod(shape),
                        EnsembleAccumulator(shape) if self.cfg.reduced(name) else None, t)

    def _abandon(self, key: tuple[str, float], reason: str) -> None:
        ot = self.open.pop(key, None)
        self.done[key] = reason
        if ot is not None:
            ot.sink.abandon()

    def put(self, msg: dict[str, Any], data: np.ndarray) -> str | None:
        """Write one piece; returns a warning or None; raises PieceError."""
        name, t, member = msg["field"], float(msg["time"]), msg["member"]
        if name not in self.fields:
            raise PieceError(f"writer {self.index} does not own field {name!r}")
        key = (name, t)
        what = f"field {name} time {t:g}" + (f" member {member}" if member is not None else "")
        if key in self.done:
            if self.done[key] != "written":
                return None  # the piece of a time that failed earlier: that failure was reported once
            raise PieceError(f"{what}: this time is written already; a piece added twice?")
        shape = self.cfg.shape(name)
        region = tuple(slice(a, b) for a, b in msg["region"]) if msg["region"] is not None else tuple(slice(0, n) for n in shape)
        warning = self._nan(key, what, data)
        ot = self.open.get(key)
        if ot is None:
            try:
                ot = self.open[key] = self._start(name, t)
            except PieceError:
                self.done[key] = "its file could not be created"
                raise
        mi = member - 1 if member is not None else 0
        cov = ot.covered[(mi,) + region]
        if cov.any():
            self._abandon(key, "a region added twice")
            raise PieceError(f"{what}: region {[[s.start, s.stop] for s in region]} overlaps values added before; "
                             "the file of this time is not written")
        try:
            outside = ot.sink.write(data, member, region)
        except Exception as exc:
            self._abandon(key, f"write failed: {exc}")
            raise PieceError(f"cannot write {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        if outside:
            self._abandon(key, "values outside pack_range")
            lo, hi = self.cfg.fields[name].pack_bounds()
            raise PieceError(f"{what}: {outside} value(s) outside pack_range [{lo}, {hi}] (16-bit packing); "
                             "the file of this time is not written")
        if ot.acc is not None:
            ot.acc.add(data, region)
        cov[...] = 1
        ot.remaining -= data.size
        if ot.remaining == 0:
            self._complete(key, ot)
        return warning

    def _nan(self, key: tuple[str, float], what: str, data: np.ndarray) -> str | None:
        """Count the NaN values of a piece (``what``); the warning to send (``output.nan = 'warn'``), or
        None; raises PieceError under ``output.nan = 'error'`` (the time's file is abandoned)."""
        # One pass without a temporary: a sum is finite unless a NaN (or an Inf) is there; only then count.
        nan = 0 if np.isfinite(np.add.reduce(data, axis=None)) else int(np.count_nonzero(np.isnan(data)))
        if not nan:
            return None
        name = key[0]
        self.stats.nan[name] = self.stats.nan.get(name, 0) + nan
        text = f"{what}: {nan} NaN value(s)"
        if self.cfg.nan == "error":
            self._abandon(key, "NaN in a piece")
            raise PieceError(f"{text} (output.nan = 'error'): the file of this time is not written")
        if self.cfg.nan == "warn":
            return f"{text}, written as NaN (output.nan = 'warn')"
        return None

    def _complete(self, key: tuple[str, float], ot: OpenTime) -> None:
        name, t = key
        spec = self.cfg.fields[name]
        self.beat(f"completing field {name} time {t:g} (diagnostics, user reductions, fsync of {ot.path.name})")
        mean = spread = None
        if ot.acc is not None:
            mean, spread = ot.acc.result()
        try:
            reds = {r: fn(mean) for r, fn in self.reductions.items()}
        except Exception as exc:
            self._abandon(key, "a user reduction failed")
            raise PieceError(f"field {name} time {t:g}: user reduction failed: {exc!r}") from None
        try:
            show = spec.ensemble and self.cfg.diagnostics
            ot.sink.diagnostics(mean if show else None, spread if show else None, reds)
        except ValueError as exc:
            self._abandon(key, "a user reduction's value does not fit")
            raise PieceError(f"field {name} time {t:g}: {exc}") from None
        except Exception as exc:
            self._abandon(key, f"write failed: {exc}")
            raise PieceError(f"cannot write {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        if mean is not None and self.cfg.windows:
            # Counted and checkpointed before the file is renamed: after a crash in between, a restarted
            # run that adds this time again finds it counted (not twice) and writes its file.
            self.windows[name].add(mean, t)
            self._checkpoint_field(name)
        try:
            ot.sink.complete()
        except OSError as exc:
            self.open.pop(key, None)
            self.done[key] = "its file could not be finished"
            raise PieceError(f"cannot finish {ot.path}: {exc}{_space_note(ot.path)}", fatal=True) from None
        self.open.pop(key)
        self.done[key] = "written"
        self.stats.files += 1
        if mean is not None and self.cfg.windows:
            self.latest[name] = max(self.latest.get(name, t), t)
            busy = [bt for (f, bt) in self.open if f == name]
            done = self.windows[name].pop_done(self.latest[name], busy)
            for wname, length, w in done:
                self._write_window(name, wname, length, w, complete=True)
            if done:
                self._checkpoint_field(name)

    def _write_window(self, name: str, wname: str, length: float, w: Any, complete: bool) -> None:
        start = w.index * length
        path = self._file_path(f"{name}_{wname}", start)
        self.beat(f"writing the {wname} window of field {name} from time {start:g}")
        stats = (w.mean, w.minimum, w.maximum)
        if self.cfg.series:
            rf = self._series(path, lambda: open_window_series(path, self.cfg, name, wname, length, self.coords))
        try:
            if self.cfg.series:
                write_window_record(rf, start, length, len(w.times), stats, name, complete)
            else:
                with atomic_output(path) as tmp:
                    write_window(tmp, self.cfg, name, wname, start, length, w.times, stats, self.coords, complete)
        except Exception as exc:
            raise PieceError(f"cannot write {path}: {exc}{_space_note(path)}", fatal=True) from None
        self.stats.window_files += 1

    def checkpoint(self) -> None:
        if self.cfg.windows:
            for f in self.windows:
                self._checkpoint_field(f)

    def _checkpoint_field(self, f: str) -> None:
        self.beat(f"checkpointing the windows of field {f}")
        ws = self.windows[f]
        cp = checkpoint_path(self.directory, f)
        if ws.empty():
            remove_checkpoint(cp)
            return
        cp.parent.mkdir(parents=True, exist_ok=True)
        try:
            ws.save(cp, f, self.cfg.shape(f))
        except OSError as exc:
            raise PieceError(f"cannot write the checkpoint {cp}: {exc}{_space_note(cp)}", fatal=True) from None

    def flush(self) -> None:
        """Everything of the open files on disk (under their temporary names)."""
        for ot in self.open.values():
            self.beat(f"flushing {ot.path.name} (sync)")
            ot.sink.flush()
        for path, rf in self.series.items():
            self.beat(f"flushing {path.name} (sync)")
            rf.sync()

    def discard(self, t: float) -> list[str]:
        """Forget time ``t`` of this writer's fields: a rerun adds it again (its file replaces the old
        one). The pieces of a time still open are dropped (its temporary file removed). Window
        statistics already counted are not uncounted: for fields without windows (the analysis's)."""
        dropped = []
        for key in [k for k in self.open if k[1] == t]:
            self._abandon(key, "discarded (a rerun adds it again)")
            dropped.append(key[0])
        for key in [k for k in self.done if k[1] == t]:
            del self.done[key]
        return dropped

    def finish(self, finish_windows: bool) -> list[str]:
        incomplete = []
        for (name, t), ot in list(self.open.items()):
            nmem = ot.covered.shape[0]
            missing = [m + 1 for m in range(nmem) if not ot.covered[m].all()]
            who = f"member(s) {missing}" if self.cfg.fields[name].ensemble else "part of the field"
            incomplete.append(f"{ot.path.name} (field {name}, time {t:g}): {who} missing")
            self._abandon((name, t), "incomplete at finish")
        if finish_windows:
            for name, ws in self.windows.items():
                for wname, length, w in ws.pop_all():
                    self._write_window(name, wname, length, w, complete=False)
        self.checkpoint()
        for rf in self.series.values():
            rf.close()
        self.series.clear()
        return incomplete
