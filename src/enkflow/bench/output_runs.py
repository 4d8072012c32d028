"""The four runs of ``enkflow bench output`` (:mod:`enkflow.bench.output`), timed, and their summary:
the model with no output, with synchronous NetCDF output, through the output server, and beside a
busy loop where the writer would run. Only the output layer's public API is timed
(:class:`~enkflow.output.Output`'s ``add``, ``backlog``, ``close`` and ``stats``)."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import netCDF4
import numpy as np

from enkflow.models.demo_model import DemoModel, _pattern
from enkflow.models.synthetic_land import LonLatGrid, land_mask, member_field
from enkflow.output import Output, OutputConfig

TARGET_SERVER = 0.02  # model-side overhead through the server, a fraction of the model's time
TARGET_SYNC = 0.30  # what synchronous output must cost for the set-up to be the one of the target
# The order of the four runs (no output, synchronous, server, busy loop) in rounds 1-4, 5-8, ...: a
# Williams square, balanced for place and for the run that comes before. A plain rotation keeps one
# cycle (no output always after the busy loop, the server after the synchronous run), and with an odd
# count of rounds the median then keeps a drift.
ORDERS = ((0, 1, 3, 2), (1, 2, 0, 3), (2, 3, 1, 0), (3, 0, 2, 1))
RUNS = ("none", "sync", "server", "busy")

# The probe: spin where the writer would run, placed as the writer places itself, until killed.
_BUSY_LOOP = """
import json, sys
from enkflow.output.writer import lower_priority
lower_priority(json.loads(sys.argv[1]))
print("spinning", flush=True)
while True:
    pass
"""


def output_config(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """The ``[output]`` table of the server's run: one field ``u`` (lat, lon) as the options say; compressed,
    one NetCDF-4 file per step (the growing files are CDF-5, which has no compression); uncompressed, the
    one growing file of ``u``, appended each step like the baseline's."""
    f: dict[str, Any] = {"dims": ["lat", "lon"], "ensemble": False, "units": "1", "long_name": "demo model state",
                         "dtype": args.dtype}
    if args.dtype == "int16":
        f["pack_range"] = [-10.0, 10.0]
    return {"directory": str(directory), "members": 0, "transport": args.transport,
            "file": "{field}.nc" if args.compression == "none" else "{field}_{time:g}.nc",
            "dims": {"lat": {"size": args.ny, "units": "degrees_north", "standard_name": "latitude", "axis": "Y"},
                     "lon": {"size": args.nx, "units": "degrees_east", "standard_name": "longitude", "axis": "X"}},
            "fields": {"u": f}, "compression": args.compression, "complevel": args.complevel, "diagnostics": False,
            "time_units": "hours since 2000-01-01 00:00:00", "title": "enkflow bench output",
            **({"writer_nice": args.writer_nice} if args.writer_nice is not None else {}),
            "writer_cpus": args.writer_cpu_list}


def _sync_writer(path: Path, args: argparse.Namespace, lon: np.ndarray, lat: np.ndarray) -> tuple[Any, Any, Any]:
    """The baseline: one NetCDF-4 file, one time appended per step (what a model's own output does);
    the dataset, its time variable and its field."""
    ds = netCDF4.Dataset(path, "w", format="NETCDF4")
    ds.createDimension("time", None)
    ds.createDimension("lat", args.ny)
    ds.createDimension("lon", args.nx)
    t = ds.createVariable("time", "f8", ("time",))
    t.units = "hours since 2000-01-01 00:00:00"
    ds.createVariable("lat", "f8", ("lat",))[:] = lat
    ds.createVariable("lon", "f8", ("lon",))[:] = lon
    comp = {} if args.compression == "none" else {"compression": args.compression, "complevel": args.complevel}
    kind = {"float32": "f4", "float64": "f8", "int16": "i2"}[args.dtype]
    v = ds.createVariable("u", kind, ("time", "lat", "lon"), chunksizes=(1, args.ny, args.nx), **comp)
    if args.dtype == "int16":
        v.scale_factor, v.add_offset = 20.0 / 65534, 0.0
    return ds, t, v


