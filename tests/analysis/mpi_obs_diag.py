"""Run under mpiexec (or alone, as one rank) by test_obs_diagnostics.py: every rank makes the same
cycle's observations and H(x), owns a random share of them, and writes obs_diag.nc with
``write_distributed`` (to argv[1]/dist); rank 0 writes the same with ``write`` from all of them
(argv[1]/serial) and checks that every variable and attribute is equal (history aside). Also checks
``RootOrder.rms`` against the replicated RMS, bit for bit, and that a missing owner is an error
on every rank. Rank 0 writes "ok <size>" to argv[1]/ok.txt."""

import sys
from pathlib import Path

import netCDF4
import numpy as np

from enkflow.analysis.obsset import ObsSet
from enkflow.config import Metric
from enkflow.obs import ensemble_scores
from enkflow.obs.diagnostics import ObsDiagnosticsWriter
from enkflow.obs.gathered import RootOrder, rms
from enkflow.parallel import get_comm

out = Path(sys.argv[1])
comm = get_comm()
P, r = comm.size, comm.rank
ensemble_scores.DRAW_ROWS = 16  # several blocks of the rank histogram's stream per rank

rng = np.random.default_rng(23)
n, N, cycle = 101, 7, 4
y = ObsSet(300.0 + rng.standard_normal(n), rng.uniform(0.1, 2.0, n),
           np.column_stack((rng.uniform(0, 360, n), rng.uniform(-90, 90, n))), rng.choice([2, 5, 9], n))
HX, HXa = 300.0 + rng.standard_normal((n, N)), 300.0 + 0.5 * rng.standard_normal((n, N))
flags = rng.choice([0, 0, 0, 1, 2], n).astype(np.int8)
owner = rng.integers(0, P, n)
owner[:3] = 0  # rank 0 owns some
if P > 2:  # and the last rank owns none
    owner[owner == P - 1] = 0
ids = np.flatnonzero(owner == r)
# A rank without observations may make them with one coordinate column (ObsSet's shape for no coords).
mine = ObsSet(y.values[ids], y.error_var[ids], y.coords[ids] if ids.size else np.zeros((0, 1)), y.kinds[ids])
names = {2: "sst", 5: "t2m", 9: "sea ice"}

writer = ObsDiagnosticsWriter(lambda k: out / "dist" / f"c{k}", r, Metric.SPHERE)
writer.write_distributed(cycle, RootOrder.of(comm, ids, n), mine, HX[ids], HXa[ids], flags[ids], names)


def content(path):
    """Every global attribute but history, and every variable: name, dtype, dimensions, attributes, bytes."""
    with netCDF4.Dataset(path) as ds:
        ds.set_auto_maskandscale(False)
        g = [(k, repr(ds.getncattr(k))) for k in ds.ncattrs() if k != "history"]
        v = [(name, str(var.dtype), var.dimensions, [(a, repr(var.getncattr(a))) for a in var.ncattrs()],
              np.asarray(var[:]).tobytes()) for name, var in ds.variables.items()]
        return g, v, {k: len(d) for k, d in ds.dimensions.items()}


d = y.values[ids] - HX[ids].mean(axis=1)
want = rms(y.values - HX.mean(axis=1))
got = RootOrder.of(comm, ids, n).rms(d)
assert got == want, (got, want)
full = RootOrder.of(comm, ids, n).gather(HX[ids])
assert (full is None) == (r != 0) and (full is None or full.tobytes() == HX.tobytes())
try:  # observation 0 is owned by nobody: every rank raises
    RootOrder.of(comm, ids[ids != 0], n).rms(d[ids != 0])
    raise AssertionError("a missing owner passed")
except ValueError as e:
    assert "observation 0 of the cycle's 101 is owned by no rank" in str(e), e
# Only rank 0 from here on: a failed check ends it with no other rank left waiting in a collective.
if r == 0:
    ObsDiagnosticsWriter(lambda k: out / "serial" / f"c{k}", 0, Metric.SPHERE).write(cycle, y, HX, HXa, flags, names)
    a, b = content(writer.path(cycle)), content(out / "serial" / f"c{cycle}" / "obs_diag.nc")
    assert a[0] == b[0] and a[2] == b[2] and len(a[1]) == len(b[1]) == 16, (a[0], b[0], a[2], len(a[1]))
    for va, vb in zip(a[1], b[1]):
        assert va == vb, (va[:4], vb[:4])
    (out / "ok.txt").write_text(f"ok {P}")
