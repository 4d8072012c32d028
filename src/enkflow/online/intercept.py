"""An unmodified netCDF model as an online runner, through the interception shim (docs/intercept.md).

::

    python -m enkflow.online.intercept --address A --token-file F --expdir E --shim libenkflow_intercept.so \\
        [--steps N] -- MODEL ARGS...

This process is the runner: it greets the server with the experiment's fields
(read from ``E/config.json`` and member 1's restart, exactly as the server
builds them), asks for tasks and sends heartbeats. For each task it GETs the
member's state into a shared memory segment (an anonymous memfd, no file),
then runs ``MODEL ARGS`` once with ``LD_PRELOAD`` set to the shim. The model's
netCDF reads of the state variables of the member's restart file are served
from the segment, its writes of them go into it, and everything else reaches
the real file through libnetcdf. When the model exits 0 and wrote every state
variable whole, the segment goes back to the server (PUT); otherwise the task
is failed with the reason (the server gives the member to another runner).

Placeholders in ``MODEL ARGS``, filled per task: ``{member}`` ``{cycle}``
``{steps}`` ``{task}`` and ``{restart}`` (the member's restart path). In an
``[online] runner`` command they are written ``{{cycle}}`` and so on, since
that command's own placeholders are filled first. ``--steps N`` states how
many steps the model command runs; a task asking for another number is failed
naming both (``[online] steps`` and the model must agree).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import mmap
import os
import signal
import string
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from enkflow.errors import EnkflowError, InputError
from enkflow.experiment.config import ExperimentConfig, experiment_from_json
from enkflow.experiment.directory import ExperimentDir
from enkflow.fsutil import read_json
from enkflow.online.connection import ServerError
from enkflow.online.experiment import experiment_fields
from enkflow.online.fields import Field
from enkflow.online.runner import Runner, run_runner_process
from enkflow.online.shm_exchange import Extent
from enkflow.state import StateLayout

# The segment's layout: native/intercept/intercept_shm.h (change both together, with the version).
MAGIC = b"ENKFSHM1"
VERSION = 3
MAX_DIMS = 16
MAX_FIELDS, MAX_SEGMENTS, MAX_EXTENTS = 64, 64, 1024
PATH_BYTES = 256
FIELDS_AT = 4096
SEGMENTS_AT = FIELDS_AT + 512 * MAX_FIELDS
EXTENTS_AT = SEGMENTS_AT + PATH_BYTES * MAX_SEGMENTS
DATA_AT = EXTENTS_AT + 48 * MAX_EXTENTS
_HEADER = np.dtype({
    "names": ["magic", "version", "nfields", "member", "cycle", "nsteps", "task", "opens", "get_ns", "put_ns",
              "error_set", "nsegments", "nextents", "error"],
    "formats": ["S8", "<u4", "<u4", "<i8", "<i8", "<i8", "<i8", "<u8", "<u8", "<u8", "<u4", "<u4", "<u4", "S4008"],
    "offsets": [0, 8, 12, 16, 24, 32, 40, 48, 56, 64, 72, 76, 80, 88],
    "itemsize": 4096})
_FIELD = np.dtype({
    "names": ["name", "nctype", "ndims", "shape", "extent0", "nextents", "nbytes", "elements_read", "elements_written",
              "complete", "generations", "assimilated", "nonfinite"],
    "formats": ["S256", "<i4", "<i4", ("<i8", (MAX_DIMS,)), "<u4", "<u4", "<u8", "<u8", "<u8", "<u4", "<u4", "<u4", "<u4"],
    "offsets": [0, 256, 260, 264, 392, 396, 400, 408, 416, 424, 428, 432, 436],
    "itemsize": 512})
_EXTENT = np.dtype({
    "names": ["elem_lo", "elem_hi", "read_seg", "write_seg", "read_off", "write_off"],
    "formats": ["<u8", "<u8", "<u4", "<u4", "<u8", "<u8"],
    "offsets": [0, 8, 16, 20, 24, 32],
    "itemsize": 48})
_NC_TYPES = {"int32": 4, "float32": 5, "float64": 6, "int64": 10}  # NC_INT, NC_FLOAT, NC_DOUBLE, NC_INT64
MODEL_FIELDS = ("member", "cycle", "steps", "task", "restart")


class Segment:
    """The memory shared with the shim: a header, the field records, the segment table and the extents
    (where each field's elements are read from and written to), then, through TCP, each field's data (C order).

    ``in_place``: the fields are in the server's segments, which :meth:`place` names per task; the
    memfd then holds no data (``arrays`` is empty).
    """

    def __init__(self, fields: Sequence[Field], *, in_place: bool = False):
        if not 1 <= len(fields) <= MAX_FIELDS:
            raise InputError(f"the interception handles 1 to {MAX_FIELDS} fields, the experiment has {len(fields)}",
                             item="fields")
        offset, layout = DATA_AT, []
        for f in fields:
            if len(f.shape) > MAX_DIMS or len(f.name.encode()) >= 256:
                raise InputError(f"field {f.name!r}: more than {MAX_DIMS} dimensions or a name of 256 bytes or more",
                                 item=f.name)
            layout.append(offset)
            offset = offset if in_place else _align(offset + f.size * f.itemsize)
        self.size = offset
        self.fd = os.memfd_create("enkflow-intercept", 0)
        os.ftruncate(self.fd, self.size)
        self._mm = mmap.mmap(self.fd, self.size)
        self.header = np.ndarray((), _HEADER, buffer=self._mm)
        self.records = np.ndarray((len(fields),), _FIELD, buffer=self._mm, offset=FIELDS_AT)
        self._table = np.ndarray((MAX_SEGMENTS,), f"S{PATH_BYTES}", buffer=self._mm, offset=SEGMENTS_AT)
        self._extents = np.ndarray((MAX_EXTENTS,), _EXTENT, buffer=self._mm, offset=EXTENTS_AT)
        self.arrays: dict[str, np.ndarray] = {}
        self.fields = tuple(fields)
        self.in_place = in_place
        self.placed: list[Extent] = []
        self.header["magic"], self.header["version"], self.header["nfields"] = MAGIC, VERSION, len(fields)
        for rec, f in zip(self.records, fields):
            rec["name"], rec["nctype"], rec["ndims"] = f.name.encode(), _NC_TYPES[f.dtype], len(f.shape)
            rec["shape"][:len(f.shape)] = f.shape
            rec["nbytes"], rec["assimilated"] = f.size * f.itemsize, int(f.assimilated)
        if not in_place:
            self._write_extents([(k, 0, f.size, 0, off, 0, off) for k, (f, off) in enumerate(zip(fields, layout))
                                 if f.size], [""])
            for f, off in zip(fields, layout):
                self.arrays[f.name] = np.ndarray((f.size,), f.dtype, buffer=self._mm, offset=off)

    def place(self, extents: Sequence[Extent]) -> None:
        """In place, before a model run: the runner's extents of the task (where the member's state is
        read from, and where its forecast goes), written into the tables for the shim."""
        ordered = sorted(extents, key=lambda e: (e.field, e.lo))
        paths = [""] + sorted({e.read_path for e in ordered} | {e.write_path for e in ordered})
        if len(paths) > MAX_SEGMENTS or len(ordered) > MAX_EXTENTS:
            raise InputError(f"the interception maps at most {MAX_SEGMENTS - 1} segments in {MAX_EXTENTS} extents; this "
                             f"task's state is in {len(paths) - 1} in {len(ordered)} (fewer server ranks would do)",
                             item="extents")
        seg = {p: i for i, p in enumerate(paths)}
        self._write_extents([(e.field, e.lo, e.hi, seg[e.read_path], e.read_offset, seg[e.write_path], e.write_offset)
                             for e in ordered], paths)
        self.placed = ordered

    def _write_extents(self, rows: list[tuple[int, int, int, int, int, int, int]], paths: list[str]) -> None:
        """``rows`` (field, lo, hi, read segment, read offset, write segment, write offset), by field and lo."""
        for i, p in enumerate(paths):
            raw = p.encode()
            if len(raw) >= PATH_BYTES:
                raise InputError(f"segment path {p!r} is {PATH_BYTES} bytes or longer", item="extents")
            self._table[i] = raw
        ext = self._extents
        for i, (_, lo, hi, rseg, roff, wseg, woff) in enumerate(rows):
            ext[i] = (lo, hi, rseg, wseg, roff, woff)
        fields = np.array([r[0] for r in rows], dtype=np.int64)
        self.records["extent0"] = np.searchsorted(fields, np.arange(len(self.fields)))
        self.records["nextents"] = np.bincount(fields, minlength=len(self.fields))
        self.header["nsegments"], self.header["nextents"] = len(paths), len(rows)

    def keep_unwritten(self) -> None:
        """In place, after a forecast: the fields the model did not write (carried ones: a file would keep
        their values) copied from where the member's state is read to where the forecast goes."""
        for k, rec in enumerate(self.records):
            if rec["generations"]:
                continue
            itemsize = self.fields[k].itemsize
            for e in self.placed:
                if e.field == k and (e.read_path, e.read_offset) != (e.write_path, e.write_offset):
                    with _mapped(e.write_path, e.write_offset, (e.hi - e.lo) * itemsize, writable=True) as dst, \
                            _mapped(e.read_path, e.read_offset, (e.hi - e.lo) * itemsize) as src:
                        dst[:] = src

    def reset(self, member: int, cycle: int, nsteps: int, task: int) -> None:
        """Before each model run: the task, and the shim's records cleared."""
        h = self.header
        h["member"], h["cycle"], h["nsteps"], h["task"] = member, cycle, nsteps, task
        h["opens"] = h["get_ns"] = h["put_ns"] = h["error_set"] = 0
        h["error"] = b""
        for key in ("elements_read", "elements_written", "complete", "generations", "nonfinite"):
            self.records[key] = 0

    def finite_fields(self) -> frozenset[int]:
        """In place, after a forecast: the fields the model wrote whole into the slot, the shim having
        found every value finite as it copied it (the server need not read them again)."""
        return frozenset(k for k, rec in enumerate(self.records) if rec["complete"] and not rec["nonfinite"])

    def verdict(self, path: str) -> str | None:
        """Why the model's run is no forecast (None: it is one). ``path`` the intercepted restart."""
        if self.header["error_set"]:
            return bytes(self.header["error"]).decode(errors="replace")
        if self.header["opens"] == 0:
            return (f"the model never opened {path} (the intercepted restart of this member): it reads another "
                    "file; pass it {restart}, or see --path")
        for f, rec in zip(self.fields, self.records):
            if rec["elements_written"] and not rec["complete"]:
                return (f"the model wrote {int(rec['elements_written'])} of the {f.size} elements of {f.name!r} "
                        f"in {path}: the hyperslabs written must tile the variable")
            if f.assimilated and not rec["generations"]:
                return f"the model did not write the state variable {f.name!r} of {path}"
            if f.assimilated and not rec["elements_read"]:
                return (f"the model wrote the state variable {f.name!r} of {path} without reading it: its forecast "
                        "would not start from the member's state")
        return None

    def close(self) -> None:
        self.arrays.clear()
        del self.header, self.records, self._table, self._extents
        self._mm.close()
        os.close(self.fd)


