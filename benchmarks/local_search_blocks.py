"""The blocked local search against the plain SciPy search it replaced, on chunks of the land problem.

    python benchmarks/local_search_blocks.py --dir DIR [--starts 0,200000,1000000] [--chunk 8192] [--cutoff-km 150]

``DIR`` holds a synthesized problem (``enkflow synth --size medium --members 40 --out DIR``). For
each chunk of ``--chunk`` consecutive state points starting at each of ``--starts`` (the first
rows of the medium problem are the south-polar ones), it times in one run:

* **SciPy** (the former search): a KD-tree of the chunk's points against the observations' tree,
  ``cKDTree.sparse_distance_matrix`` on 3-D unit vectors, a sort of the pairs into CSR by
  (point, observation), the chord turned into km, then the Gaspari-Cohn weights;
* **blocked** (enkflow's): ``Geometry.search`` in parts of 2 M pairs, as the analysis runs it,
  then the same weights (``Localization.weights``);

checks that both give the same observations and weights bit for bit, and prints the ratio. The
last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import netCDF4
import numpy as np
from scipy.spatial import cKDTree

from enkflow.analysis.geometry import Geometry, Neighbours, lonlat_to_xyz
from enkflow.analysis.localization import Localization
from enkflow.config import Metric, RadiusConvention


def scipy_search(g: Geometry, obs_xyz: np.ndarray, dom: np.ndarray, radius: float) -> Neighbours:
    """The dual-tree search with a sort, as enkflow ran it before the blocked search."""
    n_dom, n_obs = dom.shape[0], obs_xyz.shape[0]
    pairs = cKDTree(lonlat_to_xyz(dom), balanced_tree=False).sparse_distance_matrix(
        cKDTree(obs_xyz, balanced_tree=False), g._search_radius(radius), output_type="ndarray")
    order = np.argsort(pairs["i"].astype(np.int64) * n_obs + pairs["j"])
    dom_of, idx = pairs["i"][order].astype(np.int64), pairs["j"][order].astype(np.int64)
    dist = g.chord_to_distance(pairs["v"][order])
    keep = dist < radius
    offsets = np.zeros(n_dom + 1, np.int64)
    np.cumsum(np.bincount(dom_of[keep], minlength=n_dom), out=offsets[1:])
    return Neighbours(offsets, idx[keep], dist[keep])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--starts", default="0,200000,1000000")
    ap.add_argument("--chunk", type=int, default=8192)
    ap.add_argument("--cutoff-km", type=float, default=150.0)
    a = ap.parse_args()
    with netCDF4.Dataset(a.dir / "obs.nc") as ds:
        obs = np.column_stack([ds["lon"][:], ds["lat"][:]]).astype(np.float64)
    with netCDF4.Dataset(a.dir / "member_0001.nc") as ds:
        pts = np.column_stack([ds["land_lon"][:], ds["land_lat"][:]]).astype(np.float64)
    loc = Localization.from_radius(a.cutoff_km, RadiusConvention.CUTOFF, metric=Metric.SPHERE)
    g = Geometry(Metric.SPHERE, obs)
    obs_xyz = lonlat_to_xyz(obs)
    rows = []
    for start in (int(s) for s in a.starts.split(",")):
        dom = pts[start:start + a.chunk]
        t0 = time.perf_counter()
        ref = loc.weights(scipy_search(g, obs_xyz, dom, loc.support))
        t1 = time.perf_counter()
        search = g.search(dom, loc.support)
        parts = [loc.weights(search.neighbours(lo, hi)) for lo, hi in search.parts(2_000_000)]
        t2 = time.perf_counter()
        idx = np.concatenate([p[1] for p in parts])
        wt = np.concatenate([p[2] for p in parts])
        same = bool(np.array_equal(idx, ref[1]) and np.array_equal(wt, ref[2]))
        rows.append({"start": start, "lat": float(dom[0, 1]), "pairs": int(idx.size),
                     "obs_per_point": idx.size / dom.shape[0], "scipy_s": t1 - t0, "blocked_s": t2 - t1,
                     "speedup": (t1 - t0) / max(t2 - t1, 1e-12), "bitwise": same})
        r = rows[-1]
        print(f"points {start}..{start + dom.shape[0]} (lat {r['lat']:.2f}): {r['obs_per_point']:.0f} obs per point, "
              f"SciPy {r['scipy_s']:.3f} s, blocked {r['blocked_s']:.3f} s -> {r['speedup']:.1f}x; "
              f"same pairs and weights bit for bit: {same}")
    print(json.dumps({"benchmark": "local_search_blocks", "chunks": rows}))
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
