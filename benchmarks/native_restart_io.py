"""A native model's restart read and write time per member: through files, through netCDF interception
and through the C runner API, at several ensemble sizes, in one run (issue 13; docs/intercept.md).

    python benchmarks/native_restart_io.py [--members 8 32] [--mb 52.4] [--dir DIR] [--build DIR]
                                           [--transport auto|shm|tcp]

One model, three ways; its state is one float64 variable ``x`` of ``--mb`` MB (1 MB = 1e6 bytes), and
its "forecast" adds 1 to every element (not timed). Members run one after another on one runner, so
each figure is one member's cost without contention:

* **files**: ``io_model`` (benchmarks/native_restart_io/io_model.c, plain netCDF) on each member's
  restart file (netCDF-4): ``read`` = nc_open + nc_get_var_double + nc_close; ``write`` = nc_open
  NC_WRITE + nc_put_var_double + nc_close; ``fsync`` = the fsync that makes the write durable (offline
  mode's restarts must survive a crash). The files are written just before, so reads come from a warm
  page cache: the most favourable case for files.
* **intercept**: the same unmodified ``io_model`` binary run by ``python -m enkflow.online.intercept``
  under the shim, against a server (``python -m enkflow.bench.online_server``, the exchange problem:
  one field, ETKF with 64 observations after the forecasts). ``read``/``write`` are the model's own
  timings as above (the shim serves x from memory; the real file is opened only for its metadata);
  ``exchange`` is the runner's expose (PUT of the forecast, READY/TASK, GET of the next member's state
  into the shared segment).
* **C API**: ``capi_model`` (capi_model.c) with libenkflow_runner against the same server: ``exchange``
  = one expose (PUT, READY/TASK, GET into the model's array).

The physical limit, **memcpy**: ``np.copyto`` of the same bytes (one state, ``--mb`` MB) from one
array into another, both touched before (so no page faults are timed), best of 7 (:mod:`enkflow.bench.memcpy`); its
``gbps`` is state bytes / those seconds. A member's exchange moves the state in (GET) and its forecast
out (PUT), so the floor of a way's ``io`` is two such copies: ``*_over_two_copies`` = io / (2 x copy).

``--transport`` sets ``ENKFLOW_TRANSPORT`` for the runners (the intercepted model's wrapper and the C
API runner) and ``--transport`` of the server (:mod:`enkflow.bench.online_server`): ``shm`` exchanges
through shared memory (the server's node is the runner's), ``tcp`` over loopback TCP, ``auto`` (the
default) as the runners choose by themselves; run twice to see TCP beside shared memory.

Per member, ``io`` is read + write (+ exchange) for each way (``files`` with and without fsync). A way's
figure is the median over its members (``--stat mean``: the mean). On a virtual machine an occasional member
takes 5-20 times as long as the others (its fresh memory, returned to the host, is faulted in again there:
every way allocates some), and the mean then says more about those hiccups than about the way; the JSON
names the statistic. The
online ways run two cycles and are timed in the second, as a study sees them once its runners are
going: a long-lived runner (the C API) has then mapped the server's store (page tables once per runner,
not per member), while an intercepted model is a new process per task in every cycle and pays its
mappings every time. Within the timed cycle the exchange that waits for the analysis (its first) and
the last (a PUT, then STOP) are left out; the means are over the members in between. The first
cycle's means are reported too (``*_first_cycle``). Ratios are files / intercept, files / C API and
intercept / C API, and each way over two copies, from the same run. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from enum import Enum
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.bench.memcpy import COPY_REPEATS, memcpy_limit

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent / "native_restart_io"
CYCLES = 2  # the online ways are timed in the last


def cmake_native(out: Path, build_dir: Path | None) -> Path:
    """``build_dir``, or else native/ built with CMake (Release) in ``out/build``: the build's folder."""
    if build_dir is None:
        build_dir = out / "build"
        subprocess.run(["cmake", "-S", str(ROOT / "native"), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build_dir), "-j", "2"], check=True, stdout=subprocess.DEVNULL)
    return build_dir


