"""The measurements of ``enkflow bench io`` (:mod:`enkflow.bench.io`) on every rank: enkflow's read,
update and safe update through :class:`~enkflow.io.ensemble.EnsembleFiles`' public API, and the
references of :mod:`enkflow.bench.io_refs` (rank 0, serial), warm and cold cache."""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from enkflow.bench.io_refs import (digest, drop_caches, peak_rss_mb, references, reset_peak_rss, unchanged,
                                   verify)
from enkflow.io.config import IOConfig, SafeUpdateConfig, UpdateMethod
from enkflow.io.ensemble import EnsembleFiles
from enkflow.io.generate import make_ensemble
from enkflow.parallel import Comm, get_comm
from enkflow.state import StateLayout

# The read references, in the order of each round: netCDF4 last, so that the shared array
# holds the files' values (not pread's raw NetCDF-3 bytes) when the write references run.
READ_REFS = ("pread", "pread_threads", "xarray", "netcdf4")


class IOBench:
    """The ensemble of ``args`` generated in ``workdir`` (rank 0) and opened on every rank of ``comm``."""

    def __init__(self, args: argparse.Namespace, comm: Comm, workdir: str) -> None:
        self.args, self.comm, self.rank = args, comm, comm.rank
        paths: list[str] | None = None
        scfg = None
        if self.rank == 0:
            t0 = time.perf_counter()
            paths, scfg = make_ensemble(workdir, args.members, args.mb_per_file, fmt=args.format)
            print(f"generated {args.members} {args.format} files of {args.mb_per_file:g} MB state in "
                  f"{time.perf_counter() - t0:.1f} s under {workdir}", flush=True)
        self.paths, scfg = comm.bcast((paths, scfg), root=0)
        self.layout = StateLayout.from_config(self.paths[0], scfg)
        self.cfg = IOConfig(io_tasks=args.io_tasks, threads=args.threads,
                            safe_update=SafeUpdateConfig(log_dir=args.log_dir, method=UpdateMethod(args.safe_method)))
        self.ef = EnsembleFiles(self.paths, self.layout, mode="r+", comm=comm, config=self.cfg)
        self.gb = self.ef.state_bytes * self.ef.n_members / 1e9
        self.X = np.empty((self.ef.n_local_rows, self.ef.n_members), order="F")
        self.serial = get_comm(force_serial=True)
        self.refs = references(self.paths, self.layout, self.ef.structures, threads=self.ef.threads,
                               chunk_bytes=self.cfg.chunk_kb * 1024)
        self.A: np.ndarray | None = None  # the references' array (rank 0)
        self.have_xarray = True

    def timed(self, fn: Callable[[], object], before: Callable[[], object] | None = None,
              on: Comm | None = None) -> float:
        """Seconds of ``fn`` between two barriers of ``on`` (default: every rank); ``before`` runs first
        on rank 0."""
        on = self.comm if on is None else on
        if before is not None and self.rank == 0:
            before()
        on.barrier()
        t0 = time.perf_counter()
        fn()
        on.barrier()
        return time.perf_counter() - t0

    def measure(self) -> dict[str, Any]:
        """The bench's JSON object (every rank holds it)."""
        ef, args = self.ef, self.args
        res: dict[str, Any] = {
            "members": args.members, "mb_per_file": args.mb_per_file, "format": args.format, "ranks": self.comm.size,
            "io_tasks": ef.n_io, "threads": ef.threads, "state_bytes_per_file": ef.state_bytes,
            "x_mb": self.X.nbytes / 1e6,
        }
        if self.rank == 0:
            os.sync()
        reset_peak_rss()
        warm = self._warm_up()
        t, logs = self._rounds()
        first = self._first_safe_update()
        g = lambda s: (self.gb / s) if s else None  # noqa: E731
        for k in ("read", "update", "safe_update", "pread", "pwrite", "pread_threads", "pwrite_threads"):
            res[f"{k}_gbps"] = g(t.get(k))
        res["netcdf4_read_gbps"] = g(t.get("netcdf4"))
        res["xarray_read_gbps"] = g(t.get("xarray"))
        res.update(safe_update_method=self.ef.update_method.value, safe_update_log_s=statistics.median(logs), safe_update_s=t["safe_update"], update_s=t["update"],
                   wal_prepare_s=max(warm["prep"]), safe_update_first_gbps=first.gbps,
                   safe_update_first_s=first.seconds)
        if not args.no_cold:
            res["cold"], res["cold_method"] = self._cold()
        self._closing_figures(res, warm, t)
        return res

    def _warm_up(self) -> dict[str, Any]:
        """enkflow's warm-up, with nothing but X allocated: its peak RSS is enkflow's; the check of its
        values against netCDF4's (one file's values in memory at a time); the references' warm-up."""
        ef, comm, X = self.ef, self.comm, self.X
        ef.read(X)
        ef.update(X, safe=False)
        rss = comm.allgather_obj(peak_rss_mb())
        prep = comm.allgather_obj(ef.prepare_update())
        ef.update(X, safe=True)
        rss_safe = comm.allgather_obj(peak_rss_mb())
        verified = all(comm.allgather_obj(verify(self.paths, self.layout, X, ef.row_start, ef.row_stop)))
        before = digest(X)  # the files' values, to check at the end that nothing changed them
        # Rank 0, serial; serial runs reuse X as their array. A must hold the files' values whenever
        # a write reference runs (it writes them back): netCDF4's loop runs last of the reads (pread
        # leaves NetCDF-3 bytes unswapped).
        if self.rank == 0:
            self.A = X if comm.size == 1 else np.empty((self.layout.n_rows, ef.n_members), order="F")
            for name in READ_REFS:
                try:
                    self.refs[name](self.A)
                except ImportError:
                    self.have_xarray = False
        return {"rss": rss, "prep": prep, "rss_safe": rss_safe, "verified": verified, "digest": before}

    def _ref(self, name: str) -> Callable[[], None]:
        A = self.A
        assert A is not None
        return lambda: self.refs[name](A)

    def _rounds(self) -> tuple[dict[str, float | None], list[float]]:
        """Every method once per round, so that load from elsewhere hits all alike; the medians (rank
        0's) and the safe updates' log seconds."""
        ef, comm, X, sync = self.ef, self.comm, self.X, os.sync
        runs: dict[str, list[float]] = {}
        logs: list[float] = []

        def safe() -> None:
            logs.append(ef.update(X, safe=True).log_seconds)

        for _ in range(self.args.repeat):
            for name in READ_REFS:
                if name == "xarray" and not self.have_xarray:
                    continue
                if self.rank == 0:
                    runs.setdefault(name, []).append(self.timed(self._ref(name), on=self.serial))
                comm.barrier()
            runs.setdefault("read", []).append(self.timed(lambda: ef.read(X)))
            if self.rank == 0:  # the write references write back exactly what is there
                for name in ("pwrite", "pwrite_threads"):
                    runs.setdefault(name, []).append(self.timed(self._ref(name), before=sync, on=self.serial))
            comm.barrier()
            runs.setdefault("update", []).append(self.timed(lambda: ef.update(X, safe=False), before=sync))
            runs.setdefault("safe_update", []).append(self.timed(safe, before=sync))
        t: dict[str, float | None] = {k: statistics.median(v) for k, v in runs.items()}
        return comm.bcast(t, root=0), logs

    def _first_safe_update(self) -> Any:
        """A safe update of a fresh object, which pays for its log space inside the update; its figures."""
        self.ef.close()
        ef2 = EnsembleFiles(self.paths, self.layout, mode="r+", comm=self.comm, config=self.cfg)
        if self.rank == 0:
            os.sync()
        self.comm.barrier()
        first = ef2.update(self.X, safe=True)
        ef2.close()
        return first

    def _cold(self) -> tuple[dict[str, float], str | None]:
        """GB/s of each reader after the page cache was emptied, and how it was emptied."""
        comm = self.comm
        cold: dict[str, float] = {}
        Xc = np.empty_like(self.X)
        ef3 = EnsembleFiles(self.paths, self.layout, mode="r", comm=comm, config=self.cfg)
        method = None
        for name in ("pread", "pread_threads", "read", "netcdf4", "xarray"):
            if self.rank == 0:
                method = drop_caches(self.paths)
            comm.barrier()
            t0 = time.perf_counter()
            if name == "read":
                ef3.read(Xc)
            elif self.rank == 0:
                try:
                    self._ref(name)()
                except ImportError:
                    continue
            comm.barrier()
            cold[f"{name}_gbps" if name != "read" else "read_gbps"] = self.gb / (time.perf_counter() - t0)
        ef3.close()
        return cold, comm.bcast(method, root=0)

    def _closing_figures(self, res: dict[str, Any], warm: dict[str, Any], t: dict[str, float | None]) -> None:
        """Peak memory, the checks of the values, and the ratios to the references."""
        rss = warm["rss"]
        res["peak_rss_mb"] = max(rss)
        res["peak_rss_over_x"] = max(rss) / max(self.X.nbytes / 2**20, 1e-9)
        res["peak_rss_safe_update_mb"] = max(warm["rss_safe"])  # + the mapped log (as large as X)
        res["verified_against_netcdf4"] = warm["verified"]
        res["files_unchanged"] = unchanged(self.paths, self.layout, self.comm, self.cfg, self.X, warm["digest"])
        res["ratios"] = {
            "read_over_pread": _ratio(res["read_gbps"], res["pread_gbps"]),
            "read_over_pread_threads": _ratio(res["read_gbps"], res["pread_threads_gbps"]),
            "read_over_netcdf4": _ratio(res["read_gbps"], res["netcdf4_read_gbps"]),
            "update_over_pwrite": _ratio(res["update_gbps"], res["pwrite_gbps"]),
            "update_over_pwrite_threads": _ratio(res["update_gbps"], res["pwrite_threads_gbps"]),
            "safe_time_over_unsafe": _safe_over_unsafe(t),
        }


def _ratio(a: float | None, b: float | None) -> float | None:
    return (a / b) if isinstance(a, float) and isinstance(b, float) and b else None


def _safe_over_unsafe(t: dict[str, float | None]) -> float:
    safe, unsafe = t["safe_update"], t["update"]
    assert safe is not None and unsafe is not None  # every round times both
    return safe / unsafe