class OutputRuns:
    """The demo model on an ``nx`` x ``ny`` land grid, and the figures of every run so far (in ``root``)."""

    def __init__(self, args: argparse.Namespace, root: Path) -> None:
        self.args, self.root = args, root
        grid = LonLatGrid(args.nx, args.ny)
        self.land = land_mask(grid)
        jj, ii = np.meshgrid(np.arange(args.ny), np.arange(args.nx), indexing="ij")
        self.u0 = np.where(self.land, member_field(grid, ii, jj, 0.3), 0.0)
        self.pattern, self.lon, self.lat = _pattern(args.nx, args.ny), grid.lon, grid.lat
        self.model = DemoModel(length=float(args.steps), substeps=args.substeps)
        self.ocfg = OutputConfig.model_validate(output_config(args, root))
        self.res: dict[str, list[float]] = {k: [] for k in ("none", "sync", "server", "busy", "start", "drain",
                                                             "blocked", "add", "cpu_none", "cpu_sync", "cpu_server")}
        self.backlog, self.backlog_bytes = 0, 0
        self.halves = [0, 0]  # the largest backlog in the first and in the second half of the steps: growing?
        self.write_s: list[float] = []
        self.cpu_s: list[float] = []  # the writer process's CPU time, start-up included
        self.checksum: float | None = None
        self.load_start = os.getloadavg()[0]
        self.ref = self._advance()  # also warms the model's code and memory before any timed run

    def _advance(self, on_step: Any = None) -> np.ndarray:
        return self.model.advance(self.u0, self.land, self.pattern, on_step=on_step)

    def round(self, r: int) -> None:
        """Round ``r``: the four runs in their order of the Williams square."""
        runs = [self.no_output, self.sync_output, self.server_output, self.beside_busy_loop]
        for k in ORDERS[r % len(ORDERS)]:
            runs[k](r)

    def no_output(self, r: int) -> None:
        t0, c0 = time.perf_counter(), time.process_time()
        got = self._advance()
        self.res["none"].append(time.perf_counter() - t0)
        self.res["cpu_none"].append(time.process_time() - c0)
        np.testing.assert_array_equal(got, self.ref)

    def sync_output(self, r: int) -> None:
        path = self.root / f"sync_{r}.nc"
        ds, tv, var = _sync_writer(path, self.args, self.lon, self.lat)

        def write_sync(k: int, u: np.ndarray) -> None:
            tv[k - 1] = float(k)
            var[k - 1] = u

        t0, c0 = time.perf_counter(), time.process_time()
        got = self._advance(write_sync)
        ds.close()
        self.res["sync"].append(time.perf_counter() - t0)
        self.res["cpu_sync"].append(time.process_time() - c0)
        path.unlink()
        np.testing.assert_array_equal(got, self.ref)

    def server_output(self, r: int) -> None:
        d = self.root / f"server_{r}"
        t0 = time.perf_counter()
        out = Output(output_config(self.args, d), coords={"lat": self.lat, "lon": self.lon})
        self.res["start"].append(time.perf_counter() - t0)
        samples: list[int] = []

        def write_server(k: int, u: np.ndarray) -> None:
            out.add("u", u, time=float(k))
            samples.append(out.backlog()[0])

        t0, c0 = time.perf_counter(), time.process_time()
        got = self._advance(write_server)
        self.res["server"].append(time.perf_counter() - t0)
        self.res["cpu_server"].append(time.process_time() - c0)
        t0 = time.perf_counter()
        out.close()
        self.res["drain"].append(time.perf_counter() - t0)
        self._server_figures(out.stats(), samples)
        self._check_files(d)
        np.testing.assert_array_equal(got, self.ref)
        shutil.rmtree(d)

    def _server_figures(self, s: dict[str, Any], samples: list[int]) -> None:
        """The server run's figures: its stats, and the backlog after each step (``samples``)."""
        self.res["blocked"].append(s["blocked_s"])
        self.res["add"].append(s["add_s"])
        self.backlog = max(self.backlog, s["backlog_max_messages"])
        half = len(samples) // 2
        self.halves[0] = max(self.halves[0], max(samples[:half], default=0))
        self.halves[1] = max(self.halves[1], max(samples[half:], default=0))
        self.write_s.append(s["writers"][0]["write_s"])
        self.cpu_s.append(s["writers"][0]["cpu_s"])
        self.backlog_bytes = max(self.backlog_bytes, s["backlog_max_bytes"])

    def _check_files(self, d: Path) -> None:
        """One file per step (or one record per step of the growing file); the first round's last step
        holds the model's last field."""
        args = self.args
        if self.ocfg.series:
            with netCDF4.Dataset(d / "u.nc") as nc:
                steps = len(nc.dimensions["time"])
        else:
            steps = len(list(d.glob("u_*.nc")))
        if steps != args.steps:
            raise RuntimeError(f"the server wrote {steps} steps, expected {args.steps}")
        if self.checksum is not None:
            return
        last_file, at = (d / "u.nc", -1) if self.ocfg.series else (d / f"u_{args.steps}.nc", 0)
        with netCDF4.Dataset(last_file) as nc:
            last = np.asarray(nc["u"][at], dtype=np.float64)
        ref = self.ref
        tol = 20.0 / 65534 if args.dtype == "int16" else (1e-6 * np.abs(ref).max() if args.dtype == "float32" else 0)
        self.checksum = float(np.abs(last - ref).max())
        if self.checksum > tol:
            raise RuntimeError(f"the last file differs from the model's field by {self.checksum} (> {tol})")

    def beside_busy_loop(self, r: int) -> None:
        loop = subprocess.Popen([sys.executable, "-c", _BUSY_LOOP, self.ocfg.model_dump_json()], stdout=subprocess.PIPE)
        try:
            assert loop.stdout is not None
            if loop.stdout.readline().strip() != b"spinning":  # it spins from here
                raise RuntimeError("the busy loop of the probe did not start (its error is above)")
            t0 = time.perf_counter()
            got = self._advance()
            self.res["busy"].append(time.perf_counter() - t0)
        finally:
            loop.kill()
            loop.wait()
        np.testing.assert_array_equal(got, self.ref)

    def overhead(self, path: str, base: str) -> float:
        """The median over the rounds of each round's ``path`` time over its ``base`` time, less 1."""
        return statistics.median(a / b - 1.0 for a, b in zip(self.res[path], self.res[base]))


