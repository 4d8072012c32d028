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
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

from enkflow.bench.io_runs import IOBench
from enkflow.io.config import UpdateMethod
from enkflow.parallel import get_comm


def add_parser(bench_subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.add_argument("--safe-method", choices=[m.value for m in UpdateMethod], default=UpdateMethod.AUTO.value,
                   help="[io.safe_update] method of the safe update (default auto: shadow files where the files allow)")
    p.add_argument("--log-dir", default=None, help="method log: the log directory (default .enkflow-wal/ beside the files)")
    p.add_argument("--repeat", type=int, default=3, help="warm-cache repetitions (median reported)")
    p.add_argument("--no-cold", action="store_true", help="skip the cold-cache measurements")
    p.add_argument("--keep", action="store_true", help="keep the generated files")
    p.add_argument("--json", action="store_true", help="end with one line: a JSON object of the results")
    p.set_defaults(func=run)


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
    workdir = None
    if comm.rank == 0:
        base = args.dir or os.getcwd()
        os.makedirs(base, exist_ok=True)  # --dir names where to work; a missing one is made, as the other benches do
        workdir = tempfile.mkdtemp(prefix="enkflow-bench-io-", dir=base)
    workdir = comm.bcast(workdir, root=0)
    try:
        bench = IOBench(args, comm, workdir)
        res = bench.measure()
        if comm.rank == 0:
            _print_table(res, bench.gb)
            if args.json:
                print(json.dumps(res, separators=(",", ":")), flush=True)
        return 0 if res["verified_against_netcdf4"] and res["files_unchanged"] else 1
    finally:
        comm.barrier()
        if comm.rank == 0 and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

def _print_table(res: dict[str, Any], gb: float) -> None:
    f = lambda v: f"{v:6.2f}" if isinstance(v, float) else "   n/a"  # noqa: E731
    print(f"{res['members']} files x {res['state_bytes_per_file'] / 1e6:.0f} MB state ({gb:.2f} GB), {res['format']}, "
          f"P={res['ranks']} N_io={res['io_tasks']} threads={res['threads']}")
    print("warm cache, GB/s:")
    print(f"  enkflow read        {f(res['read_gbps'])}   pread reference   {f(res['pread_gbps'])}   "
          f"pread, {res['threads']} thread(s)  {f(res['pread_threads_gbps'])}")
    print(f"  netCDF4 loop read   {f(res['netcdf4_read_gbps'])}   xarray loop read  {f(res['xarray_read_gbps'])}")
    print(f"  enkflow update      {f(res['update_gbps'])}   pwrite reference  {f(res['pwrite_gbps'])}   "
          f"pwrite, {res['threads']} thread(s) {f(res['pwrite_threads_gbps'])}")
    what = "shadows" if res["safe_update_method"] == UpdateMethod.SHADOW.value else "log"
    print(f"  safe update         {f(res['safe_update_gbps'])}   ({res['safe_update_method']}: {what}+commit "
          f"{res['safe_update_log_s']:.2f} s; {'spares' if what == 'shadows' else 'log space'} made beforehand in "
          f"{res['wal_prepare_s']:.2f} s; first update without them {f(res['safe_update_first_gbps'])})")
    if "cold" in res:
        c = res["cold"]
        print(f"cold cache ({res['cold_method']}), GB/s: " + ", ".join(f"{k[:-5]} {v:.2f}" for k, v in c.items()))
    ra = res["ratios"]
    print("ratios: " + ", ".join(f"{k} {v:.2f}" for k, v in ra.items() if v is not None))
    print(f"peak RSS {res['peak_rss_mb']:.0f} MB = {res['peak_rss_over_x']:.2f} x X ({res['x_mb']:.0f} MB) for read and update"
          f", {res['peak_rss_safe_update_mb']:.0f} MB with the safe update (a log on tmpfs is mapped: it counts)"
          f"; X equals netCDF4's values: {res['verified_against_netcdf4']}; files unchanged: {res['files_unchanged']}")