@contextlib.contextmanager
def _mapped(path: str, offset: int, nbytes: int, *, writable: bool = False) -> Iterator[memoryview]:
    """``nbytes`` at byte ``offset`` of the segment file ``path``, mapped."""
    at = offset - offset % mmap.ALLOCATIONGRANULARITY
    fd = os.open(path, os.O_RDWR if writable else os.O_RDONLY)
    try:
        mm = mmap.mmap(fd, offset + nbytes - at, prot=mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0),
                       offset=at)
    finally:
        os.close(fd)
    view = memoryview(mm)[offset - at:]
    try:
        yield view
    finally:
        view.release()
        mm.close()


def _align(n: int, to: int = 4096) -> int:
    return (n + to - 1) // to * to


def experiment_fields_of(expdir: Path) -> tuple[list[Field], ExperimentConfig]:
    """The fields the server of ``expdir`` expects (as it builds them) and the experiment's configuration."""
    path = ExperimentDir(expdir).config
    data = read_json(path)
    if data is None:
        raise InputError(f"{path} does not exist: --expdir must name the experiment's run directory", item="expdir")
    cfg = experiment_from_json(data, file=str(path))
    template = cfg.restart_path(1)
    return list(experiment_fields(cfg, StateLayout.from_config(template, cfg.state), template)), cfg