def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """``args.repeat`` rounds of the four runs; the bench's JSON object."""
    runs = OutputRuns(args, root)
    for r in range(args.repeat):
        runs.round(r)
    load_end = os.getloadavg()[0]
    return {**_settings(args), **_times(runs), **_conditions(args, runs, load_end), **_targets(runs)}


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"bench": "output", "nx": args.nx, "ny": args.ny, "steps": args.steps, "substeps": args.substeps,
            "dtype": args.dtype, "compression": args.compression, "complevel": args.complevel,
            "transport": args.transport, "repeat": args.repeat,
            "field_mb_float64": args.nx * args.ny * np.dtype("float64").itemsize / 1e6}


def _times(runs: OutputRuns) -> dict[str, Any]:
    res = runs.res
    med = {k: statistics.median(v) for k, v in res.items()}
    return {
        "model_s_no_output": med["none"], "model_s_sync_output": med["sync"], "model_s_server_output": med["server"],
        "sync_overhead": runs.overhead("sync", "none"), "server_overhead": runs.overhead("server", "none"),
        "model_s_no_output_beside_busy_loop": med["busy"], "busy_loop_overhead": runs.overhead("busy", "none"),
        "server_add_fraction": statistics.median(a / b for a, b in zip(res["add"], res["none"])),
        # CPU seconds of the model's process: what the output costs the model itself, whatever else
        # runs on the node (on a crowded node the wall times above include the writer's share of the CPUs).
        "model_cpu_s_no_output": med["cpu_none"], "model_cpu_s_sync_output": med["cpu_sync"],
        "model_cpu_s_server_output": med["cpu_server"],
        "sync_cpu_overhead": runs.overhead("cpu_sync", "cpu_none"),
        "server_cpu_overhead": runs.overhead("cpu_server", "cpu_none"),
        "server_start_s": med["start"], "server_drain_s": med["drain"], "blocked_s": med["blocked"],
        "writer_backlog_max": runs.backlog, "writer_backlog_max_bytes": runs.backlog_bytes,
        "writer_backlog_max_first_half": runs.halves[0], "writer_backlog_max_second_half": runs.halves[1],
        "writer_busy_s": statistics.median(runs.write_s), "writer_cpu_s": statistics.median(runs.cpu_s),
        "runs": dict(res.items()), "max_abs_diff_last_file": runs.checksum,
    }