def build(out: Path, build_dir: Path | None) -> dict[str, Path]:
    """native/ built with CMake (unless ``build_dir`` holds a build) and the two benchmark models."""
    build_dir = cmake_native(out, build_dir)
    shim = next(build_dir.rglob("libenkflow_intercept.so"))
    runner_lib = next(build_dir.rglob("libenkflow_runner.so"))
    nc = subprocess.run(["pkg-config", "--cflags", "--libs", "netcdf"], capture_output=True, text=True, check=True).stdout.split()
    io_model, capi_model = out / "io_model", out / "capi_model"
    subprocess.run(["cc", "-O2", "-o", str(io_model), str(HERE / "io_model.c"), *nc], check=True)
    subprocess.run(["cc", "-O2", "-o", str(capi_model), str(HERE / "capi_model.c"), f"-I{ROOT / 'native' / 'include'}",
                    f"-L{runner_lib.parent}", "-lenkflow_runner", f"-Wl,-rpath,{runner_lib.parent}"], check=True)
    return {"shim": shim, "io_model": io_model, "capi_model": capi_model}


def write_restarts(d: Path, members: int, n: int) -> list[Path]:
    d.mkdir(parents=True, exist_ok=True)
    paths = []
    for m in range(1, members + 1):
        p = d / f"member_{m:04d}.nc"
        with netCDF4.Dataset(p, "w") as ds:
            ds.createDimension("n", n)
            ds.createVariable("x", "f8", ("n",))[:] = float(m) + 1e-7 * np.arange(n)
        paths.append(p)
    return paths


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Stat(Enum):
    """How a way's per-member seconds are summed up: the median over the members, or their mean."""

    MEDIAN = "median"
    MEAN = "mean"

    def of(self, values: list[float]) -> float:
        return float(np.median(values) if self is Stat.MEDIAN else np.mean(values))


def files_way(exe: Path, restarts: list[Path], d: Path, stat: Stat) -> dict[str, float]:
    out = d / "files.jsonl"
    env = dict(os.environ, IO_TIMINGS=str(out))
    for p in restarts:
        subprocess.run([str(exe), str(p), "--fsync"], env=env, check=True)
    t = _lines(out)
    res = {k: stat.of([r[k] for r in t]) for k in ("read_s", "write_s", "fsync_s")}
    res["io_s"] = stat.of([r["read_s"] + r["write_s"] + r["fsync_s"] for r in t])
    res["io_nofsync_s"] = stat.of([r["read_s"] + r["write_s"] for r in t])
    return res


