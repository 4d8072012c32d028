"""``enkflow bench io``: read and update throughput of the ensemble file I/O against references.

Generates N_e identical-structure files, then measures in one run, warm cache (median of
``--repeat`` rounds after a warm-up; each round runs every method once) and cold cache (one run after dropping the page cache):

* ``enkflow``: :meth:`EnsembleFiles.read`, :meth:`EnsembleFiles.update` unsafe and safe;
* ``pread``/``pwrite``: plain sequential ``pread``/``pwrite`` of each file's state variables at
  their byte offsets into/from the same array, one thread; ``pread_threads``/``pwrite_threads``:
  the same with enkflow's I/O thread count, each thread taking every T-th file as enkflow does.
  The pread references are physical (NetCDF-3's big-endian bytes are left unswapped); the
  pwrite references write the file's byte order (NumPy converts big-endian variables in
  enkflow's request size), so the files hold their values at every moment;
* ``netcdf4``: a netCDF4-python loop (open, ``var[:]``, close per file);
* ``xarray``: an xarray loop (``open_dataset``, ``.values`` per variable).

Every write phase starts after ``sync`` so that no method pays for another's dirty pages. Every
write writes back the values already in the files; ``files_unchanged`` checks that at the end.
GB/s counts the state bytes of all files (1 GB = 1e9 bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from enkflow.io.config import IOConfig, SafeUpdateConfig
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.generate import make_ensemble
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout


# The read references, in the order of each round: netCDF4 last, so that the shared array
# holds the files' values (not pread's raw NetCDF-3 bytes) when the write references run.
READ_REFS = ("pread", "pread_threads", "xarray", "netcdf4")


def add_parser(bench_subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``io`` under ``enkflow bench``."""
    p = bench_subparsers.add_parser(
        "io", help="ensemble restart-file read/update throughput vs pread, netCDF4 and xarray",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--members", type=int, default=40, help="N_e files (default 40)")
    p.add_argument("--mb-per-file", type=float, default=100.0, help="state size per file in MB (default 100)")
    p.add_argument("--ranks", type=int, default=1, help="MPI ranks P (re-launches itself with mpiexec when > 1)")
    p.add_argument("--io-tasks", type=int, default=None, help="N_io (default min(P, N_e))")
    p.add_argument("--threads", type=int, default=None, help="I/O threads per I/O task")
    p.add_argument("--format", choices=["nc4", "cdf2", "cdf5"], default="nc4")
    p.add_argument("--dir", default=None, help="where to create the files (default: a temporary directory under the current one)")
    p.add_argument("--log-dir", default=None, help="crash-safe update log directory (default /dev/shm if room)")
    p.add_argument("--repeat", type=int, default=3, help="warm-cache repetitions (median reported)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache measurements")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--json", action="store_true", help="end with one line: a JSON object of the results")
    p.set_defaults(func=run)


def _drop_caches(paths: list[str]) -> str:
    """Empty the page cache of ``paths``: ``drop_caches`` where permitted, else fadvise."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as fh:
            fh.write("3\n")
        return "drop_caches"
    except OSError:
        for p in paths:
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        return "fadvise-dontneed (drop_caches not permitted; evicts only these files' clean pages)"


def _refs(paths: list[str], layout: StateLayout, structures: list, threads: int = 1,
          chunk_bytes: int = 4 << 20) -> dict[str, Callable[[np.ndarray], None]]:
    """Reference loops; each fills or writes a full (n_rows, N_e) F-order float64 array.

    The state variables are float64 stored contiguously (as :func:`make_ensemble` writes
    them). ``pread``/``pwrite`` run one thread; ``pread_threads``/``pwrite_threads`` run
    ``threads`` threads (enkflow's count), each taking every ``threads``-th file, as
    enkflow's reader does. ``pread`` is physical: it leaves a big-endian (NetCDF-3)
    variable's bytes unswapped. ``pwrite`` writes the file's byte order, converting a
    big-endian variable with NumPy in ``chunk_bytes`` pieces (enkflow's request size), so
    that what it writes back is the values already there, byte for byte: a kill at any
    moment leaves the files valid.
    """
    import netCDF4

    native = np.dtype(np.float64)

    def members(n_threads: int, fn: Callable[[int], None]) -> None:
        t = max(1, min(n_threads, len(paths)))
        if t == 1:
            for m in range(len(paths)):
                fn(m)
            return

        def share(k: int) -> None:
            for m in range(k, len(paths), t):
                fn(m)

        with ThreadPoolExecutor(t) as ex:
            for f in [ex.submit(share, k) for k in range(t)]:
                f.result()

    def pread_file(A: np.ndarray, m: int) -> None:
        fd = os.open(paths[m], os.O_RDONLY)
        try:
            for sv in layout.variables:
                vs = structures[m].variables[sv.name]
                mv = memoryview(A[sv.rows, m]).cast("B")
                done = 0
                while done < len(mv):
                    done += os.preadv(fd, [mv[done:]], vs.offset + done)
        finally:
            os.close(fd)

    def pwrite_file(A: np.ndarray, m: int) -> None:
        fd = os.open(paths[m], os.O_WRONLY)
        try:
            for sv in layout.variables:
                vs = structures[m].variables[sv.name]
                col = A[sv.rows, m]
                if vs.dtype == native:
                    _pwrite_all(fd, memoryview(col).cast("B"), vs.offset)
                    continue
                step = max(chunk_bytes // vs.dtype.itemsize, 1)
                buf = np.empty(min(step, col.size), dtype=vs.dtype)
                for j in range(0, col.size, step):
                    piece = buf[: min(step, col.size - j)]
                    np.copyto(piece, col[j : j + piece.size])  # NumPy swaps the bytes in the cast
                    _pwrite_all(fd, memoryview(piece).cast("B"), vs.offset + j * vs.dtype.itemsize)
        finally:
            os.close(fd)

    def netcdf4_loop(A: np.ndarray) -> None:
        for m, p in enumerate(paths):
            ds = netCDF4.Dataset(p, "r")
            try:
                ds.set_auto_maskandscale(False)
                for sv in layout.variables:
                    A[sv.rows, m] = ds.variables[sv.name][...].reshape(-1)
            finally:
                ds.close()

    def xarray_loop(A: np.ndarray) -> None:
        import xarray as xr

        for m, p in enumerate(paths):
            with xr.open_dataset(p, cache=False, mask_and_scale=False, decode_times=False) as ds:
                for sv in layout.variables:
                    A[sv.rows, m] = ds[sv.name].values.reshape(-1)

    return {
        "pread": lambda A: members(1, lambda m: pread_file(A, m)),
        "pread_threads": lambda A: members(threads, lambda m: pread_file(A, m)),
        "pwrite": lambda A: members(1, lambda m: pwrite_file(A, m)),
        "pwrite_threads": lambda A: members(threads, lambda m: pwrite_file(A, m)),
        "netcdf4": netcdf4_loop,
        "xarray": xarray_loop,
    }


def _pwrite_all(fd: int, mv: memoryview, offset: int) -> None:
    done = 0
    while done < len(mv):
        done += os.pwrite(fd, mv[done:], offset + done)


def _relaunch(args: argparse.Namespace) -> int:
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        print("enkflow bench io: --ranks > 1 needs mpiexec (pip install mpich)", file=sys.stderr)
        return 2
    argv = [a for a in sys.argv[1:]]
    cmd = [exe, "-n", str(args.ranks), sys.executable, "-m", "enkflow", *argv]
    return subprocess.call(cmd)


def run(args: argparse.Namespace) -> int:
    comm = get_comm()
    if args.ranks > 1 and comm.size == 1:
        return _relaunch(args)
    rank = comm.rank
    say = (lambda *a: print(*a, flush=True)) if rank == 0 else (lambda *a: None)
    workdir = None
    if rank == 0:
        workdir = tempfile.mkdtemp(prefix="enkflow-bench-io-", dir=args.dir or os.getcwd())
    workdir = comm.bcast(workdir, root=0)
    try:
        if rank == 0:
            t0 = time.perf_counter()
            paths, scfg = make_ensemble(workdir, args.members, args.mb_per_file, fmt=args.format)
            say(f"generated {args.members} {args.format} files of {args.mb_per_file:g} MB state in {time.perf_counter() - t0:.1f} s under {workdir}")
        else:
            paths, scfg = None, None
        paths, scfg = comm.bcast((paths, scfg), root=0)
        layout = StateLayout.from_config(paths[0], scfg)
        cfg = IOConfig(io_tasks=args.io_tasks, threads=args.threads, safe_update=SafeUpdateConfig(log_dir=args.log_dir))
        ef = EnsembleFiles(paths, layout, mode="r+", comm=comm, config=cfg)
        total = ef.state_bytes * ef.n_members
        gb = total / 1e9
        X = np.empty((ef.n_local_rows, ef.n_members), order="F")
        res: dict[str, object] = {
            "members": args.members, "mb_per_file": args.mb_per_file, "format": args.format, "ranks": comm.size,
            "io_tasks": ef.n_io, "threads": ef.threads, "state_bytes_per_file": ef.state_bytes,
            "x_mb": X.nbytes / 1e6,
        }
        sync = os.sync
        if rank == 0:
            sync()
        _reset_peak_rss()
        serial = get_comm(force_serial=True)

        def timed(fn: Callable[[], object], before: Callable[[], object] | None = None, on: Comm = comm) -> float:
            if before is not None and rank == 0:
                before()
            on.barrier()
            t0 = time.perf_counter()
            fn()
            on.barrier()
            return time.perf_counter() - t0

        # warm-up, enkflow only, with nothing but X allocated: its peak RSS is enkflow's
        ef.read(X)
        ef.update(X, safe=False)
        rss = comm.allgather_obj(_peak_rss_mb())
        prep = comm.allgather_obj(ef.prepare_update())
        ef.update(X, safe=True)
        rss_safe = comm.allgather_obj(_peak_rss_mb())

        # values: every member's rows equal netCDF4's (one file's values in memory at a time)
        verified = _verify(paths, layout, X, ef.row_start, ef.row_stop)
        verified = all(comm.allgather_obj(verified))

        digest = _digest(X)  # the files' values, to check at the end that nothing changed them

        # warm-up of the references (rank 0, serial; serial runs reuse X as their array).
        # A must hold the files' values whenever a write reference runs (it writes them
        # back): netCDF4's loop runs last of the reads (pread leaves NetCDF-3 bytes unswapped).
        refs = _refs(paths, layout, ef.structures, threads=ef.threads, chunk_bytes=cfg.chunk_kb * 1024)
        A = None
        have_xarray = True
        if rank == 0:
            A = X if comm.size == 1 else np.empty((layout.n_rows, ef.n_members), order="F")
            for name in READ_REFS:
                try:
                    refs[name](A)
                except ImportError:
                    have_xarray = False

        # rounds: every method once per round, so that load from elsewhere hits all alike
        runs: dict[str, list[float]] = {}
        logs: list[float] = []

        def safe() -> None:
            logs.append(ef.update(X, safe=True).log_seconds)

        for _ in range(args.repeat):
            for name in READ_REFS:
                if name == "xarray" and not have_xarray:
                    continue
                if rank == 0:
                    runs.setdefault(name, []).append(timed(lambda: refs[name](A), on=serial))
                comm.barrier()
            runs.setdefault("read", []).append(timed(lambda: ef.read(X)))
            if rank == 0:  # the write references write back exactly what is there
                for name in ("pwrite", "pwrite_threads"):
                    runs.setdefault(name, []).append(timed(lambda: refs[name](A), before=sync, on=serial))
            comm.barrier()
            runs.setdefault("update", []).append(timed(lambda: ef.update(X, safe=False), before=sync))
            runs.setdefault("safe_update", []).append(timed(safe, before=sync))
        t: dict[str, float | None] = {k: statistics.median(v) for k, v in runs.items()}
        t = comm.bcast(t, root=0)

        # a safe update of a fresh object pays for its log space inside the update
        ef.close()
        ef2 = EnsembleFiles(paths, layout, mode="r+", comm=comm, config=cfg)
        if rank == 0:
            sync()
        comm.barrier()
        st_first = ef2.update(X, safe=True)
        ef2.close()

        g = lambda s: (gb / s) if s else None  # noqa: E731
        for k in ("read", "update", "safe_update", "pread", "pwrite", "pread_threads", "pwrite_threads"):
            res[f"{k}_gbps"] = g(t.get(k))
        res["netcdf4_read_gbps"] = g(t.get("netcdf4"))
        res["xarray_read_gbps"] = g(t.get("xarray"))
        res["safe_update_log_s"] = statistics.median(logs)
        res["safe_update_s"] = t["safe_update"]
        res["update_s"] = t["update"]
        res["wal_prepare_s"] = max(prep)
        res["safe_update_first_gbps"] = st_first.gbps
        res["safe_update_first_s"] = st_first.seconds

        # cold cache ------------------------------------------------------------------
        if not args.no_cold:
            cold: dict[str, object] = {}
            Xc = np.empty_like(X)
            ef3 = EnsembleFiles(paths, layout, mode="r", comm=comm, config=cfg)
            method = None
            for name in ("pread", "pread_threads", "read", "netcdf4", "xarray"):
                if rank == 0:
                    method = _drop_caches(paths)
                comm.barrier()
                t0 = time.perf_counter()
                if name == "read":
                    ef3.read(Xc)
                elif rank == 0:
                    try:
                        refs[name](A)
                    except ImportError:
                        continue
                comm.barrier()
                cold[f"{name}_gbps" if name != "read" else "read_gbps"] = gb / (time.perf_counter() - t0)
            ef3.close()
            res["cold"] = cold
            res["cold_method"] = comm.bcast(method, root=0)
            del Xc

        res["peak_rss_mb"] = max(rss)
        res["peak_rss_over_x"] = max(rss) / max(X.nbytes / 2**20, 1e-9)
        res["peak_rss_safe_update_mb"] = max(rss_safe)  # + the mapped log (as large as X)
        res["verified_against_netcdf4"] = verified
        res["files_unchanged"] = _unchanged(paths, layout, comm, cfg, X, digest)
        res["ratios"] = {
            "read_over_pread": _ratio(res["read_gbps"], res["pread_gbps"]),
            "read_over_pread_threads": _ratio(res["read_gbps"], res["pread_threads_gbps"]),
            "read_over_netcdf4": _ratio(res["read_gbps"], res["netcdf4_read_gbps"]),
            "update_over_pwrite": _ratio(res["update_gbps"], res["pwrite_gbps"]),
            "update_over_pwrite_threads": _ratio(res["update_gbps"], res["pwrite_threads_gbps"]),
            "safe_time_over_unsafe": t["safe_update"] / t["update"],
        }
        if rank == 0:
            _print_table(res, gb)
            if args.json:
                print(json.dumps(res, separators=(",", ":")), flush=True)
        return 0 if verified and res["files_unchanged"] else 1
    finally:
        comm.barrier()
        if rank == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def _reset_peak_rss() -> None:
    """Reset the kernel's high-water mark of this process's RSS (Linux), so that the peak
    measured covers the enkflow phases only, not the file generation."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5\n")
    except OSError:
        pass


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _verify(paths: list[str], layout: StateLayout, X: np.ndarray, r0: int, r1: int) -> bool:
    """X's rows [r0, r1) equal netCDF4's values, file by file."""
    import netCDF4

    for m, p in enumerate(paths):
        ds = netCDF4.Dataset(p, "r")
        try:
            ds.set_auto_maskandscale(False)
            col = np.concatenate([np.asarray(ds.variables[n][...], dtype=np.float64).reshape(-1) for n in layout.names])
        finally:
            ds.close()
        if not np.array_equal(col[r0:r1], X[:, m]):
            return False
    return True


def _digest(X: np.ndarray) -> list[bytes]:
    """A hash of each member's rows in ``X`` (n_local_rows, N_e)."""
    return [hashlib.blake2b(np.ascontiguousarray(X[:, m]).view(np.uint8)).digest() for m in range(X.shape[1])]


def _unchanged(paths: list[str], layout: StateLayout, comm: Comm, cfg: IOConfig, X: np.ndarray,
               digest: list[bytes]) -> bool:
    """The files still hold the values first read (every method wrote back what was there).
    Reads into ``X`` (its contents are spent by then)."""
    with EnsembleFiles(paths, layout, mode="r", comm=comm, config=cfg) as ef:
        ef.read(X)
    return all(comm.allgather_obj(_digest(X) == digest))


def _ratio(a: object, b: object) -> float | None:
    return (a / b) if isinstance(a, float) and isinstance(b, float) and b else None  # type: ignore[operator]


def _print_table(res: dict[str, object], gb: float) -> None:
    f = lambda v: f"{v:6.2f}" if isinstance(v, float) else "   n/a"  # noqa: E731
    print(f"{res['members']} files x {res['state_bytes_per_file'] / 1e6:.0f} MB state ({gb:.2f} GB), {res['format']}, "
          f"P={res['ranks']} N_io={res['io_tasks']} threads={res['threads']}")
    print("warm cache, GB/s:")
    print(f"  enkflow read        {f(res['read_gbps'])}   pread reference   {f(res['pread_gbps'])}   "
          f"pread, {res['threads']} thread(s)  {f(res['pread_threads_gbps'])}")
    print(f"  netCDF4 loop read   {f(res['netcdf4_read_gbps'])}   xarray loop read  {f(res['xarray_read_gbps'])}")
    print(f"  enkflow update      {f(res['update_gbps'])}   pwrite reference  {f(res['pwrite_gbps'])}   "
          f"pwrite, {res['threads']} thread(s) {f(res['pwrite_threads_gbps'])}")
    print(f"  safe update         {f(res['safe_update_gbps'])}   (log+commit {res['safe_update_log_s']:.2f} s; "
          f"log space allocated beforehand in {res['wal_prepare_s']:.2f} s; first update without it {f(res['safe_update_first_gbps'])})")
    if "cold" in res:
        c = res["cold"]
        print(f"cold cache ({res['cold_method']}), GB/s: " + ", ".join(f"{k[:-5]} {v:.2f}" for k, v in c.items()))  # type: ignore[union-attr]
    ra = res["ratios"]
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ra.items() if v is not None))  # type: ignore[union-attr]
    print(f"peak RSS {res['peak_rss_mb']:.0f} MB = {res['peak_rss_over_x']:.2f} x X ({res['x_mb']:.0f} MB) for read and update"
          f", {res['peak_rss_safe_update_mb']:.0f} MB with the safe update's mapped log"
          f"; X equals netCDF4's values: {res['verified_against_netcdf4']}; files unchanged: {res['files_unchanged']}")