def parse_field(spec: str) -> Field:
    """``NAME:DTYPE:SHAPE[:carried]`` (SHAPE ``AxBxC``, empty for a scalar) as a :class:`Field`."""
    parts = spec.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] != "carried"):
        raise InputError(f"--field {spec!r}: expected NAME:DTYPE:SHAPE or NAME:DTYPE:SHAPE:carried", item="field")
    try:
        shape = tuple(int(v) for v in parts[2].split("x")) if parts[2] else ()
    except ValueError:
        raise InputError(f"--field {spec!r}: the shape must be extents joined by x, e.g. 40x60", item="field") from None
    return Field(parts[0], parts[1], shape, assimilated=len(parts) == 3)


def check_template(argv: Sequence[str], allowed: Sequence[str] = MODEL_FIELDS) -> None:
    """Refuse a model command with placeholders other than ``allowed`` before anything runs."""
    for tok in argv:
        try:
            names = {name.split(".")[0].split("[")[0] for _, name, _, _ in string.Formatter().parse(tok) if name}
        except ValueError as exc:
            raise InputError(f"model argument {tok!r}: {exc}", item="model") from None
        unknown = sorted(names - set(allowed))
        if unknown:
            raise InputError(f"{tok!r}: unknown placeholder(s) {unknown}; valid: "
                             f"{', '.join('{' + f + '}' for f in allowed)}", item="model")