class BenchServer:
    """``python -m enkflow.bench.online_server``: one float64 field of ``n`` elements, ``members`` members, CYCLES cycles."""

    def __init__(self, d: Path, n: int, members: int, transport: str):
        d.mkdir(parents=True, exist_ok=True)
        self.d = d
        self.token = d / "token"
        self.token.write_text(secrets.token_hex(16) + "\n")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        argv = [sys.executable, "-m", "enkflow.bench.online_server", "--dir", str(d), "--problem", "exchange",
                "--n", str(n), "--members", str(members), "--cycles", str(CYCLES), "--nsteps", "1", "--seed", "0", "--runners", "1", "--transport", transport]
        self.log = open(d / "server.log", "wb")
        self.proc = subprocess.Popen(argv, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while not (d / "address").exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the benchmark server did not start; see {d / 'server.log'}")
            time.sleep(0.05)
        self.address = (d / "address").read_text().strip()

    def wait(self, timeout_s: float = 900) -> None:
        try:
            if self.proc.wait(timeout=timeout_s) != 0:
                raise SystemExit(f"the benchmark server failed; see {self.d / 'server.log'}")
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


def runner_env(transport: str, **extra: str) -> dict[str, str]:
    """The runners' environment: ``ENKFLOW_TRANSPORT`` (how they exchange with the server) and ``extra``."""
    return dict(os.environ, ENKFLOW_TRANSPORT=transport, **extra)


def intercept_way(exe: Path, shim: Path, template: Path, n: int, members: int, d: Path,
                  transport: str, stat: Stat) -> dict[str, float]:
    server = BenchServer(d, n, members, transport)
    model_t, runner_t = d / "model.jsonl", d / "runner.jsonl"
    argv = [sys.executable, "-m", "enkflow.online.intercept", "--address", server.address, "--token-file",
            str(server.token), "--field", f"x:float64:{n}", "--path", str(template), "--shim", str(shim),
            "--timings", str(runner_t), "--", str(exe), "{restart}"]
    with open(d / "runner.log", "wb") as log:
        rc = subprocess.run(argv, env=runner_env(transport, IO_TIMINGS=str(model_t)), stdout=log, stderr=subprocess.STDOUT).returncode
    server.wait()
    if rc != 0:
        raise SystemExit(f"the intercepted runner failed (exit {rc}); see {d / 'runner.log'}")
    m, r = _lines(model_t), _lines(runner_t)
    assert len(m) == len(r) == CYCLES * members, (len(m), len(r), members)
    # Task k's exchange sends its forecast and fetches the next state: the last of each cycle waits
    # for the analysis (and at the end for STOP).
    res = _intercept_summary(m[members:2 * members - 1], r[members:2 * members - 1], stat)
    res["io_first_cycle_s"] = _intercept_summary(m[:members - 1], r[:members - 1], stat)["io_s"]
    return res


def _intercept_summary(m: list[dict], r: list[dict], stat: Stat) -> dict[str, float]:
    """Seconds of the model's read and write and of the wrapper's exchange over the records ``m`` and ``r``
    (a member each), and of their sum per member (``io_s``)."""
    return {"read_s": stat.of([t["read_s"] for t in m]),
            "write_s": stat.of([t["write_s"] for t in m]),
            "exchange_s": stat.of([t["exchange_s"] for t in r]),
            "shim_get_s": stat.of([t["get_s"] for t in r]),
            "shim_put_s": stat.of([t["put_s"] for t in r]),
            "io_s": stat.of([a["read_s"] + a["write_s"] + b["exchange_s"] for a, b in zip(m, r)])}


def capi_way(exe: Path, n: int, members: int, d: Path, transport: str, stat: Stat) -> dict[str, float]:
    server = BenchServer(d, n, members, transport)
    out = d / "capi.json"
    with open(d / "runner.log", "wb") as log:
        rc = subprocess.run([str(exe), server.address, str(server.token), str(n), str(out)], stdout=log,
                            stderr=subprocess.STDOUT, env=runner_env(transport)).returncode
    server.wait()
    if rc != 0:
        raise SystemExit(f"the C API runner failed (exit {rc}); see {d / 'runner.log'}")
    times = json.loads(out.read_text())
    assert len(times) == CYCLES * members + 1, (len(times), members)
    # Expose 0 only fetches; expose N sends the last forecast of cycle 1, waits for the analysis and
    # fetches the first state of cycle 2; the last one sends the last forecast and gets STOP.
    steady = stat.of(times[members + 1:2 * members])
    return {"exchange_s": steady, "io_s": steady, "io_first_cycle_s": stat.of(times[1:members])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", type=int, nargs="+", default=[8, 32])
    p.add_argument("--mb", type=float, default=52.4, help="state (and restart) size per member, MB (1e6 bytes)")
    p.add_argument("--dir", type=Path, default=None, help="working directory (default: a temporary one, removed)")
    p.add_argument("--build", type=Path, default=None, help="an existing CMake build of native/ (default: build one)")
    p.add_argument("--transport", choices=["auto", "shm", "tcp"], default="auto",
                   help="ENKFLOW_TRANSPORT of the runners and the server's transport (default: auto)")
    p.add_argument("--stat", choices=[s.value for s in Stat], default=Stat.MEDIAN.value,
                   help="a way's per-member figure: the median over the members (default) or the mean")
    a = p.parse_args(argv)
    stat = Stat(a.stat)
    if min(a.members) < 3:
        p.error("--members must be >= 3 (the first and last exchange of a run are left out)")
    n = math.ceil(a.mb * 1e6 / 8)
    tmp = None
    if a.dir is None:
        tmp = tempfile.mkdtemp(prefix="enkflow-native-io-")
        a.dir = Path(tmp)
    a.dir.mkdir(parents=True, exist_ok=True)
    try:
        exes = build(a.dir, a.build)
        result: dict = {"state_mb": n * 8 / 1e6, "n": n, "transport": a.transport, "stat": stat.value, "members": {}}
        for members in a.members:
            d = a.dir / f"m{members}"
            shutil.rmtree(d, ignore_errors=True)
            restarts = write_restarts(d / "restarts", members, n)
            result["restart_file_mb"] = restarts[0].stat().st_size / 1e6
            print(f"{members} members, restarts of {restarts[0].stat().st_size / 1e6:.1f} MB", flush=True)
            limit = memcpy_limit(n)
            copy = {"copy_s": limit.seconds, "gbps": limit.gbps, "repeats": limit.repeats}
            print(f"  memcpy    {copy['copy_s']:.4f} s ({copy['gbps']:.1f} GB/s, best of {COPY_REPEATS})", flush=True)
            files = files_way(exes["io_model"], restarts, d, stat)
            print(f"  files     read {files['read_s']:.4f} s  write {files['write_s']:.4f} s  fsync {files['fsync_s']:.4f} s",
                  flush=True)
            inter = intercept_way(exes["io_model"], exes["shim"], restarts[0], n, members, d / "intercept", a.transport,
                                  stat)
            print(f"  intercept read {inter['read_s']:.4f} s  write {inter['write_s']:.4f} s  exchange {inter['exchange_s']:.4f} s"
                  f"  (io in cycle 1: {inter['io_first_cycle_s']:.4f} s)", flush=True)
            capi = capi_way(exes["capi_model"], n, members, d / "capi", a.transport, stat)
            print(f"  C API     exchange {capi['exchange_s']:.4f} s  (in cycle 1: {capi['io_first_cycle_s']:.4f} s)", flush=True)
            shutil.rmtree(d / "restarts", ignore_errors=True)
            result["members"][str(members)] = {
                "files": files, "intercept": inter, "capi": capi,
                "ratio_files_over_intercept": files["io_s"] / inter["io_s"],
                "ratio_files_nofsync_over_intercept": files["io_nofsync_s"] / inter["io_s"],
                "ratio_files_over_capi": files["io_s"] / capi["io_s"],
                "ratio_files_nofsync_over_capi": files["io_nofsync_s"] / capi["io_s"],
                "ratio_intercept_over_capi": inter["io_s"] / capi["io_s"],
                "memcpy": copy,
                **{f"{way}_over_two_copies": t / (2 * copy["copy_s"]) for way, t in
                   (("files", files["io_s"]), ("files_nofsync", files["io_nofsync_s"]), ("intercept", inter["io_s"]),
                    ("capi", capi["io_s"]))}}
        print()
        print(f"restart read + write per member ({stat.value} over the members), state {n * 8 / 1e6:.1f} MB, runners' "
              f"transport {a.transport} "
              "(seconds; files/way = files' time / way's; way/2c = way's time / two memory copies)")
        print(f"{'members':>8} {'files':>8} {'files*':>8} {'intercept':>10} {'C API':>8} {'2 copies':>9} {'files/int':>10} "
              f"{'files/C':>8} {'int/C':>6} {'files/2c':>9} {'int/2c':>7} {'C/2c':>6}")
        for members, r in result["members"].items():
            print(f"{members:>8} {r['files']['io_s']:8.4f} {r['files']['io_nofsync_s']:8.4f} {r['intercept']['io_s']:10.4f} "
                  f"{r['capi']['io_s']:8.4f} {2 * r['memcpy']['copy_s']:9.4f} {r['ratio_files_over_intercept']:10.2f} "
                  f"{r['ratio_files_over_capi']:8.2f} {r['ratio_intercept_over_capi']:6.2f} {r['files_over_two_copies']:9.2f} "
                  f"{r['intercept_over_two_copies']:7.2f} {r['capi_over_two_copies']:6.2f}")
        print("files* = without the fsync; page cache warm for the reads; 2 copies = twice np.copyto of the state")
        print(json.dumps(result))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
