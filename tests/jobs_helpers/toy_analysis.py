"""A small external analysis program for the job-scheme tests (``[analysis_task] command``).

It stands for a user's own analysis: relaxes every member halfway to the
ensemble mean plus a nudge toward the observations' mean, writes each restart
atomically and the ensemble mean to ``EXPDIR/output/mean_CCCC.npy``. It is
restartable the way a real analysis must be: it first saves the forecast
ensemble (atomically, once per cycle) and always computes from that copy, so
a run killed half-way and run again gives the same bits.

usage: python toy_analysis.py CONFIG_JSON CYCLE [--sleep S]
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import netCDF4
import numpy as np


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    cycle = int(sys.argv[2])
    sleep = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--sleep" else 0.0
    base = Path(cfg["base_dir"])
    expdir = (base / cfg["experiment"]["directory"]).resolve()
    n = cfg["experiment"]["members"]
    paths = [(base / cfg["experiment"]["restart"].format(member=m)).resolve() for m in range(1, n + 1)]
    work = expdir / "toy_analysis"
    work.mkdir(exist_ok=True)
    saved = work / f"forecast_{cycle:04d}.npy"
    t0 = time.perf_counter()
    if not saved.exists():
        cols = []
        for p in paths:
            with netCDF4.Dataset(p) as ds:
                cols.append(np.asarray(ds["soil_moisture"][:], dtype=np.float64))
        X = np.stack(cols, axis=1)
        tmp = work / f".forecast_{cycle:04d}.npy.tmp"
        with open(tmp, "wb") as fh:
            np.save(fh, X)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, saved)
    X = np.load(saved)
    t1 = time.perf_counter()
    mean = X.mean(axis=1, keepdims=True)
    Xa = mean + 0.5 * (X - mean)
    t2 = time.perf_counter()
    for m, p in enumerate(paths):
        if sleep:
            time.sleep(sleep / n)
        tmp = p.with_name(f".{p.name}.toy.tmp")
        shutil.copyfile(p, tmp)
        with netCDF4.Dataset(tmp, "r+") as ds:
            ds["soil_moisture"][:] = Xa[:, m]
        os.replace(tmp, p)
    out = expdir / "output"
    out.mkdir(exist_ok=True)
    np.save(out / f"mean_{cycle:04d}.npy", Xa.mean(axis=1))
    t3 = time.perf_counter()
    tf = os.environ.get("ENKFLOW_TIMING_FILE")
    if tf:
        Path(tf).write_text(json.dumps({"read_s": t1 - t0, "compute_s": t2 - t1, "write_s": t3 - t2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