def _conditions(args: argparse.Namespace, runs: OutputRuns, load_end: float) -> dict[str, Any]:
    return {"orders": [[RUNS[k] for k in ORDERS[r % len(ORDERS)]] for r in range(args.repeat)],
            "writer_nice": runs.ocfg.writer_nice, "writer_cpus": runs.ocfg.writer_cpus,
            "model_cpus": args.model_cpu_list, "loadavg_start": runs.load_start, "loadavg_end": load_end,
            "cpus": os.cpu_count()}


def _targets(runs: OutputRuns) -> dict[str, bool]:
    """Acceptance 1 of issue 12, judged on this run: the server costs the model <= 2% of its time
    (wall, and the model process's CPU), in a set-up where synchronous output costs >= 30%; the
    writer keeps up: add never waited for room, and the largest backlog of the second half of the
    steps is at most 2 pieces above that of the first (a writer falling behind grows it every step)."""
    server, sync = runs.overhead("server", "none"), runs.overhead("sync", "none")
    server_cpu, sync_cpu = runs.overhead("cpu_server", "cpu_none"), runs.overhead("cpu_sync", "cpu_none")
    return {"target_server_wall_met": server <= TARGET_SERVER, "target_server_cpu_met": server_cpu <= TARGET_SERVER,
            "target_sync_wall_met": sync >= TARGET_SYNC, "target_sync_cpu_met": sync_cpu >= TARGET_SYNC,
            "writer_keeps_up": runs.halves[1] <= runs.halves[0] + 2 and max(runs.res["blocked"]) == 0.0}


def report(r: dict[str, Any]) -> None:
    """The text report of the results ``r`` of :func:`run`, and whether each target was met."""
    print(f"model time, no output        {r['model_s_no_output']:8.3f} s\n"
          f"synchronous NetCDF output    {r['model_s_sync_output']:8.3f} s  (+{100 * r['sync_overhead']:.1f}%)\n"
          f"through the output server    {r['model_s_server_output']:8.3f} s  (+{100 * r['server_overhead']:.1f}%; "
          f"in add {100 * r['server_add_fraction']:.2f}%, blocked {r['blocked_s']:.3f} s)\n"
          f"model CPU time: no output {r['model_cpu_s_no_output']:.3f} s, synchronous "
          f"{r['model_cpu_s_sync_output']:.3f} s (+{100 * r['sync_cpu_overhead']:.1f}%), server "
          f"{r['model_cpu_s_server_output']:.3f} s (+{100 * r['server_cpu_overhead']:.1f}%)\n"
          f"beside a busy loop on the writer's CPUs, no output {r['model_s_no_output_beside_busy_loop']:8.3f} s  "
          f"(+{100 * r['busy_loop_overhead']:.1f}%: what any work there costs the model on this machine)\n"
          f"writer backlog max {r['writer_backlog_max']} field(s) ({r['writer_backlog_max_bytes'] / 1e6:.1f} MB; "
          f"first half of the steps {r['writer_backlog_max_first_half']}, second half "
          f"{r['writer_backlog_max_second_half']}); writer busy {r['writer_busy_s']:.3f} s, CPU {r['writer_cpu_s']:.3f} s; "
          f"drain after the last step {r['server_drain_s']:.3f} s; start {r['server_start_s']:.2f} s "
          f"(pid {os.getpid()})\n"
          f"load average {r['loadavg_start']:.2f} at the start, {r['loadavg_end']:.2f} at the end ({r['cpus']} CPUs); "
          f"writer niceness +{r['writer_nice']}, "
          + (f"writer on CPUs {r['writer_cpus']}, model on {r['model_cpus']}" if r['writer_cpus'] else
             "placement left to the scheduler"))
    yes = {True: "MET", False: "NOT MET"}
    print(f"target: output through the server costs the model <= {100 * TARGET_SERVER:.0f}% of its time: "
          f"wall +{100 * r['server_overhead']:.1f}% {yes[r['target_server_wall_met']]}, "
          f"model CPU +{100 * r['server_cpu_overhead']:.1f}% {yes[r['target_server_cpu_met']]} "
          f"(time in add {100 * r['server_add_fraction']:.2f}%)\n"
          f"set-up: synchronous output costs >= {100 * TARGET_SYNC:.0f}%: wall +{100 * r['sync_overhead']:.1f}% "
          f"{yes[r['target_sync_wall_met']]}, model CPU +{100 * r['sync_cpu_overhead']:.1f}% "
          f"{yes[r['target_sync_cpu_met']]}\n"
          f"the writer keeps up (backlog not growing, add never blocked): {yes[r['writer_keeps_up']]}")