class _Tail:
    """Copies the model's stderr to ours, keeping its last lines for the failure message."""

    def __init__(self, stream, lines: int = 15):
        self.lines: collections.deque[str] = collections.deque(maxlen=lines)
        self._thread = threading.Thread(target=self._run, args=(stream,), daemon=True)
        self._thread.start()

    def _run(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace")
            sys.stderr.write(line)
            self.lines.append(line.rstrip("\n"))
        stream.close()

    def text(self) -> str:
        self._thread.join(timeout=5)
        return "\n".join(self.lines)


class InterceptRunner:
    """The runner loop around an unmodified model command (see the module docstring)."""

    def __init__(self, runner: Runner, fields: Sequence[Field], model: Sequence[str], shim: Path, restart_path,
                 *, steps: int | None = None, cwd: Path | None = None, timeout_s: float | None = None):
        check_template(model)
        if not shim.is_file():
            raise InputError(f"the interception shim {shim} does not exist (build native/, see docs/intercept.md)",
                             item="shim")
        self.runner, self.fields, self.model = runner, list(fields), list(model)
        self.shim, self.restart_path, self.steps, self.cwd = shim.resolve(), restart_path, steps, cwd
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.timings: list[dict[str, float]] = []

    def run(self) -> int:
        """Serve tasks until the server says stop; returns the exit status."""
        self.runner.init(self.fields)
        seg = Segment(self.fields, in_place=self.runner.in_place)
        print("enkflow intercept: " + ("in place: the model reads and writes the server's shared memory" if seg.in_place
                                       else "through TCP: the model reads and writes this runner's copy of the state"),
              file=sys.stderr, flush=True)
        try:
            nsteps = self._exchange(seg)
            while nsteps:
                error = self._task(seg, nsteps)
                if error:
                    print(f"enkflow intercept: member {self.runner.member}, cycle {self.runner.cycle}: {error}",
                          file=sys.stderr, flush=True)
                    self.runner.fail(error)
                elif seg.in_place:
                    seg.keep_unwritten()
                t0 = time.perf_counter()
                try:
                    nsteps = self._exchange(seg)
                except ServerError as exc:  # a rejected forecast: the server reschedules it; go on
                    print(f"enkflow intercept: {exc}", file=sys.stderr, flush=True)
                    nsteps = self._exchange(seg)
                if self.timings:
                    self.timings[-1]["exchange_s"] = time.perf_counter() - t0
            return 0
        finally:
            seg.close()

    def _exchange(self, seg: Segment) -> int:
        """The forecast held sent back (through the segment, or in place: the model wrote it into the
        task's slot, vouching for the fields it wrote there without NaN or Inf) and the next member's state
        fetched; returns the steps to run (0: stop)."""
        if not seg.in_place:
            return self.runner.expose(seg.arrays)[1]
        extents, nsteps = self.runner.expose_in_place(seg.finite_fields())
        if nsteps:
            seg.place(extents)
        return nsteps

    def _task(self, seg: Segment, nsteps: int) -> str | None:
        r = self.runner
        if self.steps is not None and nsteps != self.steps:
            return (f"the server asks for {nsteps} steps per forecast ([online] steps), the model command runs "
                    f"{self.steps} (--steps): make them agree")
        path = os.path.realpath(str(self.restart_path(r.member)))
        values = {"member": r.member, "cycle": r.cycle, "steps": nsteps, "task": r.task, "restart": path}
        argv = [tok.format(**values) for tok in self.model]
        seg.reset(r.member, r.cycle, nsteps, r.task)
        env = dict(os.environ)
        env["LD_PRELOAD"] = ":".join(p for p in (str(self.shim), env.get("LD_PRELOAD", "")) if p)
        env.update(ENKFLOW_INTERCEPT_FD=str(seg.fd), ENKFLOW_INTERCEPT_PATH=path, ENKFLOW_INTERCEPT_PARENT=str(os.getpid()),
                   ENKFLOW_MEMBER=str(r.member), ENKFLOW_CYCLE=str(r.cycle), ENKFLOW_STEPS=str(nsteps))
        t0 = time.perf_counter()
        try:
            # In a process group of its own, which goes with it: a process it leaves behind (a model started
            # by a shell script, killed at the timeout) would still map the segment and could write into the
            # next member's state.
            self.proc = subprocess.Popen(argv, env=env, pass_fds=(seg.fd,), stdin=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, cwd=self.cwd, start_new_session=True)
        except OSError as exc:
            return f"cannot start the model {argv[0]!r}: {exc}"
        tail = _Tail(self.proc.stderr)
        try:
            rc = self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            self.proc.wait()
            self.proc = None
            return f"the model ran longer than {self.timeout_s:g} s (--timeout) and was killed"
        self._signal_group(signal.SIGKILL)
        self.proc = None
        h = seg.header
        self.timings.append({"member": r.member, "cycle": r.cycle, "model_s": time.perf_counter() - t0,
                             "get_s": int(h["get_ns"]) / 1e9, "put_s": int(h["put_ns"]) / 1e9})
        text = tail.text()
        if rc != 0:
            why = f"signal {-rc}" if rc < 0 else f"status {rc}"
            shim = bytes(h["error"]).decode(errors="replace") if h["error_set"] else ""
            return (f"the model exited with {why}" + (f" ({shim})" if shim else "")
                    + (f"; its stderr ends with:\n{text}" if text and not shim else ""))
        return seg.verdict(path)

    def _signal_group(self, sig: int) -> None:
        """``sig`` to the model's process group (the model and whatever it started)."""
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop_model(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self._signal_group(signal.SIGTERM)
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    pass
            self._signal_group(signal.SIGKILL)
            self.proc.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if "--" not in args:
        print("usage: python -m enkflow.online.intercept OPTIONS -- MODEL ARGS... (see --help)", file=sys.stderr)
        if "-h" not in args and "--help" not in args:
            return 2
    split = args.index("--") if "--" in args else len(args)
    opts, model = args[:split], args[split + 1:]
    p = argparse.ArgumentParser(prog="python -m enkflow.online.intercept", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--address", required=True, help="the server's control address, tcp://HOST:PORT")
    p.add_argument("--token-file", required=True, help="file holding the shared token")
    p.add_argument("--expdir", type=Path, default=None, help="the experiment's run directory ({expdir}): its fields "
                                                              "and restart paths")
    p.add_argument("--field", action="append", default=[], metavar="NAME:DTYPE:SHAPE[:carried]",
                   help="instead of --expdir (with --path): a field of the server, in its order, e.g. x:float64:40x60")
    p.add_argument("--shim", default=os.environ.get("ENKFLOW_INTERCEPT_LIB"),
                   help="path of libenkflow_intercept.so (default $ENKFLOW_INTERCEPT_LIB)")
    p.add_argument("--steps", type=int, default=None, help="the steps the model command runs per forecast: a task "
                                                           "asking for another number fails, naming both")
    p.add_argument("--path", default=None, help="the restart path the model opens, {member} filled in (default: the "
                                                "experiment's restart of the member)")
    p.add_argument("--cwd", type=Path, default=None, help="directory to run the model in")
    p.add_argument("--timeout", type=float, default=None, metavar="S", help="kill a model run after S seconds and fail "
                                                                          "its task (default: no limit)")
    p.add_argument("--curve-key", default="", help="the server's CURVE public key (Z85), when it encrypts")
    p.add_argument("--name", default=None, help="the runner's name in the server's events")
    p.add_argument("--timings", type=Path, default=None, help="write each task's timings (JSON lines: model_s, the "
                                                              "shim's get_s/put_s, exchange_s) here at the end")
    o = p.parse_args(opts)
    if not model:
        p.error("no model command after --")
    if not o.shim:
        p.error("--shim (or $ENKFLOW_INTERCEPT_LIB) is needed: the path of libenkflow_intercept.so")
    if o.steps is not None and o.steps < 1:
        p.error(f"--steps must be >= 1, got {o.steps}")
    if o.timeout is not None and not o.timeout > 0:
        p.error(f"--timeout must be > 0 s, got {o.timeout}")
    if (o.expdir is None) == (not o.field):
        p.error("give either --expdir (the experiment's fields and restarts) or --field ... with --path")
    if o.field and not o.path:
        p.error("--field needs --path (the restart path the model opens)")
    try:
        if o.expdir is not None:
            fields, cfg = experiment_fields_of(o.expdir)
            restart_path = cfg.restart_path
        else:
            fields = [parse_field(spec) for spec in o.field]
        if o.path:
            check_template([o.path], ("member",))
            restart_path = lambda m: Path(o.path.format(member=m))  # noqa: E731
        token = Path(o.token_file).read_text().strip()
        runner = Runner(o.address, token, curve_server_key=o.curve_key or None, name=o.name)
        loop = InterceptRunner(runner, fields, model, Path(o.shim), restart_path, steps=o.steps, cwd=o.cwd,
                               timeout_s=o.timeout)
    except (EnkflowError, OSError) as exc:
        print(f"enkflow intercept: error: {exc}", file=sys.stderr, flush=True)
        return 1

    def stop_model() -> None:
        loop.stop_model()
        if o.timings is not None:
            o.timings.write_text("".join(json.dumps(t) + "\n" for t in loop.timings))

    return run_runner_process(runner, loop.run, name="enkflow intercept", before_close=stop_model)


if __name__ == "__main__":
    sys.exit(main())
