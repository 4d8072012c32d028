"""A small external analysis program for the job-scheme tests (``[analysis_task] command``).

It stands for a user's own analysis and, like one, uses the observation file
of its cycle (``[observations] file`` of the experiment, formatted with the
cycle and resolved against ``base_dir``, both read from CONFIG_JSON; the
layout is ``docs/formats.md``, "Observation file"). It

1. relaxes every member halfway to the ensemble mean: ``x = mean + (x - mean) / 2``;
2. nudges each observed state point toward its observation, one observation
   after the other in file order: ``x[i] += g (y - x[i])`` for every member,
   with ``i = state_index``, ``g = TAU^2 / (TAU^2 + error_std^2)`` and
   TAU = 0.25 (so g = 1/2 for the synthetic observations' error_std 0.25);

then writes each restart atomically and the ensemble mean to
``EXPDIR/output/mean_CCCC.npy``. The result is a deterministic function of
the forecast ensemble and the observation file, and every observation moves
the restarts: a comparison with a fault-free run notices an observation lost,
or one applied twice (nudging twice does not give the same bits).

It is restartable the way a real analysis must be: it first saves the
forecast ensemble (atomically, once per cycle, before any restart is
touched) and always computes from that copy and the (read-only) observation
file, never from the restarts it may already have rewritten; so a run killed
half-way and run again gives the same bits.

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

TAU = 0.25  # nominal background error std of the nudging gain


def read_obs(path: Path, n_state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(state_index, value, error_var)`` of an observation file; fails loudly on a bad one."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_mask(False)
        idx = np.asarray(ds["state_index"][:], dtype=np.int64)
        y = np.asarray(ds["value"][:], dtype=np.float64)
        if "error_std" in ds.variables:
            r = np.asarray(ds["error_std"][:], dtype=np.float64) ** 2
        else:
            r = np.asarray(ds["error_var"][:], dtype=np.float64)
    if not (idx.shape == y.shape == r.shape) or idx.ndim != 1:
        raise SystemExit(f"toy_analysis: {path}: state_index, value and error shapes differ")
    if idx.size and (idx.min() < 0 or idx.max() >= n_state):
        raise SystemExit(f"toy_analysis: {path}: state_index outside [0, {n_state})")
    if not (np.isfinite(y).all() and np.isfinite(r).all() and (r > 0).all()):
        raise SystemExit(f"toy_analysis: {path}: non-finite value or error <= 0")
    return idx, y, r


def analyse(X: np.ndarray, idx: np.ndarray, y: np.ndarray, r: np.ndarray) -> np.ndarray:
    """Relax to the mean, then nudge the observed rows, one observation at a time (a pure function)."""
    mean = X.mean(axis=1, keepdims=True)
    Xa = mean + 0.5 * (X - mean)
    gain = TAU**2 / (TAU**2 + r)
    for i, yj, g in zip(idx.tolist(), y.tolist(), gain.tolist()):
        Xa[i] += g * (yj - Xa[i])
    return Xa


def main() -> int:
    cfg = json.loads(Path(sys.argv[1]).read_text())
    cycle = int(sys.argv[2])
    sleep = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[3] == "--sleep" else 0.0
    base = Path(cfg["base_dir"])
    expdir = (base / cfg["experiment"]["directory"]).resolve()
    n = cfg["experiment"]["members"]
    # The restarts the cycles advance (they differ from the template with experiment.initial = "copy").
    paths = [Path(line) for line in (expdir / "restarts.txt").read_text().splitlines()]
    obs_path = (base / cfg["observations"]["file"].format(cycle=cycle)).resolve()
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
    idx, y, r = read_obs(obs_path, X.shape[0])
    t1 = time.perf_counter()
    Xa = analyse(X, idx, y, r)
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
    tmp = out / f".mean_{cycle:04d}.npy.tmp"
    with open(tmp, "wb") as fh:
        np.save(fh, Xa.mean(axis=1))
    os.replace(tmp, out / f"mean_{cycle:04d}.npy")
    t3 = time.perf_counter()
    tf = os.environ.get("ENKFLOW_TIMING_FILE")
    if tf:
        Path(tf).write_text(json.dumps({"read_s": t1 - t0, "compute_s": t2 - t1, "write_s": t3 - t2}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
